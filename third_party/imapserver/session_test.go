package imapserver

// The test harness of the fork tests (fork_test.go): a server on 127.0.0.1
// with a small in-memory Session (one user, one mailbox INBOX) and a raw
// line-oriented client.

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
)

const (
	testUser     = "alice"
	testPassword = "secret"
	// testTimeout bounds every wait of a test for the server.
	testTimeout = 5 * time.Second
)

// errTestUnavailable is what the session's failures to reach another node
// wrap; the tests' Options.ErrorCode maps it to UNAVAILABLE.
var errTestUnavailable = errors.New("node unavailable")

type testMsg struct {
	uid    imap.UID
	flags  []imap.Flag
	modSeq uint64
	body   []byte
}

// testBackend is the state the sessions of one test server share.
type testBackend struct {
	mu      sync.Mutex
	uidNext imap.UID
	highest uint64
	msgs    []*testMsg

	// recorded for the tests
	clientIDs  [][]string
	selectOpts []imap.SelectOptions
	// onCall, if set, is called with the command context (Conn.Context) at
	// the start of every session method.
	onCall func(method string, ctx context.Context)
	// slowStarted gets a value when STATUS Slow starts waiting for its
	// context; slowResult gets what it saw.
	slowStarted chan struct{}
	slowResult  chan error
}

// newTestBackend returns INBOX with three messages:
//
//	seq 1: UID 10, \Seen,    MODSEQ 3
//	seq 2: UID 11, no flags, MODSEQ 5
//	seq 3: UID 12, \Flagged, MODSEQ 7
func newTestBackend() *testBackend {
	return &testBackend{
		uidNext: 13,
		highest: 7,
		msgs: []*testMsg{
			{uid: 10, flags: []imap.Flag{imap.FlagSeen}, modSeq: 3, body: []byte("Subject: one\r\n\r\n1\r\n")},
			{uid: 11, flags: nil, modSeq: 5, body: []byte("Subject: two\r\n\r\n2\r\n")},
			{uid: 12, flags: []imap.Flag{imap.FlagFlagged}, modSeq: 7, body: []byte("Subject: three\r\n\r\n3\r\n")},
		},
		slowStarted: make(chan struct{}, 1),
		slowResult:  make(chan error, 1),
	}
}

var mailboxFlags = []imap.Flag{imap.FlagAnswered, imap.FlagFlagged, imap.FlagDeleted, imap.FlagSeen, imap.FlagDraft}

// testSession is the in-memory Session. Methods the tests do not use answer
// NO.
type testSession struct {
	b        *testBackend
	conn     *Conn
	selected bool
	readOnly bool
	known    int // messages the client knows of (EXISTS)
}

var (
	_ Session   = (*testSession)(nil)
	_ SessionID = (*testSession)(nil)
)

func errNotSupported(what string) error {
	return &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeCannot, Text: what + " is not supported by the test session"}
}

func (s *testSession) called(method string) {
	s.b.mu.Lock()
	f := s.b.onCall
	s.b.mu.Unlock()
	if f != nil {
		f(method, s.conn.Context())
	}
}

func (s *testSession) Close() error { return nil }

func (s *testSession) ClientID(fields []string) {
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.b.clientIDs = append(s.b.clientIDs, slices.Clone(fields))
}

func (s *testSession) Login(username, password string) error {
	s.called("Login")
	if username != testUser || password != testPassword {
		return ErrAuthFailed
	}
	return nil
}

// mailboxError is the answer for a mailbox other than INBOX: "Unreachable"
// fails as a remote node would, "Broken" with a plain error, any other name
// does not exist.
func mailboxError(mailbox string) error {
	switch mailbox {
	case "INBOX":
		return nil
	case "Unreachable":
		return fmt.Errorf("fetching from node n2: %w", errTestUnavailable)
	case "Broken":
		return errors.New("disk on fire")
	default:
		return &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeNonExistent, Text: "No such mailbox"}
	}
}

func (s *testSession) Select(mailbox string, options *imap.SelectOptions) (*imap.SelectData, error) {
	s.called("Select")
	if err := mailboxError(mailbox); err != nil {
		return nil, err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.b.selectOpts = append(s.b.selectOpts, *options)
	s.selected = true
	s.readOnly = options.ReadOnly
	s.known = len(s.b.msgs)
	var firstUnseen uint32
	for i, m := range s.b.msgs {
		if !slices.Contains(m.flags, imap.FlagSeen) {
			firstUnseen = uint32(i + 1)
			break
		}
	}
	return &imap.SelectData{
		Flags:             mailboxFlags,
		PermanentFlags:    append(slices.Clone(mailboxFlags), imap.FlagWildcard),
		NumMessages:       uint32(len(s.b.msgs)),
		FirstUnseenSeqNum: firstUnseen,
		UIDNext:           s.b.uidNext,
		UIDValidity:       1,
		HighestModSeq:     s.b.highest,
	}, nil
}

func (s *testSession) Create(string, *imap.CreateOptions) error { return errNotSupported("CREATE") }
func (s *testSession) Delete(string) error                      { return errNotSupported("DELETE") }
func (s *testSession) Rename(string, string, *imap.RenameOptions) error {
	return errNotSupported("RENAME")
}
func (s *testSession) Subscribe(string) error   { return errNotSupported("SUBSCRIBE") }
func (s *testSession) Unsubscribe(string) error { return errNotSupported("UNSUBSCRIBE") }
func (s *testSession) List(*ListWriter, string, []string, *imap.ListOptions) error {
	return errNotSupported("LIST")
}
func (s *testSession) Copy(imap.NumSet, string) (*imap.CopyData, error) {
	return nil, errNotSupported("COPY")
}

func (s *testSession) Status(mailbox string, options *imap.StatusOptions) (*imap.StatusData, error) {
	s.called("Status")
	if mailbox == "Slow" {
		// Slow waits for its command context to end, as a command whose
		// work is on another node would.
		ctx := s.conn.Context()
		s.b.slowStarted <- struct{}{}
		var err error
		select {
		case <-ctx.Done():
			err = ctx.Err()
		case <-time.After(testTimeout):
			err = errors.New("slow STATUS was not cancelled")
		}
		s.b.slowResult <- err
		return nil, err
	}
	if err := mailboxError(mailbox); err != nil {
		return nil, err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	data := &imap.StatusData{Mailbox: mailbox}
	if options.NumMessages {
		n := uint32(len(s.b.msgs))
		data.NumMessages = &n
	}
	if options.UIDNext {
		data.UIDNext = s.b.uidNext
	}
	if options.UIDValidity {
		data.UIDValidity = 1
	}
	if options.HighestModSeq {
		data.HighestModSeq = s.b.highest
	}
	return data, nil
}

func (s *testSession) Append(mailbox string, r imap.LiteralReader, options *imap.AppendOptions) (*imap.AppendData, error) {
	s.called("Append")
	body, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	if int64(len(body)) != r.Size() {
		return nil, fmt.Errorf("short literal: %d of %d bytes", len(body), r.Size())
	}
	if err := mailboxError(mailbox); err != nil {
		return nil, err
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	s.b.highest++
	m := &testMsg{uid: s.b.uidNext, flags: slices.Clone(options.Flags), modSeq: s.b.highest, body: body}
	s.b.uidNext++
	s.b.msgs = append(s.b.msgs, m)
	return &imap.AppendData{UID: m.uid, UIDValidity: 1}, nil
}

// Poll reports messages added by other connections (EXISTS).
func (s *testSession) Poll(w *UpdateWriter, allowExpunge bool) error {
	s.called("Poll")
	if !s.selected {
		return nil
	}
	s.b.mu.Lock()
	n := len(s.b.msgs)
	s.b.mu.Unlock()
	if n > s.known {
		s.known = n
		return w.WriteNumMessages(uint32(n))
	}
	return nil
}

func (s *testSession) Idle(w *UpdateWriter, stop <-chan struct{}) error {
	s.called("Idle")
	<-stop
	return nil
}

func (s *testSession) Unselect() error {
	s.called("Unselect")
	s.selected = false
	s.readOnly = false
	return nil
}

// Expunge removes the \Deleted messages. A read-only mailbox refuses
// EXPUNGE, while its CLOSE (a silent writer) expunges nothing (RFC 9051
// §6.4.1, §6.3.3). The EXPUNGE responses are always written: the server
// must drop them for CLOSE.
func (s *testSession) Expunge(w *ExpungeWriter, uids *imap.UIDSet) error {
	s.called("Expunge")
	if s.readOnly {
		if w.Silent() {
			return nil
		}
		return &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCode("READ-ONLY"), Text: "Mailbox is read-only"}
	}
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	var (
		kept    []*testMsg
		removed int
	)
	for i, m := range s.b.msgs {
		if slices.Contains(m.flags, imap.FlagDeleted) && (uids == nil || uids.Contains(m.uid)) {
			if err := w.WriteExpunge(uint32(i + 1 - removed)); err != nil {
				return err
			}
			removed++
			continue
		}
		kept = append(kept, m)
	}
	s.b.msgs = kept
	s.known -= removed
	return nil
}

// inRanges reports whether n is in the ranges, "*" (0) standing for max.
func inRanges(n, max uint32, ranges [][2]uint32) bool {
	for _, r := range ranges {
		start, stop := r[0], r[1]
		if start == 0 {
			start = max
		}
		if stop == 0 {
			stop = max
		}
		if start > stop {
			start, stop = stop, start
		}
		if n >= start && n <= stop {
			return true
		}
	}
	return false
}

// matching returns the sequence numbers (1-based) of the messages in
// numSet. The caller holds s.b.mu.
func (s *testSession) matching(numSet imap.NumSet) []uint32 {
	var (
		seqs   []uint32
		ranges [][2]uint32
		byUID  bool
	)
	switch set := numSet.(type) {
	case imap.SeqSet:
		for _, r := range set {
			ranges = append(ranges, [2]uint32{r.Start, r.Stop})
		}
	case imap.UIDSet:
		byUID = true
		for _, r := range set {
			ranges = append(ranges, [2]uint32{uint32(r.Start), uint32(r.Stop)})
		}
	}
	if len(s.b.msgs) == 0 {
		return nil
	}
	for i, m := range s.b.msgs {
		seq := uint32(i + 1)
		if byUID {
			if inRanges(uint32(m.uid), uint32(s.b.msgs[len(s.b.msgs)-1].uid), ranges) {
				seqs = append(seqs, seq)
			}
		} else if inRanges(seq, uint32(len(s.b.msgs)), ranges) {
			seqs = append(seqs, seq)
		}
	}
	return seqs
}

// inAll reports whether message seq is in every one of the sets. The
// caller holds s.b.mu.
func (s *testSession) inAll(seq uint32, sets []imap.NumSet) bool {
	for _, set := range sets {
		if !slices.Contains(s.matching(set), seq) {
			return false
		}
	}
	return true
}

func (s *testSession) Search(kind NumKind, criteria *imap.SearchCriteria, options *imap.SearchOptions) (*imap.SearchData, error) {
	s.called("Search")
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	var (
		seqSet imap.SeqSet
		uidSet imap.UIDSet
		data   imap.SearchData
	)
	var bySeq, byUID []imap.NumSet
	for _, set := range criteria.SeqNum {
		bySeq = append(bySeq, set)
	}
	for _, set := range criteria.UID {
		byUID = append(byUID, set)
	}
	for i, m := range s.b.msgs {
		if criteria.ModSeq != nil && m.modSeq < criteria.ModSeq.ModSeq {
			continue
		}
		if !s.inAll(uint32(i+1), bySeq) || !s.inAll(uint32(i+1), byUID) {
			continue
		}
		if criteria.ModSeq != nil && m.modSeq > data.ModSeq {
			data.ModSeq = m.modSeq
		}
		seqSet.AddNum(uint32(i + 1))
		uidSet.AddNum(m.uid)
		data.Count++
	}
	if kind == NumKindUID {
		data.All = uidSet
	} else {
		data.All = seqSet
	}
	return &data, nil
}

func (s *testSession) Fetch(w *FetchWriter, numSet imap.NumSet, options *imap.FetchOptions) error {
	s.called("Fetch")
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	for _, seq := range s.matching(numSet) {
		m := s.b.msgs[seq-1]
		if options.ChangedSince != 0 && m.modSeq <= options.ChangedSince {
			continue
		}
		rw := w.CreateMessage(seq)
		if options.UID {
			rw.WriteUID(m.uid)
		}
		if options.Flags {
			rw.WriteFlags(m.flags)
		}
		if options.ModSeq {
			rw.WriteModSeq(m.modSeq)
		}
		if err := rw.Close(); err != nil {
			return err
		}
	}
	return nil
}

// Store changes flags; with UNCHANGEDSINCE, messages changed since fail and
// are reported through SetModified. Once CONDSTORE is enabled, the FETCH
// responses carry MODSEQ (RFC 7162 §3.2).
func (s *testSession) Store(w *FetchWriter, numSet imap.NumSet, flags *imap.StoreFlags, options *imap.StoreOptions) error {
	s.called("Store")
	condStore := s.conn.EnabledCaps().Has(imap.CapCondStore)
	_, byUID := numSet.(imap.UIDSet)
	s.b.mu.Lock()
	defer s.b.mu.Unlock()
	var (
		modSeqs imap.SeqSet
		modUIDs imap.UIDSet
	)
	for _, seq := range s.matching(numSet) {
		m := s.b.msgs[seq-1]
		if u := options.UnchangedSince; u != 0 && (u == UnchangedSinceZero || m.modSeq > u) {
			modSeqs.AddNum(seq)
			modUIDs.AddNum(m.uid)
			continue
		}
		switch flags.Op {
		case imap.StoreFlagsSet:
			m.flags = slices.Clone(flags.Flags)
		case imap.StoreFlagsAdd:
			for _, f := range flags.Flags {
				if !slices.Contains(m.flags, f) {
					m.flags = append(m.flags, f)
				}
			}
		case imap.StoreFlagsDel:
			m.flags = slices.DeleteFunc(m.flags, func(f imap.Flag) bool { return slices.Contains(flags.Flags, f) })
		}
		s.b.highest++
		m.modSeq = s.b.highest
		if flags.Silent {
			continue
		}
		rw := w.CreateMessage(seq)
		if byUID {
			rw.WriteUID(m.uid)
		}
		rw.WriteFlags(m.flags)
		if condStore {
			rw.WriteModSeq(m.modSeq)
		}
		if err := rw.Close(); err != nil {
			return err
		}
	}
	if byUID && len(modUIDs) > 0 {
		w.SetModified(modUIDs)
	} else if !byUID && len(modSeqs) > 0 {
		w.SetModified(modSeqs)
	}
	return nil
}

// appendLimitSession is the test session with an APPEND limit.
type appendLimitSession struct {
	*testSession
	limit uint32
}

func (s appendLimitSession) AppendLimit() uint32 { return s.limit }

func newAppendLimitServer(t *testing.T, limit uint32) *testServer {
	return newTestServer(t, func(o *Options) {
		newSession := o.NewSession
		o.NewSession = func(c *Conn) (Session, *GreetingData, error) {
			s, greeting, err := newSession(c)
			if err != nil {
				return nil, nil, err
			}
			return appendLimitSession{s.(*testSession), limit}, greeting, nil
		}
	})
}

func (ts *testServer) numMessages() int {
	ts.backend.mu.Lock()
	defer ts.backend.mu.Unlock()
	return len(ts.backend.msgs)
}

// knownBug skips a test of a defect the copy does not fix yet, unless
// IMAPSERVER_KNOWN_BUGS=1 is set (then the test runs, and fails).
func knownBug(t *testing.T, what string) {
	t.Helper()
	if os.Getenv("IMAPSERVER_KNOWN_BUGS") != "1" {
		t.Skip("known bug: " + what)
	}
}

// syncLogger collects the server's log lines; it stays usable after the
// test ends, when server goroutines may still log.
type syncLogger struct {
	mu    sync.Mutex
	lines []string
}

func (l *syncLogger) Printf(format string, args ...interface{}) {
	l.mu.Lock()
	defer l.mu.Unlock()
	l.lines = append(l.lines, fmt.Sprintf(format, args...))
}

type testServer struct {
	t       *testing.T
	addr    string
	backend *testBackend
	logger  *syncLogger
}

// newTestServer starts a server on 127.0.0.1 (port 0) that advertises
// IMAP4rev1, LITERAL+, ID and CONDSTORE and allows LOGIN without TLS;
// configure changes the options before the server starts.
func newTestServer(t *testing.T, configure func(*Options)) *testServer {
	t.Helper()
	ts := &testServer{t: t, backend: newTestBackend(), logger: &syncLogger{}}
	options := &Options{
		NewSession: func(c *Conn) (Session, *GreetingData, error) {
			return &testSession{b: ts.backend, conn: c}, nil, nil
		},
		Caps: imap.CapSet{
			imap.CapIMAP4rev1:   {},
			imap.CapLiteralPlus: {},
			imap.CapID:          {},
			imap.CapCondStore:   {},
		},
		InsecureAuth: true,
		Logger:       ts.logger,
	}
	if configure != nil {
		configure(options)
	}
	srv := New(options)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	ts.addr = ln.Addr().String()
	go srv.Serve(ln)
	t.Cleanup(func() { srv.Close() })
	return ts
}

// testClient speaks raw IMAP lines to the test server.
type testClient struct {
	t    *testing.T
	conn *net.TCPConn
	br   *bufio.Reader
}

// dial connects and reads the greeting, which it returns.
func (ts *testServer) dial() (*testClient, string) {
	ts.t.Helper()
	conn, err := net.DialTimeout("tcp", ts.addr, testTimeout)
	if err != nil {
		ts.t.Fatal(err)
	}
	ts.t.Cleanup(func() { conn.Close() })
	c := &testClient{t: ts.t, conn: conn.(*net.TCPConn), br: bufio.NewReader(conn)}
	return c, c.readLine()
}

// login dials and logs in as the test user.
func (ts *testServer) login() *testClient {
	ts.t.Helper()
	c, _ := ts.dial()
	lines := c.cmd("L", "LOGIN "+testUser+" "+testPassword)
	if !strings.HasPrefix(lines[len(lines)-1], "L OK ") {
		ts.t.Fatalf("LOGIN: %q", lines)
	}
	return c
}

// selectInbox logs in and selects INBOX.
func (ts *testServer) selectInbox() *testClient {
	ts.t.Helper()
	c := ts.login()
	lines := c.cmd("S", "SELECT INBOX")
	if lines[len(lines)-1] != "S OK [READ-WRITE] SELECT completed" {
		ts.t.Fatalf("SELECT: %q", lines)
	}
	return c
}

// write sends raw bytes.
func (c *testClient) write(s string) {
	c.t.Helper()
	c.conn.SetWriteDeadline(time.Now().Add(testTimeout))
	if _, err := io.WriteString(c.conn, s); err != nil {
		c.t.Fatalf("write: %v", err)
	}
}

// send sends one command line (CRLF added).
func (c *testClient) send(line string) {
	c.t.Helper()
	c.write(line + "\r\n")
}

// readLine reads one response line without its CRLF.
func (c *testClient) readLine() string {
	c.t.Helper()
	line, err := c.tryReadLine()
	if err != nil {
		c.t.Fatalf("read: %v", err)
	}
	return line
}

func (c *testClient) tryReadLine() (string, error) {
	c.conn.SetReadDeadline(time.Now().Add(testTimeout))
	line, err := c.br.ReadString('\n')
	if err != nil {
		return line, err
	}
	if !strings.HasSuffix(line, "\r\n") {
		return line, fmt.Errorf("line %q does not end with CRLF", line)
	}
	// The reference of an error reply is random; tests compare the rest.
	return refPattern.ReplaceAllString(strings.TrimSuffix(line, "\r\n"), "(reference R)"), nil
}

var refPattern = regexp.MustCompile(`\(reference [0-9a-f]{8}\)`)

// logged reports whether a log line contains sub.
func (l *syncLogger) logged(sub string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	for _, line := range l.lines {
		if strings.Contains(line, sub) {
			return true
		}
	}
	return false
}

// expect reads len(want) lines and compares them exactly.
func (c *testClient) expect(want ...string) {
	c.t.Helper()
	for i, w := range want {
		if got := c.readLine(); got != w {
			c.t.Fatalf("response line %d:\n got %q\nwant %q", i+1, got, w)
		}
	}
}

// cmd sends "tag line" and returns the responses up to and including the
// tagged one.
func (c *testClient) cmd(tag, line string) []string {
	c.t.Helper()
	c.send(tag + " " + line)
	return c.readUntilTagged(tag)
}

func (c *testClient) readUntilTagged(tag string) []string {
	c.t.Helper()
	var lines []string
	for {
		l := c.readLine()
		lines = append(lines, l)
		if strings.HasPrefix(l, tag+" ") {
			return lines
		}
	}
}

// expectCmd runs a command and compares all its responses exactly.
func (c *testClient) expectCmd(tag, line string, want ...string) {
	c.t.Helper()
	got := c.cmd(tag, line)
	if !slices.Equal(got, want) {
		c.t.Fatalf("%s %s:\n got %q\nwant %q", tag, line, got, want)
	}
}

// expectClosed checks that the server closed the connection: nothing more
// is read. A reset is accepted too: the server may close with bytes of ours
// still unread.
func (c *testClient) expectClosed() {
	c.t.Helper()
	line, err := c.tryReadLine()
	if err == nil {
		c.t.Fatalf("connection still open, read %q", line)
	}
	if line != "" {
		c.t.Fatalf("partial line %q before close", line)
	}
	var ne net.Error
	if errors.As(err, &ne) && ne.Timeout() {
		c.t.Fatalf("connection not closed: %v", err)
	}
}

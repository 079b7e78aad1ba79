package bench

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-sasl"
	"github.com/emersion/go-smtp"
)

// mailStore is the in-test mail system behind the fake servers. It counts
// what the servers did, to compare with what the bench reports.
type mailStore struct {
	mu        sync.Mutex
	boxes     map[string][][]byte
	locked    map[string]bool
	received  int64 // messages accepted after DATA
	bytesIn   int64
	rejected  int64 // RCPTs answered 451
	retrieved int64 // messages sent in full by RETR
	deleted   int64 // messages removed at QUIT
	popErrs   int64 // POP sessions ended by a -ERR
	inUse     int64 // of which: a second session for a maildrop
	popOK     int64 // POP sessions ended by +OK to QUIT
}

// smtpSession is the go-smtp backend session: it files each message in
// the recipient's box. user00002@bench.example gets a 451.
type smtpSession struct {
	st *mailStore
	to string
}

func (s *smtpSession) Reset()                               {}
func (s *smtpSession) Logout() error                        { return nil }
func (s *smtpSession) Mail(string, *smtp.MailOptions) error { return nil }
func (s *smtpSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	if to == "user00002@bench.example" {
		s.st.mu.Lock()
		s.st.rejected++
		s.st.mu.Unlock()
		return &smtp.SMTPError{Code: 451, EnhancedCode: smtp.EnhancedCode{4, 3, 0}, Message: "try later"}
	}
	s.to = to
	return nil
}

func (s *smtpSession) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	s.st.mu.Lock()
	defer s.st.mu.Unlock()
	s.st.boxes[s.to] = append(s.st.boxes[s.to], b)
	s.st.received++
	s.st.bytesIn += int64(len(b))
	return nil
}

// servePOP is a minimal RFC 1939 server over st: every user's password is
// "pw"; a second session for a locked maildrop gets -ERR.
func servePOP(l net.Listener, st *mailStore) {
	for {
		conn, err := l.Accept()
		if err != nil {
			return
		}
		go popSession(conn, st)
	}
}

func popSession(conn net.Conn, st *mailStore) {
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	r := bufio.NewReader(conn)
	w := bufio.NewWriter(conn)
	reply := func(s string) { w.WriteString(s + "\r\n"); w.Flush() }
	fail := func(s string) {
		st.mu.Lock()
		st.popErrs++
		st.mu.Unlock()
		reply("-ERR " + s)
	}
	var user string
	var msgs [][]byte
	dele := map[int]bool{}
	unlock := func() {}
	defer func() { unlock() }()
	reply("+OK fake POP3")
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		verb, arg, _ := strings.Cut(strings.TrimRight(line, "\r\n"), " ")
		switch verb {
		case "USER":
			user = arg
			reply("+OK")
		case "PASS":
			if arg != "pw" {
				fail("[AUTH] bad password")
				return
			}
			st.mu.Lock()
			if st.locked[user] {
				st.inUse++
				st.mu.Unlock()
				fail("[IN-USE] locked")
				return
			}
			st.locked[user] = true
			msgs = st.boxes[user]
			st.mu.Unlock()
			unlock = func() { st.mu.Lock(); delete(st.locked, user); st.mu.Unlock() }
			reply("+OK")
		case "LIST":
			reply(fmt.Sprintf("+OK %d messages", len(msgs)))
			for i, m := range msgs {
				w.WriteString(fmt.Sprintf("%d %d\r\n", i+1, len(m)))
			}
			reply(".")
		case "RETR":
			n, _ := strconv.Atoi(arg)
			if n < 1 || n > len(msgs) {
				fail("no such message")
				return
			}
			reply("+OK")
			for _, l := range strings.SplitAfter(string(msgs[n-1]), "\r\n") {
				if strings.HasPrefix(l, ".") {
					w.WriteString(".")
				}
				w.WriteString(l)
			}
			reply(".")
			st.mu.Lock()
			st.retrieved++
			st.mu.Unlock()
		case "DELE":
			n, _ := strconv.Atoi(arg)
			dele[n] = true
			reply("+OK")
		case "QUIT":
			st.mu.Lock()
			var keep [][]byte
			for i, m := range st.boxes[user] {
				if !dele[i+1] {
					keep = append(keep, m)
				}
			}
			st.boxes[user] = keep
			st.deleted += int64(len(dele))
			st.popOK++
			delete(st.locked, user) // before the reply, which lets the client go on
			st.mu.Unlock()
			unlock = func() {}
			reply("+OK bye")
			return
		default:
			fail("unknown command")
			return
		}
	}
}

// TestRunAgainstFakeServers runs the whole bench for about two seconds
// against in-test SMTP and POP3 servers and checks that its report agrees
// with what the servers saw.
func TestRunAgainstFakeServers(t *testing.T) {
	st := &mailStore{boxes: map[string][][]byte{}, locked: map[string]bool{}}

	smtpAddr := fakeSMTP(t, func() smtp.Session { return &smtpSession{st: st} })

	pl, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go servePOP(pl, st)
	defer pl.Close()

	users := GenerateUsers(20, "bench.example", "pw")
	users[2].Password = "wrong" // user00003: every POP session fails

	var progress bytes.Buffer
	cfg := Config{
		SMTPAddr:    smtpAddr,
		POP3Addr:    pl.Addr().String(),
		Users:       users,
		Duration:    1500 * time.Millisecond,
		Deadline:    DefaultDeadline,
		Concurrency: 6,
		Mix:         0.7, // more POP than the default, to exercise it
		Seed:        42,
		Progress:    &progress,
	}
	start := time.Now()
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	took := time.Since(start)
	tot := rep.Total

	st.mu.Lock()
	defer st.mu.Unlock()
	t.Logf("report: %d delivered, %d POP ok, %d retrieved, errors %v; server: %d received, %d rejected, %d retrieved, %d deleted, %d POP -ERR",
		tot.Delivered, tot.POPSessions, tot.Retrieved, tot.Errors, st.received, st.rejected, st.retrieved, st.deleted, st.popErrs)

	if took < cfg.Duration || took > cfg.Duration+DrainTimeout {
		t.Errorf("run took %v", took)
	}
	if tot.Delivered < 20 || tot.POPSessions < 5 {
		t.Fatalf("too little done: %+v", tot)
	}
	eq := func(what string, got, want int64) {
		t.Helper()
		if got != want {
			t.Errorf("%s: report %d, servers %d", what, got, want)
		}
	}
	eq("delivered", tot.Delivered, st.received)
	eq("bytes sent", tot.BytesSent, st.bytesIn)
	eq("smtp 4xx", tot.Errors["smtp_4xx"], st.rejected)
	eq("pop -ERR", tot.Errors["pop_err"], st.popErrs)
	eq("pop sessions", tot.POPSessions, st.popOK)
	eq("retrieved", tot.Retrieved, st.retrieved)
	eq("error count", tot.ErrorCount, st.rejected+st.popErrs)
	// Sessions that got +OK to QUIT deleted all they retrieved; failed
	// sessions (which fail at PASS here) retrieved nothing.
	eq("deleted", st.deleted, st.retrieved)
	eq("requests", tot.Requests, tot.Delivered+tot.POPSessions+tot.ErrorCount)
	eq("smtp latencies", int64(tot.SMTPLatency.Count), tot.Delivered)
	eq("pop latencies", int64(tot.POPLatency.Count), tot.POPSessions)
	for _, k := range []string{"connect", "smtp_5xx", "timeout", "other"} {
		eq(k, tot.Errors[k], 0)
	}
	eq("aborted", tot.Aborted, 0)
	if st.inUse != 0 {
		t.Errorf("%d POP sessions overlapped another of the same user", st.inUse)
	}
	var left int64
	for _, b := range st.boxes {
		left += int64(len(b))
	}
	eq("left in mailboxes", left, st.received-st.deleted)
	if !strings.Contains(tot.ErrorSamples["smtp_4xx"], "451") || !strings.Contains(tot.ErrorSamples["pop_err"], "-ERR") {
		t.Errorf("error samples %v", tot.ErrorSamples)
	}
	if st.rejected == 0 || st.popErrs == 0 {
		t.Error("the error paths were not exercised")
	}
	if tot.MeanMessageSize != float64(int64(float64(st.bytesIn)/float64(st.received)+0.5)) {
		t.Errorf("mean size %v, servers %v", tot.MeanMessageSize, float64(st.bytesIn)/float64(st.received))
	}
	if l := tot.SMTPLatency; !(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.Max) {
		t.Errorf("smtp latency %+v", l)
	}
	if rep.MsgsPerSec <= 0 || rep.MsgsPerSec != tot.MsgsPerSec || len(rep.Steps) != 1 {
		t.Errorf("fixed run: rate %v, steps %d", rep.MsgsPerSec, len(rep.Steps))
	}
	if lines := strings.Count(progress.String(), "\n"); lines < 1 || lines > 3 {
		t.Errorf("%d progress lines:\n%s", lines, progress.String())
	}

	var text, js bytes.Buffer
	if err := rep.WriteText(&text); err != nil || !strings.Contains(text.String(), "messages/s delivered") {
		t.Errorf("text report: %v\n%s", err, text.String())
	}
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Total.Delivered != tot.Delivered {
		t.Errorf("JSON report: %v", err)
	}

	// A short probe run over the same servers: steps follow the probe and
	// add up to no more than the run. These users meet no errors, so the
	// probe climbs.
	st.mu.Unlock()
	cfg.Users = GenerateUsers(20, "probe.example", "pw")
	cfg.Probe = NewProbe()
	cfg.Step = 200 * time.Millisecond
	cfg.Duration = 700 * time.Millisecond
	cfg.Progress = nil
	rep, err = Run(context.Background(), cfg)
	st.mu.Lock()
	if err != nil {
		t.Fatal(err)
	}
	if rep.Mode != "probe" || len(rep.Steps) < 3 || rep.Steps[0].Concurrency != DefaultProbeStart {
		t.Fatalf("probe steps %+v", rep.Steps)
	}
	var sum int64
	for _, s := range rep.Steps {
		sum += s.Delivered
	}
	if sum > rep.Total.Delivered || rep.Best < 0 || rep.MsgsPerSec != rep.Steps[rep.Best].MsgsPerSec {
		t.Errorf("probe report: steps deliver %d of %d, best %d", sum, rep.Total.Delivered, rep.Best)
	}
	text.Reset()
	rep.WriteText(&text)
	t.Logf("probe report:\n%s", text.String())
}

// TestRunCutsOffAHungServer checks that a server that never answers cannot
// keep the bench running past its duration plus DrainTimeout.
func TestRunCutsOffAHungServer(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	var conns []net.Conn
	var mu sync.Mutex
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			mu.Lock()
			conns = append(conns, c) // accept, then say nothing
			mu.Unlock()
		}
	}()
	defer func() {
		mu.Lock()
		for _, c := range conns {
			c.Close()
		}
		mu.Unlock()
	}()
	start := time.Now()
	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel() // a cancelled context skips the drain wait
	rep, err := Run(ctx, Config{SMTPAddr: l.Addr().String(), POP3Addr: l.Addr().String(),
		Users: GenerateUsers(3, "b.example", "pw"), Duration: time.Minute, Deadline: time.Second,
		Concurrency: 4, Mix: 0.5})
	if err != nil {
		t.Fatal(err)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("run took %v", took)
	}
	if !rep.Interrupted || rep.Total.Aborted != 4 || rep.Total.Requests != 0 {
		t.Errorf("interrupted %v, aborted %d, requests %d", rep.Interrupted, rep.Total.Aborted, rep.Total.Requests)
	}
}

// subSession is a submission server's session: it records who logged in
// and where each message went.
type subSession struct {
	mu    *sync.Mutex
	user  string
	from  string
	rcpts []string
	got   *[]string // "user from rcpt,rcpt"
}

func (s *subSession) AuthMechanisms() []string { return []string{sasl.Plain} }
func (s *subSession) Auth(string) (sasl.Server, error) {
	return sasl.NewPlainServer(func(_, user, pass string) error {
		if pass != "pw" {
			return errors.New("bad password")
		}
		s.user = user
		return nil
	}), nil
}
func (s *subSession) Reset()        {}
func (s *subSession) Logout() error { return nil }
func (s *subSession) Mail(from string, _ *smtp.MailOptions) error {
	if s.user == "" {
		return &smtp.SMTPError{Code: 530, Message: "authentication required"}
	}
	s.from = from
	return nil
}
func (s *subSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.rcpts = append(s.rcpts, to)
	return nil
}
func (s *subSession) Data(r io.Reader) error {
	io.Copy(io.Discard, r)
	s.mu.Lock()
	*s.got = append(*s.got, s.user+" "+s.from+" "+strings.Join(s.rcpts, ","))
	s.mu.Unlock()
	s.rcpts = nil
	return nil
}

// The submission workload logs in as the user it draws, sends from that
// user's address, and addresses the remote domain.
func TestSubmissionWorkload(t *testing.T) {
	var mu sync.Mutex
	var got []string
	addr := fakeSMTP(t, func() smtp.Session { return &subSession{mu: &mu, got: &got} })
	users := GenerateUsers(5, "bench.example", "pw")
	rep, err := Run(context.Background(), Config{SMTPAddr: addr, Users: users, Duration: 500 * time.Millisecond,
		Deadline: DefaultDeadline, Concurrency: 2, Mix: 1, Seed: 7, Domain: "bench.example",
		Submit: &Submit{RemoteDomain: "far.example", Rcpts: 2}})
	if err != nil {
		t.Fatal(err)
	}
	mu.Lock()
	defer mu.Unlock()
	if rep.Total.Delivered == 0 || int64(len(got)) != rep.Total.Delivered {
		t.Fatalf("report %d submitted, server %d", rep.Total.Delivered, len(got))
	}
	for _, g := range got {
		f := strings.Fields(g)
		if len(f) != 3 || f[0] != f[1] || !strings.HasSuffix(f[0], "@bench.example") ||
			strings.Count(f[2], "@far.example") != 2 {
			t.Fatalf("submission %q: want the logged-in user as sender and two far.example recipients", g)
		}
	}
}

// TestRunPaced checks that --rate caps the starts: six workers against a
// server that answers at once would make hundreds of deliveries a second.
func TestRunPaced(t *testing.T) {
	st := &mailStore{boxes: map[string][][]byte{}, locked: map[string]bool{}}
	const perSec = 40
	cfg := Config{
		SMTPAddr:    fakeSMTP(t, func() smtp.Session { return &smtpSession{st: st} }),
		Users:       GenerateUsers(20, "bench.example", "pw"),
		Duration:    2 * time.Second,
		Deadline:    DefaultDeadline,
		Concurrency: 6,
		Mix:         1,
		Seed:        7,
		Rate:        perSec,
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	// One start at once, then one every 25 ms: about 80 in two seconds.
	want := cfg.Duration.Seconds() * perSec
	if got := float64(rep.Total.Requests); got < want*0.75 || got > want+2 {
		t.Errorf("paced at %d/s for %v: %v requests, want about %v", perSec, cfg.Duration, got, want)
	}
	if rep.RateCap != perSec {
		t.Errorf("report's rate cap %v, want %v", rep.RateCap, perSec)
	}
	var text bytes.Buffer
	if err := rep.WriteText(&text); err != nil {
		t.Fatal(err)
	}
	if !strings.Contains(text.String(), "paced: at most 40.0 requests started per second") {
		t.Errorf("text report does not say it was paced:\n%s", text.String())
	}
}

// fakeSMTP serves SMTP on a free loopback port with a session from
// newSession per connection (plaintext AUTH allowed, 2 MB messages) until
// the test ends, and returns its address.
func fakeSMTP(t *testing.T, newSession func() smtp.Session) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	srv := smtp.NewServer(smtp.BackendFunc(func(*smtp.Conn) (smtp.Session, error) {
		return newSession(), nil
	}))
	srv.Domain = "localhost"
	srv.AllowInsecureAuth = true
	srv.MaxMessageBytes = 2 << 20
	go srv.Serve(l)
	t.Cleanup(func() { srv.Close() })
	return l.Addr().String()
}

// TestRunSizeRange: with Range set every message delivered is within it
// (header included), and the report names the uniform model.
func TestRunSizeRange(t *testing.T) {
	st := &mailStore{boxes: map[string][][]byte{}, locked: map[string]bool{}}
	sr := SizeRange{Min: 3 << 10, Max: 6 << 10}
	rep, err := Run(context.Background(), Config{
		SMTPAddr:    fakeSMTP(t, func() smtp.Session { return &smtpSession{st: st} }),
		Users:       GenerateUsers(5, "bench.example", "pw")[2:], // not user00002, who gets a 451
		Duration:    time.Second,
		Deadline:    DefaultDeadline,
		Concurrency: 4,
		Mix:         1,
		Seed:        3,
		Range:       &sr,
	})
	if err != nil {
		t.Fatal(err)
	}
	st.mu.Lock()
	defer st.mu.Unlock()
	if st.received < 20 {
		t.Fatalf("only %d messages received", st.received)
	}
	for to, box := range st.boxes {
		for _, m := range box {
			if len(m) < sr.Min || len(m) > sr.Max {
				t.Errorf("a message to %s of %d bytes, outside [%d, %d]", to, len(m), sr.Min, sr.Max)
			}
		}
	}
	if m := rep.SizeModel; m.Distribution != "uniform" || m.Min != sr.Min || m.Max != sr.Max || m.Mean != sr.Mean() {
		t.Errorf("size model %+v", m)
	}
	if mean := rep.Total.MeanMessageSize; mean < float64(sr.Min) || mean > float64(sr.Max) {
		t.Errorf("mean size %v", mean)
	}
	if _, err := Run(context.Background(), Config{SMTPAddr: "127.0.0.1:1", Users: GenerateUsers(1, "x", "pw"),
		Duration: time.Second, Deadline: time.Second, Concurrency: 1, Mix: 1, Range: &SizeRange{Min: 10, Max: 5}}); err == nil {
		t.Error("a range whose MAX is below its MIN was accepted")
	}
}

// A comma-separated SMTP address spreads the sessions over the servers
// (each session one at random, as Porcupine's generator picks a node), and
// the report's per-second series adds up to what was delivered in it.
func TestRunSpreadsSessionsAndRecordsSeries(t *testing.T) {
	a := &mailStore{boxes: map[string][][]byte{}, locked: map[string]bool{}}
	b := &mailStore{boxes: map[string][][]byte{}, locked: map[string]bool{}}
	addrA := fakeSMTP(t, func() smtp.Session { return &smtpSession{st: a} })
	addrB := fakeSMTP(t, func() smtp.Session { return &smtpSession{st: b} })
	rep, err := Run(context.Background(), Config{
		SMTPAddr: addrA + ", " + addrB, Users: GenerateUsers(20, "spread.example", "pw"),
		Duration: 2500 * time.Millisecond, Deadline: DefaultDeadline, Concurrency: 4, Mix: 1, Seed: 7,
	})
	if err != nil {
		t.Fatal(err)
	}
	a.mu.Lock()
	b.mu.Lock()
	defer a.mu.Unlock()
	defer b.mu.Unlock()
	if a.received+b.received != rep.Total.Delivered || a.received < rep.Total.Delivered/4 || b.received < rep.Total.Delivered/4 {
		t.Fatalf("servers received %d and %d of %d delivered: want about half each", a.received, b.received, rep.Total.Delivered)
	}
	if len(rep.Series) < 2 {
		t.Fatalf("series of %d seconds in a 2.5 s run", len(rep.Series))
	}
	var sum int64
	for i, s := range rep.Series {
		sum += s.Delivered
		if i > 0 && (s.T <= rep.Series[i-1].T || s.UnixMS <= rep.Series[i-1].UnixMS) {
			t.Fatalf("series out of order: %+v", rep.Series)
		}
	}
	if sum == 0 || sum > rep.Total.Delivered || rep.StartUnixMS <= 0 || rep.Series[0].UnixMS <= rep.StartUnixMS {
		t.Fatalf("series delivers %d of %d, starts %d: %+v", sum, rep.Total.Delivered, rep.StartUnixMS, rep.Series)
	}
}

func TestSplitAndPickAddrs(t *testing.T) {
	addrs := splitAddrs(" a:1,b:2,, c:3 ")
	if strings.Join(addrs, "|") != "a:1|b:2|c:3" {
		t.Fatalf("splitAddrs: %q", addrs)
	}
	if len(splitAddrs(" , ")) != 0 || pickAddr(nil, nil) != "" || pickAddr([]string{"x"}, nil) != "x" {
		t.Fatal("empty or single address lists")
	}
	rng := rand.New(rand.NewPCG(1, 2))
	seen := map[string]int{}
	for range 300 {
		seen[pickAddr(addrs, rng)]++
	}
	for _, a := range addrs {
		if seen[a] < 60 {
			t.Fatalf("picks %v: want each of %v about 100 times", seen, addrs)
		}
	}
}

func TestSecond(t *testing.T) {
	start := time.Unix(1000, 0)
	s := second(start, start.Add(time.Second), start.Add(3*time.Second), counts{10, 1, 0, 2, 0}, counts{50, 4, 0, 3, 7})
	if s.T != 3 || s.UnixMS != 1003000 || s.Delivered != 40 || s.MsgsPerSec != 20 || s.POP != 3 || s.Errors != 1 || s.Refused != 7 {
		t.Fatalf("second: %+v", s)
	}
}

// A node that refuses connections costs a session a retry on another
// address, not the session: nothing fails, the refusals are counted.
func TestRunTriesTheNextAddress(t *testing.T) {
	st := &mailStore{boxes: map[string][][]byte{}, locked: map[string]bool{}}
	live := fakeSMTP(t, func() smtp.Session { return &smtpSession{st: st} })
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead := l.Addr().String()
	l.Close() // nothing listens there now: connections are refused
	rep, err := Run(context.Background(), Config{
		SMTPAddr: dead + "," + live, Users: GenerateUsers(20, "next.example", "pw"),
		Duration: 1500 * time.Millisecond, Deadline: DefaultDeadline, Concurrency: 2, Mix: 1, Seed: 3,
	})
	if err != nil {
		t.Fatal(err)
	}
	tot := rep.Total
	if tot.Delivered < 10 || tot.Errors["connect"] != 0 || tot.Refused < tot.Delivered/4 || tot.Refused > tot.Delivered {
		t.Fatalf("delivered %d, connect errors %d, refused %d: want every session delivered, about half of them after a refusal",
			tot.Delivered, tot.Errors["connect"], tot.Refused)
	}
	// With the one dead address alone, the session is a connect error.
	rep, err = Run(context.Background(), Config{SMTPAddr: dead, Users: GenerateUsers(2, "next.example", "pw"),
		Duration: 300 * time.Millisecond, Deadline: DefaultDeadline, Concurrency: 1, Mix: 1})
	if err != nil {
		t.Fatal(err)
	}
	if rep.Total.Errors["connect"] == 0 || rep.Total.Refused != 0 {
		t.Fatalf("one dead address: %d connect errors, %d refused", rep.Total.Errors["connect"], rep.Total.Refused)
	}
}

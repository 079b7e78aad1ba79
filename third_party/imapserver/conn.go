package imapserver

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime/debug"
	"strings"
	"sync"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
)

const (
	cmdReadTimeout     = 30 * time.Second
	idleReadTimeout    = 35 * time.Minute // section 5.4 says 30min minimum
	literalReadTimeout = 5 * time.Minute

	respWriteTimeout    = 30 * time.Second
	literalWriteTimeout = 5 * time.Minute

	maxCommandSize = 50 * 1024 // RFC 2683 section 3.2.1.5 says 8KiB minimum

	// quill: maxBufferedLiteral bounds a literal that is read into memory as
	// a command argument (LOGIN, SEARCH strings, mailbox names): 64 KiB is
	// far above any real argument. APPEND literals have their own limit.
	maxBufferedLiteral = 64 * 1024
	// quill: maxBadCommands is how many BAD answers a session gets before
	// the server says BYE and closes it.
	maxBadCommands = 50
)

var internalServerErrorResp = &imap.StatusResponse{
	Type: imap.StatusResponseTypeNo,
	Code: imap.ResponseCodeServerBug,
	Text: "Internal server error",
}

// errorResp is the answer to a command whose session method failed with an
// error that is not an IMAP answer (quill): NO with the code ErrorCode gives
// (SERVERBUG by default) and a text naming the command and a reference to
// the log line that holds the cause. The cause itself (addresses of other
// machines, RPC errors) is for the operator, not the client.
func (s *Server) errorResp(cmd string, err error) *imap.StatusResponse {
	code := imap.ResponseCodeServerBug
	if s.options.ErrorCode != nil {
		if c := s.options.ErrorCode(err); c != "" {
			code = c
		}
	}
	ref := fmt.Sprintf("%08x", rand.Uint32())
	s.logger().Printf("%s failed (reference %s): %v", cmd, ref, err)
	text := fmt.Sprintf("%s failed (reference %s)", cmd, ref)
	if code == imap.ResponseCodeUnavailable {
		text = fmt.Sprintf("%s failed; try again later (reference %s)", cmd, ref)
	}
	return &imap.StatusResponse{Type: imap.StatusResponseTypeNo, Code: code, Text: text}
}

// A Conn represents an IMAP connection to the server.
type Conn struct {
	server   *Server
	br       *bufio.Reader
	bw       *bufio.Writer
	encMutex sync.Mutex
	// writeDeadline is the write deadline armed on conn (zero: none);
	// setWriteTimeout. (quill)
	writeDeadline time.Time
	// openFetch is the FETCH response being written, if any: it holds
	// encMutex until its Close (endOpenFetch). (quill)
	openFetch *FetchResponseWriter

	mutex   sync.Mutex
	conn    net.Conn
	enabled imap.CapSet
	// condStoreNew: the command being run enabled CONDSTORE implicitly
	// (quill; store.go enableCondStore).
	condStoreNew bool

	state   imap.ConnState
	session Session

	// ctx ends with the connection; cmdCtx is the running command's
	// (Context). (quill)
	ctx    context.Context
	cancel context.CancelFunc
	cmdCtx context.Context

	badCount int // quill: consecutive BAD answers
	// compressed: COMPRESS DEFLATE is active (quill; compress.go).
	compressed bool
	// searchContexts are the updating searches (RFC 5267 §4.3,
	// context.go). (quill)
	searchContexts []*searchContext
}

func newConn(c net.Conn, server *Server) *Conn {
	rw := server.options.wrapReadWriter(c)
	br := bufio.NewReader(rw)
	bw := bufio.NewWriter(rw)
	return &Conn{
		conn:    c,
		server:  server,
		br:      br,
		bw:      bw,
		enabled: make(imap.CapSet),
	}
}

// NetConn returns the underlying connection that is wrapped by the IMAP
// connection.
//
// Writing to or reading from this connection directly will corrupt the IMAP
// session.
func (c *Conn) NetConn() net.Conn {
	c.mutex.Lock()
	defer c.mutex.Unlock()
	return c.conn
}

// Bye terminates the IMAP connection.
func (c *Conn) Bye(text string) error {
	respErr := c.writeStatusResp("", &imap.StatusResponse{
		Type: imap.StatusResponseTypeBye,
		Text: text,
	})
	closeErr := c.conn.Close()
	if respErr != nil {
		return respErr
	}
	return closeErr
}

func (c *Conn) EnabledCaps() imap.CapSet {
	c.mutex.Lock()
	defer c.mutex.Unlock()

	return c.enabled.Copy()
}

// Context returns the context of the command being run: it ends when the
// connection does, and (with Options.CommandContext) when the client hangs
// up during the command. (quill)
func (c *Conn) Context() context.Context {
	c.mutex.Lock()
	defer c.mutex.Unlock()
	if c.cmdCtx != nil {
		return c.cmdCtx
	}
	return c.ctx
}

func (c *Conn) setCommandContext(ctx context.Context) {
	c.mutex.Lock()
	c.cmdCtx = ctx
	c.mutex.Unlock()
}

func (c *Conn) serve() {
	c.ctx, c.cancel = context.WithCancel(context.Background())
	defer c.cancel()
	defer func() {
		if v := recover(); v != nil {
			c.server.logger().Printf("panic handling command: %v\n%s", v, debug.Stack())
		}

		c.conn.Close()
	}()

	c.server.mutex.Lock()
	c.server.conns[c] = struct{}{}
	c.server.mutex.Unlock()
	defer func() {
		c.server.mutex.Lock()
		delete(c.server.conns, c)
		if c.compressed { // quill: compress.go
			c.server.compressed--
		}
		c.server.mutex.Unlock()
	}()

	var (
		greetingData *GreetingData
		err          error
	)
	c.session, greetingData, err = c.server.options.NewSession(c)
	if err != nil {
		var (
			resp    *imap.StatusResponse
			imapErr *imap.Error
		)
		if errors.As(err, &imapErr) && imapErr.Type == imap.StatusResponseTypeBye {
			resp = (*imap.StatusResponse)(imapErr)
		} else {
			c.server.logger().Printf("failed to create session: %v", err)
			resp = internalServerErrorResp
		}
		if err := c.writeStatusResp("", resp); err != nil {
			c.server.logger().Printf("failed to write greeting: %v", err)
		}
		return
	}

	defer func() {
		if c.session != nil {
			if err := c.session.Close(); err != nil {
				c.server.logger().Printf("failed to close session: %v", err)
			}
		}
	}()

	caps := c.server.options.caps()
	if _, ok := c.session.(SessionIMAP4rev2); !ok && caps.Has(imap.CapIMAP4rev2) {
		panic("imapserver: server advertises IMAP4rev2 but session doesn't support it")
	}
	if _, ok := c.session.(SessionNamespace); !ok && caps.Has(imap.CapNamespace) {
		panic("imapserver: server advertises NAMESPACE but session doesn't support it")
	}
	if _, ok := c.session.(SessionMove); !ok && caps.Has(imap.CapMove) {
		panic("imapserver: server advertises MOVE but session doesn't support it")
	}
	if _, ok := c.session.(SessionUnauthenticate); !ok && caps.Has(imap.CapUnauthenticate) {
		panic("imapserver: server advertises UNAUTHENTICATE but session doesn't support it")
	}

	c.state = imap.ConnStateNotAuthenticated
	statusType := imap.StatusResponseTypeOK
	if greetingData != nil && greetingData.PreAuth {
		c.state = imap.ConnStateAuthenticated
		statusType = imap.StatusResponseTypePreAuth
	}
	if err := c.writeCapabilityStatus("", statusType, "IMAP server ready"); err != nil {
		c.server.logger().Printf("failed to write greeting: %v", err)
		return
	}

	for {
		var readTimeout time.Duration
		switch c.state {
		case imap.ConnStateAuthenticated, imap.ConnStateSelected:
			readTimeout = idleReadTimeout
		default:
			readTimeout = cmdReadTimeout
		}
		c.setReadTimeout(readTimeout)
		// quill: a FETCH response a failed command left open is ended
		// (endOpenFetch), as after every command.
		c.endOpenFetch()

		// quill: with NOTIFY on, updates go out while the client is
		// quiet (notify.go).
		if ns, ok := c.session.(SessionNotify); ok && (c.state == imap.ConnStateAuthenticated || c.state == imap.ConnStateSelected) {
			if ready := ns.NotifyReady(); ready != nil {
				if err := c.notifyWait(ns, ready); err != nil {
					if !errors.Is(err, io.EOF) && !errors.Is(err, net.ErrClosed) {
						c.server.logger().Printf("NOTIFY: %v", err)
					}
					break
				}
			}
		}

		dec := imapwire.NewDecoder(c.br, imapwire.ConnSideServer)
		dec.MaxSize = maxCommandSize
		dec.CheckBufferedLiteralFunc = c.checkBufferedLiteral

		if c.state == imap.ConnStateLogout || dec.EOF() {
			break
		}

		c.setReadTimeout(cmdReadTimeout)
		if err := c.readCommand(dec); err != nil {
			if errors.Is(err, imapwire.ErrMaxSize) {
				c.Bye("Command line too long")
				break
			}
			if !errors.Is(err, net.ErrClosed) {
				c.server.logger().Printf("failed to read command: %v", err)
			}
			break
		}
	}
}

func (c *Conn) readCommand(dec *imapwire.Decoder) error {
	var tag, name string
	if !dec.ExpectAtom(&tag) || !dec.ExpectSP() || !dec.ExpectAtom(&name) {
		// quill: upstream closed the connection without a word on a
		// malformed line (even an empty one); RFC 9051 §7.1.5 answers BAD.
		return c.malformedLine(dec, "", &imap.StatusResponse{
			Type: imap.StatusResponseTypeBad,
			Text: "Missing or malformed command tag or name",
		})
	}
	name = strings.ToUpper(name)

	numKind := NumKindSeq
	if name == "UID" {
		numKind = NumKindUID
		var subName string
		if !dec.ExpectSP() || !dec.ExpectAtom(&subName) {
			// quill: upstream closed the connection without a response;
			// the tag is known, so the answer is a tagged BAD.
			return c.malformedLine(dec, tag, &imap.StatusResponse{
				Type: imap.StatusResponseTypeBad,
				Code: imap.ResponseCodeClientBug,
				Text: "Missing or malformed command name after UID",
			})
		}
		name = "UID " + strings.ToUpper(subName)
	}

	// quill: the command runs under a context of its own; not IDLE, which
	// waits for the client for as long as it likes and ends with the
	// connection (a watcher per idling client would cost a poll each).
	if cc := c.server.options.CommandContext; cc != nil && name != "IDLE" {
		ctx, stop := cc(c.ctx, c.conn)
		c.setCommandContext(ctx)
		defer func() {
			c.setCommandContext(nil)
			stop()
		}()
	}

	// TODO: handle multiple commands concurrently
	sendOK := true
	var err error
	reported := name // quill: the name CommandDone is given
	switch name {
	case "NOOP", "CHECK":
		err = c.handleNoop(dec)
	case "LOGOUT":
		err = c.handleLogout(dec)
	case "CAPABILITY":
		err = c.handleCapability(dec)
	case "STARTTLS":
		err = c.handleStartTLS(tag, dec)
		sendOK = false
	case "AUTHENTICATE":
		err = c.handleAuthenticate(tag, dec)
		sendOK = false
	case "UNAUTHENTICATE":
		err = c.handleUnauthenticate(dec)
	case "LOGIN":
		err = c.handleLogin(tag, dec)
		sendOK = false
	case "ENABLE":
		err = c.handleEnable(dec)
	case "CREATE":
		err = c.handleCreate(tag, dec)
		sendOK = false
	case "DELETE":
		err = c.handleDelete(dec)
	case "RENAME":
		err = c.handleRename(dec)
	case "SUBSCRIBE":
		err = c.handleSubscribe(dec)
	case "UNSUBSCRIBE":
		err = c.handleUnsubscribe(dec)
	case "STATUS":
		err = c.handleStatus(dec)
	case "LIST":
		err = c.handleList(dec)
	case "LSUB":
		err = c.handleLSub(dec)
	case "NAMESPACE":
		err = c.handleNamespace(dec)
	case "IDLE":
		err = c.handleIdle(dec)
	case "SELECT", "EXAMINE":
		err = c.handleSelect(tag, dec, name == "EXAMINE")
		sendOK = false
	case "CLOSE", "UNSELECT":
		err = c.handleUnselect(dec, name == "CLOSE")
	case "APPEND":
		err = c.handleAppend(tag, dec)
		sendOK = false
	case "FETCH", "UID FETCH":
		err = c.handleFetch(dec, numKind)
	case "EXPUNGE":
		err = c.handleExpunge(tag, dec)
		sendOK = false
	case "UID EXPUNGE":
		err = c.handleUIDExpunge(tag, dec)
		sendOK = false
	case "STORE", "UID STORE":
		err = c.handleStore(tag, dec, numKind)
		sendOK = false
	case "COPY", "UID COPY":
		err = c.handleCopy(tag, dec, numKind)
		sendOK = false
	case "MOVE", "UID MOVE":
		err = c.handleMove(dec, numKind)
	case "SEARCH", "UID SEARCH":
		err = c.handleSearch(tag, dec, numKind)
	case "SORT", "UID SORT": // quill: RFC 5256, RFC 5267 (sort.go)
		err = c.handleSort(tag, dec, numKind)
	case "THREAD", "UID THREAD": // quill: RFC 5256 (sort.go)
		err = c.handleThread(dec, numKind)
	case "ID":
		err = c.handleID(dec)
	case "GETQUOTA": // quill: RFC 9208 (quota.go)
		err = c.handleGetQuota(dec)
	case "GETQUOTAROOT":
		err = c.handleGetQuotaRoot(dec)
	case "SETQUOTA":
		err = c.handleSetQuota(dec)
	case "CANCELUPDATE": // quill: RFC 5267 §4.3.5 (context.go)
		err = c.handleCancelUpdate(dec)
	case "NOTIFY": // quill: RFC 5465 (notify.go)
		err = c.handleNotify(dec)
	case "COMPRESS": // quill: RFC 4978 (compress.go)
		err = c.handleCompress(tag, dec)
		sendOK = false
	default:
		if c.state == imap.ConnStateNotAuthenticated {
			// Don't allow a single unknown command before authentication to
			// mitigate cross-protocol attacks:
			// https://www-archive.mozilla.org/projects/netlib/portbanning
			c.state = imap.ConnStateLogout
			defer c.Bye("Unknown command")
		}
		reported = "UNKNOWN"
		err = &imap.Error{
			Type: imap.StatusResponseTypeBad,
			Text: "Unknown command",
		}
	}

	// quill: a command that failed in the middle of a FETCH response (a
	// write to a client that went away) left it open, holding encMutex:
	// the tagged answer below would wait for it for ever.
	c.endOpenFetch()

	dec.DiscardLine()
	if dec.Err() != nil && errors.Is(dec.Err(), imapwire.ErrMaxSize) {
		return dec.Err()
	}

	var (
		resp    *imap.StatusResponse
		imapErr *imap.Error
		decErr  *imapwire.DecoderExpectError
	)
	if errors.As(err, &imapErr) {
		resp = (*imap.StatusResponse)(imapErr)
	} else if errors.As(err, &decErr) {
		resp = &imap.StatusResponse{
			Type: imap.StatusResponseTypeBad,
			Code: imap.ResponseCodeClientBug,
			Text: "Syntax error: " + decErr.Message,
		}
	} else if err != nil {
		c.server.logger().Printf("handling %v command: %v", name, err)
		resp = c.server.errorResp(name, err) // quill: code and cause, not a fixed text
	} else {
		c.badCount = 0
		if !sendOK {
			c.commandDone(reported, imap.StatusResponseTypeOK) // the command answered OK itself
			return nil
		}
		if err := c.poll(name); err != nil {
			return err
		}
		resp = &imap.StatusResponse{
			Type: imap.StatusResponseTypeOK,
			Text: fmt.Sprintf("%v completed", name),
		}
	}
	c.commandDone(reported, resp.Type)
	if resp.Type == imap.StatusResponseTypeBad && c.countBad() {
		c.writeStatusResp(tag, resp)
		c.Bye("Too many bad commands")
		return fmt.Errorf("too many bad commands")
	}
	return c.writeStatusResp(tag, resp)
}

// commandDone tells Options.CommandDone how a command was answered. (quill)
func (c *Conn) commandDone(name string, result imap.StatusResponseType) {
	if f := c.server.options.CommandDone; f != nil {
		f(name, result)
	}
}

// malformedLine answers resp (BAD) to a command line whose tag or name
// cannot be read, after discarding the rest of the line; a line over the
// limit closes the connection instead, and a read error ends it. (quill)
func (c *Conn) malformedLine(dec *imapwire.Decoder, tag string, resp *imap.StatusResponse) error {
	var decErr *imapwire.DecoderExpectError
	if !errors.As(dec.Err(), &decErr) {
		return fmt.Errorf("in command: %w", dec.Err())
	}
	dec.DiscardLine()
	if errors.Is(dec.Err(), imapwire.ErrMaxSize) {
		return dec.Err()
	}
	c.commandDone("UNKNOWN", resp.Type)
	err := c.writeStatusResp(tag, resp)
	if c.countBad() {
		c.Bye("Too many bad commands")
		return fmt.Errorf("too many bad commands")
	}
	return err
}

// countBad counts one more BAD answer and reports whether the session has
// had too many in a row; the caller then says BYE. (quill)
func (c *Conn) countBad() bool {
	c.badCount++
	if c.badCount < maxBadCommands {
		return false
	}
	c.state = imap.ConnStateLogout
	return true
}

func (c *Conn) handleNoop(dec *imapwire.Decoder) error {
	if !dec.ExpectCRLF() {
		return dec.Err()
	}
	return nil
}

func (c *Conn) handleLogout(dec *imapwire.Decoder) error {
	if !dec.ExpectCRLF() {
		return dec.Err()
	}

	c.state = imap.ConnStateLogout

	return c.writeStatusResp("", &imap.StatusResponse{
		Type: imap.StatusResponseTypeBye,
		Text: "Logging out",
	})
}

func (c *Conn) handleDelete(dec *imapwire.Decoder) error {
	var name string
	if !dec.ExpectSP() || !dec.ExpectMailbox(&name) || !dec.ExpectCRLF() {
		return dec.Err()
	}
	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		return err
	}
	return c.session.Delete(name)
}

func (c *Conn) handleRename(dec *imapwire.Decoder) error {
	var oldName, newName string
	if !dec.ExpectSP() || !dec.ExpectMailbox(&oldName) || !dec.ExpectSP() || !dec.ExpectMailbox(&newName) || !dec.ExpectCRLF() {
		return dec.Err()
	}
	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		return err
	}
	var options imap.RenameOptions
	return c.session.Rename(oldName, newName, &options)
}

func (c *Conn) handleSubscribe(dec *imapwire.Decoder) error {
	var name string
	if !dec.ExpectSP() || !dec.ExpectMailbox(&name) || !dec.ExpectCRLF() {
		return dec.Err()
	}
	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		return err
	}
	return c.session.Subscribe(name)
}

func (c *Conn) handleUnsubscribe(dec *imapwire.Decoder) error {
	var name string
	if !dec.ExpectSP() || !dec.ExpectMailbox(&name) || !dec.ExpectCRLF() {
		return dec.Err()
	}
	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		return err
	}
	return c.session.Unsubscribe(name)
}

func (c *Conn) checkBufferedLiteral(size int64, nonSync bool) error {
	if size > maxBufferedLiteral {
		return &imap.Error{
			Type: imap.StatusResponseTypeNo,
			Code: imap.ResponseCodeTooBig,
			Text: fmt.Sprintf("Literals are limited to %d bytes for this command", maxBufferedLiteral),
		}
	}

	return c.acceptLiteral(size, nonSync)
}

func (c *Conn) acceptLiteral(size int64, nonSync bool) error {
	if nonSync && size > 4096 && !c.server.options.caps().Has(imap.CapLiteralPlus) {
		return &imap.Error{
			Type: imap.StatusResponseTypeBad,
			Text: "Non-synchronizing literals are limited to 4096 bytes",
		}
	}

	if nonSync {
		return nil
	}

	return c.writeContReq("Ready for literal data")
}

func (c *Conn) canAuth() bool {
	if c.state != imap.ConnStateNotAuthenticated {
		return false
	}
	_, isTLS := c.conn.(*tls.Conn)
	if isTLS || c.server.options.InsecureAuth {
		return true
	}
	// quill: per connection (loopback clients may send a password in clear).
	f := c.server.options.InsecureAuthConn
	return f != nil && f(c.conn)
}

func (c *Conn) writeStatusResp(tag string, statusResp *imap.StatusResponse) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	return writeStatusResp(enc.Encoder, tag, statusResp)
}

func (c *Conn) writeContReq(text string) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	return writeContReq(enc.Encoder, text)
}

func (c *Conn) writeCapabilityStatus(tag string, typ imap.StatusResponseType, text string) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	return writeCapabilityStatus(enc.Encoder, tag, typ, c.availableCaps(), text)
}

func (c *Conn) checkState(state imap.ConnState) error {
	if state == imap.ConnStateAuthenticated && c.state == imap.ConnStateSelected {
		return nil
	}
	if c.state != state {
		return newClientBugError(fmt.Sprintf("This command is only valid in the %s state", state))
	}
	return nil
}

func (c *Conn) setReadTimeout(dur time.Duration) {
	if dur > 0 {
		c.conn.SetReadDeadline(time.Now().Add(dur))
	} else {
		c.conn.SetReadDeadline(time.Time{})
	}
}

// setWriteTimeout arms the connection's write deadline dur from now (0:
// none). quill: arming it costs a timer update in the runtime, which, twice
// per response line, was a quarter of the time of a FETCH of many messages;
// so a deadline armed less than writeDeadlineSlack before the one asked is
// kept, and a response's end disarms it only once nothing is left in the
// buffer (responseEncoder.end): the lines of a FETCH arm it once and the
// tagged answer that flushes them disarms it. Called with encMutex held.
func (c *Conn) setWriteTimeout(dur time.Duration) {
	if dur <= 0 {
		if !c.writeDeadline.IsZero() {
			c.conn.SetWriteDeadline(time.Time{})
			c.writeDeadline = time.Time{}
		}
		return
	}
	d := time.Now().Add(dur)
	if !c.writeDeadline.IsZero() {
		if ahead := d.Sub(c.writeDeadline); ahead >= 0 && ahead < writeDeadlineSlack {
			return
		}
	}
	c.conn.SetWriteDeadline(d)
	c.writeDeadline = d
}

// writeDeadlineSlack is how much sooner than asked an armed write deadline
// may fall (setWriteTimeout). quill
const writeDeadlineSlack = time.Second

func (c *Conn) poll(cmd string) error {
	switch c.state {
	case imap.ConnStateAuthenticated, imap.ConnStateSelected:
		// nothing to do
	default:
		return nil
	}

	allowExpunge := true
	switch cmd {
	case "FETCH", "STORE", "SEARCH", "SORT", "THREAD": // quill: SORT and THREAD answer sequence numbers too
		allowExpunge = false
	}

	w := &UpdateWriter{conn: c, allowExpunge: allowExpunge}
	return c.session.Poll(w, allowExpunge)
}

type responseEncoder struct {
	*imapwire.Encoder
	conn *Conn
}

func newResponseEncoder(conn *Conn) *responseEncoder {
	conn.mutex.Lock()
	quotedUTF8 := conn.enabled.Has(imap.CapIMAP4rev2) || conn.enabled.Has(imap.CapUTF8Accept)
	conn.mutex.Unlock()

	wireEnc := imapwire.NewEncoder(conn.bw, imapwire.ConnSideServer)
	wireEnc.QuotedUTF8 = quotedUTF8

	conn.encMutex.Lock() // released by responseEncoder.end
	conn.setWriteTimeout(respWriteTimeout)
	return &responseEncoder{
		Encoder: wireEnc,
		conn:    conn,
	}
}

func (enc *responseEncoder) end() {
	if enc.Encoder == nil {
		panic("imapserver: responseEncoder.end called twice")
	}
	enc.Encoder = nil
	// quill: a response left in the buffer (a FETCH line before its
	// tagged answer) keeps the write deadline armed for the one that
	// flushes it; once all is written, the connection may wait for the
	// client as long as it likes (IDLE, a literal, the next command), and
	// a TLS connection that writes during a read (a key update) must not
	// find an expired deadline (setWriteTimeout).
	if enc.conn.bw.Buffered() == 0 {
		enc.conn.setWriteTimeout(0)
	}
	enc.conn.encMutex.Unlock()
}

func (enc *responseEncoder) Literal(size int64) io.WriteCloser {
	enc.conn.setWriteTimeout(literalWriteTimeout)
	return literalWriter{
		WriteCloser: enc.Encoder.Literal(size, nil),
		conn:        enc.conn,
	}
}

type literalWriter struct {
	io.WriteCloser
	conn *Conn
}

func (lw literalWriter) Close() error {
	lw.conn.setWriteTimeout(respWriteTimeout)
	return lw.WriteCloser.Close()
}

func writeStatusResp(enc *imapwire.Encoder, tag string, statusResp *imap.StatusResponse) error {
	if tag == "" {
		tag = "*"
	}
	enc.Atom(tag).SP().Atom(string(statusResp.Type)).SP()
	if statusResp.Code != "" {
		enc.Atom(fmt.Sprintf("[%v]", statusResp.Code)).SP()
	}
	enc.Text(statusResp.Text)
	return enc.CRLF()
}

func writeCapabilityOK(enc *imapwire.Encoder, tag string, caps []imap.Cap, text string) error {
	return writeCapabilityStatus(enc, tag, imap.StatusResponseTypeOK, caps, text)
}

func writeCapabilityStatus(enc *imapwire.Encoder, tag string, typ imap.StatusResponseType, caps []imap.Cap, text string) error {
	if tag == "" {
		tag = "*"
	}

	enc.Atom(tag).SP().Atom(string(typ)).SP().Special('[').Atom("CAPABILITY")
	for _, c := range caps {
		enc.SP().Atom(string(c))
	}
	enc.Special(']').SP().Text(text)
	return enc.CRLF()
}

func writeContReq(enc *imapwire.Encoder, text string) error {
	return enc.Atom("+").SP().Text(text).CRLF()
}

func newClientBugError(text string) error {
	return &imap.Error{
		Type: imap.StatusResponseTypeBad,
		Code: imap.ResponseCodeClientBug,
		Text: text,
	}
}

// errExpungeNotAllowed is a session's mistake: an EXPUNGE or VANISHED
// where RFC 9051 §7.5.1 forbids it (during FETCH, STORE, SEARCH).
var errExpungeNotAllowed = errors.New("imapserver: EXPUNGE updates are not allowed in this context")

// UpdateWriter writes status updates.
type UpdateWriter struct {
	conn         *Conn
	allowExpunge bool
}

// WriteExpunge writes an EXPUNGE response.
func (w *UpdateWriter) WriteExpunge(seqNum uint32) error {
	if !w.allowExpunge {
		return errExpungeNotAllowed
	}
	return w.conn.writeExpunge(seqNum)
}

// WriteNumMessages writes an EXISTS response.
func (w *UpdateWriter) WriteNumMessages(n uint32) error {
	return w.conn.writeExists(n)
}

// WriteNumRecent writes an RECENT response (not used in IMAP4rev2, will be ignored).
func (w *UpdateWriter) WriteNumRecent(n uint32) error {
	if w.conn.enabled.Has(imap.CapIMAP4rev2) || !w.conn.server.options.caps().Has(imap.CapIMAP4rev1) {
		return nil
	}
	return w.conn.writeObsoleteRecent(n)
}

// WriteMailboxFlags writes a FLAGS response.
func (w *UpdateWriter) WriteMailboxFlags(flags []imap.Flag) error {
	return w.conn.writeFlags(flags)
}

// WriteMailboxFlagsPermanent writes FLAGS and, unless permanent is nil, OK
// [PERMANENTFLAGS]: the mailbox's flags changed (a new keyword). (quill)
func (w *UpdateWriter) WriteMailboxFlagsPermanent(flags, permanent []imap.Flag) error {
	return w.conn.writeMailboxFlags(flags, permanent)
}

// WriteMessageFlagsModSeq writes a FETCH response with FLAGS and, when modSeq
// is not zero, MODSEQ (RFC 7162 §3.2: required once CONDSTORE is enabled).
// (quill)
func (w *UpdateWriter) WriteMessageFlagsModSeq(seqNum uint32, uid imap.UID, flags []imap.Flag, modSeq uint64) error {
	fetchWriter := &FetchWriter{conn: w.conn}
	respWriter := fetchWriter.CreateMessage(seqNum)
	if uid != 0 {
		respWriter.WriteUID(uid)
	}
	respWriter.WriteFlags(flags)
	if modSeq != 0 {
		respWriter.WriteModSeq(modSeq)
	}
	return respWriter.Close()
}

// AllowExpunge reports whether EXPUNGE responses may be sent now (RFC 9051
// §7.5.1: not during FETCH, STORE or SEARCH). (quill)
func (w *UpdateWriter) AllowExpunge() bool { return w.allowExpunge }

// WriteMessageFlags writes a FETCH response with FLAGS.
func (w *UpdateWriter) WriteMessageFlags(seqNum uint32, uid imap.UID, flags []imap.Flag) error {
	fetchWriter := &FetchWriter{conn: w.conn}
	respWriter := fetchWriter.CreateMessage(seqNum)
	if uid != 0 {
		respWriter.WriteUID(uid)
	}
	respWriter.WriteFlags(flags)
	return respWriter.Close()
}

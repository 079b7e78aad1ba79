package bench

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"net"
	"strconv"
	"strings"
	"time"
)

// Bounds of the line-level IMAP client.
const (
	// RawGreetingTimeout bounds the TCP connect, TLS handshake and greeting.
	RawGreetingTimeout = 10 * time.Second
	// RawLoginTimeout bounds LOGIN and the CAPABILITY after it (servers
	// hash passwords slowly on purpose).
	RawLoginTimeout = 30 * time.Second
	// rawMaxLine bounds one response line with its literals: a SEARCH
	// answer listing 1,000,000 messages is about 7 MB.
	rawMaxLine = 64 << 20
)

// RawIMAP is a line-level IMAP client (RFC 9051 §2.2): it sends commands
// as written and reads the responses up to the tagged status, handing each
// untagged line to the caller. It is written by hand rather than taken
// from go-imap's client because the large-mailbox workload must send every
// server the very same bytes (go-imap's client picks its own forms) and
// must send MULTIAPPEND (RFC 3502), which that client cannot.
type RawIMAP struct {
	conn net.Conn
	r    *bufio.Reader
	tag  int
	buf  []byte // the logical line being read, reused
	caps map[string]bool
	// Greeting is the server's greeting line, without CRLF.
	Greeting string
}

// RawStatusError is a command answered NO or BAD, or a connection that
// ended before the command's tagged answer.
type RawStatusError struct {
	Command string // the command's start
	Status  string // the tagged answer, or what ended the connection
}

func (e *RawStatusError) Error() string { return "imap " + e.Command + ": " + e.Status }

// DialRawIMAP connects to addr (with implicit TLS if tlsCfg is set) and
// reads the greeting, which must be OK.
func DialRawIMAP(ctx context.Context, addr string, tlsCfg *tls.Config) (*RawIMAP, error) {
	ctx, cancel := context.WithTimeout(ctx, RawGreetingTimeout)
	defer cancel()
	d := net.Dialer{Timeout: DialTimeout}
	conn, err := d.DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil, err
	}
	if tlsCfg != nil {
		tc := tls.Client(conn, tlsCfg)
		if err := tc.HandshakeContext(ctx); err != nil {
			conn.Close()
			return nil, fmt.Errorf("TLS handshake with %s: %w", addr, err)
		}
		conn = tc
	}
	c := &RawIMAP{conn: conn, r: bufio.NewReaderSize(conn, 64<<10)}
	deadline, _ := ctx.Deadline()
	conn.SetDeadline(deadline)
	line, err := c.readLine()
	if err != nil {
		conn.Close()
		return nil, fmt.Errorf("greeting of %s: %w", addr, err)
	}
	c.Greeting = string(line)
	if !bytes.HasPrefix(line, []byte("* OK")) {
		conn.Close()
		return nil, fmt.Errorf("greeting of %s: %q", addr, line)
	}
	return c, nil
}

// Close closes the connection.
func (c *RawIMAP) Close() error { return c.conn.Close() }

// Login sends LOGIN, then CAPABILITY to learn what the server offers once
// logged in.
func (c *RawIMAP) Login(user, pass string) error {
	u, okU := imapQuoted(user)
	p, okP := imapQuoted(pass)
	if !okU || !okP {
		return fmt.Errorf("imap LOGIN %s: the user name or password holds CR, LF, NUL or non-ASCII characters, which this client does not send", user)
	}
	// The password goes out in the command but never into an error.
	if err := c.do(RawLoginTimeout, "LOGIN "+user, nil, []byte("LOGIN "+u+" "+p)); err != nil {
		return err
	}
	c.caps = map[string]bool{}
	return c.Do(RawLoginTimeout, func(line []byte) {
		if rest, ok := bytes.CutPrefix(line, []byte("* CAPABILITY ")); ok {
			for _, f := range strings.Fields(string(rest)) {
				c.caps[strings.ToUpper(f)] = true
			}
		}
	}, []byte("CAPABILITY"))
}

// Has reports whether the server listed capability name after login
// (name in upper case, e.g. "MULTIAPPEND", "APPENDLIMIT=26214400").
func (c *RawIMAP) Has(name string) bool { return c.caps[name] }

// Capabilities returns what the server listed after login.
func (c *RawIMAP) Capabilities() map[string]bool { return c.caps }

// imapQuoted is s as an IMAP quoted string (RFC 9051 §4.3); false if s
// holds what a quoted string cannot.
func imapQuoted(s string) (string, bool) {
	if strings.ContainsFunc(s, func(r rune) bool { return r == '\r' || r == '\n' || r == 0 || r > 0x7e }) {
		return "", false
	}
	return `"` + strings.NewReplacer(`\`, `\\`, `"`, `\"`).Replace(s) + `"`, true
}

// Do sends a command and reads its responses up to its tagged answer,
// calling onLine (if not nil) with each untagged response (the bytes of
// literals left out, their {n} kept). The command is chunks in order,
// without tag or final CRLF: each chunk but the last ends with a
// synchronizing literal's "{n}\r\n", after which Do waits for the
// server's continuation request. The whole command must end within
// timeout. An answer other than OK is a *RawStatusError.
func (c *RawIMAP) Do(timeout time.Duration, onLine func(line []byte), chunks ...[]byte) error {
	return c.do(timeout, commandName(chunks[0]), onLine, chunks...)
}

// do is Do with the name errors give the command.
func (c *RawIMAP) do(timeout time.Duration, name string, onLine func(line []byte), chunks ...[]byte) error {
	c.conn.SetDeadline(time.Now().Add(timeout))
	c.tag++
	tag := "q" + strconv.Itoa(c.tag)
	for k, chunk := range chunks {
		var out []byte
		if k == 0 {
			out = append([]byte(tag+" "), chunk...)
		} else {
			out = chunk
		}
		last := k == len(chunks)-1
		if last {
			out = append(out, '\r', '\n')
		}
		if _, err := c.conn.Write(out); err != nil {
			return fmt.Errorf("imap %s: %w", name, err)
		}
		done, err := c.readResponses(tag, name, onLine, !last)
		if err != nil {
			return err
		}
		if done && !last {
			return &RawStatusError{Command: name, Status: "answered OK before its literals were sent"}
		}
	}
	return nil
}

// readResponses reads until the tagged answer of tag (done) or, with
// continuation, a continuation request (not done).
func (c *RawIMAP) readResponses(tag, name string, onLine func([]byte), continuation bool) (done bool, err error) {
	var bye string
	for {
		line, err := c.readLine()
		if err != nil {
			if bye != "" {
				return true, &RawStatusError{Command: name, Status: bye}
			}
			return true, fmt.Errorf("imap %s: %w", name, err)
		}
		switch {
		case continuation && bytes.HasPrefix(line, []byte("+")):
			return false, nil
		case bytes.HasPrefix(line, []byte("* ")):
			if bytes.HasPrefix(line, []byte("* BYE")) {
				bye = string(line)
			}
			if onLine != nil {
				onLine(line)
			}
		case bytes.HasPrefix(line, []byte(tag+" ")):
			status := line[len(tag)+1:]
			if bytes.HasPrefix(status, []byte("OK")) {
				return true, nil
			}
			return true, &RawStatusError{Command: name, Status: string(status)}
		}
	}
}

// commandName is the start of a command for errors: its first line, at
// most 60 bytes (an APPEND's messages stay out).
func commandName(b []byte) string {
	if i := bytes.IndexAny(b, "\r\n"); i >= 0 {
		b = b[:i]
	}
	if len(b) > 60 {
		return string(b[:60]) + "..."
	}
	return string(b)
}

// readLine reads one response line without its CRLF; a literal in it
// ({n} or ~{n} at a line's end, RFC 9051 §4.3, RFC 3516) is read and left
// out, and the line goes on after it. The slice is valid until the next
// read.
func (c *RawIMAP) readLine() ([]byte, error) {
	c.buf = c.buf[:0]
	for {
		part, err := c.r.ReadSlice('\n')
		if len(c.buf)+len(part) > rawMaxLine {
			return nil, fmt.Errorf("response line over %d bytes", rawMaxLine)
		}
		c.buf = append(c.buf, part...)
		if err == bufio.ErrBufferFull {
			continue
		}
		if err != nil {
			return nil, err
		}
		c.buf = bytes.TrimRight(c.buf, "\r\n")
		n, ok := literalAtEnd(c.buf)
		if !ok {
			return c.buf, nil
		}
		if n > rawMaxLine {
			return nil, fmt.Errorf("literal of %d bytes", n)
		}
		if _, err := c.r.Discard(int(n)); err != nil {
			return nil, err
		}
	}
}

// literalAtEnd returns the size of the literal announced at the end of
// line: "{n}" (a server never sends "{n+}").
func literalAtEnd(line []byte) (int64, bool) {
	if len(line) < 3 || line[len(line)-1] != '}' {
		return 0, false
	}
	open := bytes.LastIndexByte(line, '{')
	if open < 0 {
		return 0, false
	}
	n, err := strconv.ParseInt(string(line[open+1:len(line)-1]), 10, 64)
	if err != nil || n < 0 {
		return 0, false
	}
	return n, true
}

// answerCounter counts how many messages a command's untagged responses
// name: the numbers of SEARCH and SORT responses (RFC 9051 §7.3.4, RFC
// 5256 §4), else one per FETCH response, else the count of EXISTS.
type answerCounter struct {
	listed, fetched, exists int
	lists, fetches          bool
}

// add takes one untagged response line.
func (a *answerCounter) add(line []byte) {
	rest, ok := bytes.CutPrefix(line, []byte("* "))
	if !ok {
		return
	}
	for _, kw := range []string{"SEARCH", "SORT"} {
		if r, ok := bytes.CutPrefix(rest, []byte(kw)); ok && (len(r) == 0 || r[0] == ' ') {
			a.lists = true
			a.listed += countNumbers(r)
			return
		}
	}
	num, kw, _ := bytes.Cut(rest, []byte(" "))
	n, err := strconv.Atoi(string(num))
	if err != nil {
		return
	}
	switch {
	case bytes.Equal(kw, []byte("EXISTS")):
		a.exists = n
	case bytes.HasPrefix(kw, []byte("FETCH ")):
		a.fetches = true
		a.fetched++
	}
}

// result is the size of the answer.
func (a *answerCounter) result() int {
	switch {
	case a.lists:
		return a.listed
	case a.fetches:
		return a.fetched
	}
	return a.exists
}

// countNumbers counts the space-separated numbers of a SEARCH or SORT
// answer, up to a parenthesized part (CONDSTORE's "(MODSEQ n)").
func countNumbers(b []byte) int {
	n := 0
	for len(b) > 0 {
		b = bytes.TrimLeft(b, " ")
		if len(b) == 0 || b[0] < '0' || b[0] > '9' {
			break
		}
		n++
		if i := bytes.IndexByte(b, ' '); i >= 0 {
			b = b[i:]
		} else {
			b = nil
		}
	}
	return n
}

// Run sends line and returns how many messages its answer names (see
// answerCounter).
func (c *RawIMAP) Run(timeout time.Duration, line string) (int, error) {
	var a answerCounter
	err := c.Do(timeout, a.add, []byte(line))
	return a.result(), err
}

// statusMessages returns the MESSAGES count of a STATUS response line.
func statusMessages(line []byte) (int, bool) {
	if !bytes.HasPrefix(line, []byte("* STATUS ")) {
		return 0, false
	}
	i := bytes.LastIndex(line, []byte("MESSAGES "))
	if i < 0 {
		return 0, false
	}
	num := line[i+len("MESSAGES "):]
	if j := bytes.IndexAny(num, " )"); j >= 0 {
		num = num[:j]
	}
	n, err := strconv.Atoi(string(num))
	return n, err == nil
}

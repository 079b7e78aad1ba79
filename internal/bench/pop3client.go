package bench

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"net"
	"strconv"
	"strings"
)

// maxPOPLine bounds a POP3 status line (RFC 2449 §4 allows 512 octets).
const maxPOPLine = 4096

// popError is a -ERR reply.
type popError struct {
	cmd, text string
}

func (e *popError) Error() string { return fmt.Sprintf("pop3: %s: -ERR %s", e.cmd, e.text) }

// popClient is the minimal RFC 1939 client the workload needs: USER/PASS,
// STAT, LIST, RETR, DELE and QUIT. Deadlines are the caller's business, on
// the net.Conn.
type popClient struct {
	conn net.Conn
	r    *bufio.Reader
	w    *bufio.Writer
}

func newPOPClient(conn net.Conn) *popClient {
	return &popClient{conn: conn, r: bufio.NewReaderSize(conn, 32<<10), w: bufio.NewWriter(conn)}
}

// readLine reads one CRLF- (or LF-) terminated line without its ending.
func (c *popClient) readLine() (string, error) {
	var line []byte
	for {
		part, isPrefix, err := c.r.ReadLine()
		if err != nil {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return "", err
		}
		line = append(line, part...)
		if len(line) > maxPOPLine {
			return "", errors.New("pop3: status line too long")
		}
		if !isPrefix {
			return string(line), nil
		}
	}
}

// status reads a status line (RFC 1939 §3): "+OK text" or "-ERR text".
func (c *popClient) status(cmd string) (string, error) {
	line, err := c.readLine()
	if err != nil {
		return "", err
	}
	switch {
	case line == "+OK" || strings.HasPrefix(line, "+OK "):
		return strings.TrimPrefix(strings.TrimPrefix(line, "+OK"), " "), nil
	case line == "-ERR" || strings.HasPrefix(line, "-ERR "):
		return "", &popError{cmd: cmd, text: strings.TrimPrefix(strings.TrimPrefix(line, "-ERR"), " ")}
	}
	return "", fmt.Errorf("pop3: %s: bad status line %q", cmd, line)
}

// cmd sends one command and reads its status line. Only the verb is kept
// for error messages, so passwords are not echoed.
func (c *popClient) cmd(format string, args ...any) (string, error) {
	line := fmt.Sprintf(format, args...)
	verb, _, _ := strings.Cut(line, " ")
	if _, err := c.w.WriteString(line + "\r\n"); err != nil {
		return "", err
	}
	if err := c.w.Flush(); err != nil {
		return "", err
	}
	return c.status(verb)
}

// greeting reads the server greeting.
func (c *popClient) greeting() error { _, err := c.status("greeting"); return err }

// login authenticates with USER and PASS (RFC 1939 §7).
func (c *popClient) login(user, pass string) error {
	if _, err := c.cmd("USER %s", user); err != nil {
		return err
	}
	_, err := c.cmd("PASS %s", pass)
	return err
}

// stat returns the number of messages in the maildrop (RFC 1939 §5).
func (c *popClient) stat() (int, error) {
	text, err := c.cmd("STAT")
	if err != nil {
		return 0, err
	}
	f := strings.Fields(text)
	if len(f) < 2 {
		return 0, fmt.Errorf("pop3: bad STAT reply %q", text)
	}
	n, err := strconv.Atoi(f[0])
	if err != nil || n < 0 {
		return 0, fmt.Errorf("pop3: bad STAT reply %q", text)
	}
	return n, nil
}

// list returns the numbers of the messages in the maildrop (RFC 1939 §5,
// LIST without argument: a multi-line "msg octets" listing).
func (c *popClient) list() ([]int, error) {
	if _, err := c.cmd("LIST"); err != nil {
		return nil, err
	}
	var nums []int
	for {
		line, err := c.readLine()
		if err != nil {
			return nil, err
		}
		if line == "." {
			return nums, nil
		}
		f := strings.Fields(line)
		if len(f) < 1 {
			return nil, fmt.Errorf("pop3: bad LIST line %q", line)
		}
		n, err := strconv.Atoi(f[0])
		if err != nil || n < 1 {
			return nil, fmt.Errorf("pop3: bad LIST line %q", line)
		}
		nums = append(nums, n)
	}
}

// retr reads message n to the terminating dot line (RFC 1939 §3: a line
// starting with a dot is byte-stuffed) and returns its size with CRLF line
// ends after unstuffing.
func (c *popClient) retr(n int) (int64, error) {
	if _, err := c.cmd("RETR %d", n); err != nil {
		return 0, err
	}
	var size int64
	atStart := true // whether the next bytes begin a line
	for {
		line, err := c.r.ReadSlice('\n')
		if err != nil && err != bufio.ErrBufferFull {
			if err == io.EOF {
				err = io.ErrUnexpectedEOF
			}
			return size, err
		}
		if atStart {
			if err == nil && (string(line) == ".\r\n" || string(line) == ".\n") {
				return size, nil
			}
			if line[0] == '.' {
				line = line[1:]
			}
		}
		size += int64(len(line))
		// A line longer than the buffer comes in several pieces.
		atStart = err == nil
	}
}

// dele marks message n as deleted.
func (c *popClient) dele(n int) error { _, err := c.cmd("DELE %d", n); return err }

// quit ends the session; the server removes the deleted messages (UPDATE
// state, RFC 1939 §6).
func (c *popClient) quit() error { _, err := c.cmd("QUIT"); return err }

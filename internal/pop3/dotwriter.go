package pop3

import (
	"bufio"
	"bytes"
	"errors"
	"io"
)

// dotWriter turns a message into the body of a POP3 multi-line response
// (RFC 1939 §3): a line that begins with "." gets one more "."; every line
// ends in CRLF; Close ends the response with ".\r\n".
//
// Stored messages should already use CRLF, but a bare LF is sent as CRLF
// anyway: a client splits lines on LF, and a stray LF followed by "." would
// otherwise look like the end of the response. A bare CR is passed through,
// since it does not end a line for the client.
type dotWriter struct {
	w   io.Writer
	bol bool // the next byte starts a line
	cr  bool // the last byte written was CR
}

func newDotWriter(w io.Writer) *dotWriter {
	return &dotWriter{w: w, bol: true}
}

var crlf = []byte("\r\n")

func (d *dotWriter) Write(p []byte) (int, error) {
	n := 0
	for len(p) > 0 {
		if d.bol && p[0] == '.' {
			if _, err := d.w.Write([]byte{'.'}); err != nil {
				return n, err
			}
		}
		i := bytes.IndexByte(p, '\n')
		if i < 0 {
			// No line end: the line goes on in a later Write.
			if _, err := d.w.Write(p); err != nil {
				return n, err
			}
			d.bol = false
			d.cr = p[len(p)-1] == '\r'
			return n + len(p), nil
		}
		hasCR := (i > 0 && p[i-1] == '\r') || (i == 0 && d.cr)
		if _, err := d.w.Write(p[:i]); err != nil {
			return n, err
		}
		end := crlf
		if hasCR {
			end = crlf[1:]
		}
		if _, err := d.w.Write(end); err != nil {
			return n, err
		}
		d.bol, d.cr = true, false
		n += i + 1
		p = p[i+1:]
	}
	return n, nil
}

// Close ends the last line if the message did not (a final line without
// CRLF is common in stored mail) and writes the terminating ".\r\n". It
// does not close the underlying writer.
func (d *dotWriter) Close() error {
	if !d.bol {
		end := crlf
		if d.cr {
			end = crlf[1:]
		}
		if _, err := d.w.Write(end); err != nil {
			return err
		}
		d.bol, d.cr = true, false
	}
	_, err := io.WriteString(d.w, ".\r\n")
	return err
}

// copyTop copies the header, the blank line after it and then at most
// bodyLines lines of the body from src to dst, for TOP (RFC 1939 §7). A
// message without a blank line is all header and is copied whole. Lines of
// any length are streamed, not buffered.
func copyTop(dst io.Writer, src io.Reader, bodyLines int) error {
	br := bufio.NewReader(src)
	inHeader := true
	atLineStart := true
	lines := 0
	for {
		if !inHeader && atLineStart && lines >= bodyLines {
			return nil
		}
		frag, err := br.ReadSlice('\n')
		if len(frag) > 0 {
			if _, werr := dst.Write(frag); werr != nil {
				return werr
			}
			if frag[len(frag)-1] == '\n' {
				switch {
				case inHeader && atLineStart && (len(frag) == 1 || (len(frag) == 2 && frag[0] == '\r')):
					inHeader = false
				case !inHeader:
					lines++
				}
				atLineStart = true
			} else {
				atLineStart = false
			}
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
		case err == io.EOF:
			return nil
		default:
			return err
		}
	}
}

package imapserver

import (
	"fmt"
	"io"
	"runtime/debug"
	"strings"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
)

func (c *Conn) handleIdle(dec *imapwire.Decoder) error {
	if !dec.ExpectCRLF() {
		return dec.Err()
	}

	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		return err
	}

	if err := c.writeContReq("idling"); err != nil {
		return err
	}

	stop := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		defer func() {
			if v := recover(); v != nil {
				c.server.logger().Printf("panic idling: %v\n%s", v, debug.Stack())
				done <- fmt.Errorf("imapserver: panic idling")
			}
		}()
		w := &UpdateWriter{conn: c, allowExpunge: true}
		done <- c.session.Idle(w, stop)
	}()

	c.setReadTimeout(idleReadTimeout)
	line, isPrefix, err := c.br.ReadLine()
	close(stop)
	// quill: the session's Idle has ended before anything else runs on
	// this connection, whatever the client sent: upstream returned at
	// once on a read error or a line other than DONE, and the next
	// command (or NOTIFY's reporting) ran beside a still running Idle.
	idleErr := <-done
	if err == io.EOF {
		return nil
	} else if err != nil {
		return err
	} else if isPrefix || !strings.EqualFold(string(line), "DONE") { // quill: keywords are case-insensitive
		return newClientBugError("Syntax error: expected DONE to end IDLE command")
	}

	return idleErr
}

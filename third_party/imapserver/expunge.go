package imapserver

import (
	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
)

func (c *Conn) handleExpunge(tag string, dec *imapwire.Decoder) error {
	if !dec.ExpectCRLF() {
		return dec.Err()
	}
	return c.expunge(tag, "EXPUNGE", nil)
}

func (c *Conn) handleUIDExpunge(tag string, dec *imapwire.Decoder) error {
	var uidSet imap.UIDSet
	if !dec.ExpectSP() || !dec.ExpectUIDSet(&uidSet) || !dec.ExpectCRLF() {
		return dec.Err()
	}
	return c.expunge(tag, "UID EXPUNGE", &uidSet)
}

// expunge runs EXPUNGE or UID EXPUNGE and writes its tagged OK (quill:
// with QRESYNC enabled and a message expunged, the OK carries the
// mailbox's new HIGHESTMODSEQ, RFC 7162 §3.2.10, which the session
// reports after the poll).
func (c *Conn) expunge(tag, name string, uids *imap.UIDSet) error {
	if err := c.checkState(imap.ConnStateSelected); err != nil {
		return err
	}
	w := &ExpungeWriter{conn: c}
	if err := c.session.Expunge(w, uids); err != nil {
		return err
	}
	if err := c.poll(name); err != nil {
		return err
	}
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom(tag).SP().Atom("OK").SP()
	if qs, ok := c.session.(SessionQResync); ok && w.vanished {
		enc.Special('[').Atom("HIGHESTMODSEQ").SP().ModSeq(qs.HighestModSeq()).Special(']').SP()
	}
	enc.Text(name + " completed")
	return enc.CRLF()
}

func (c *Conn) writeExpunge(seqNum uint32) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Number(seqNum).SP().Atom("EXPUNGE")
	return enc.CRLF()
}

// ExpungeWriter writes EXPUNGE updates.
type ExpungeWriter struct {
	conn     *Conn
	vanished bool // quill: a VANISHED went out (qresync.go)
}

// WriteExpunge notifies the client that the message with the provided sequence
// number has been deleted.
func (w *ExpungeWriter) WriteExpunge(seqNum uint32) error {
	if w.conn == nil {
		return nil
	}
	return w.conn.writeExpunge(seqNum)
}

// Silent reports whether EXPUNGE responses are dropped, as for CLOSE (RFC
// 9051 §6.4.1: CLOSE sends no untagged EXPUNGE). (quill)
func (w *ExpungeWriter) Silent() bool { return w.conn == nil }

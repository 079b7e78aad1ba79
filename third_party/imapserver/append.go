package imapserver

import (
	"fmt"
	"io"
	"strings"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
	"github.com/quillmail/quill/third_party/imapserver/internal/wire"
)

// defaultAppendLimit is the default maximum size of an APPEND payload.
const defaultAppendLimit = 100 * 1024 * 1024 // 100MiB

func (c *Conn) handleAppend(tag string, dec *imapwire.Decoder) error {
	var (
		mailbox string
		options imap.AppendOptions
	)
	if !dec.ExpectSP() || !dec.ExpectMailbox(&mailbox) || !dec.ExpectSP() {
		return dec.Err()
	}

	hasFlagList, err := dec.List(func() error {
		flag, err := wire.ExpectFlag(dec)
		if err != nil {
			return err
		}
		options.Flags = append(options.Flags, flag)
		return nil
	})
	if err != nil {
		return err
	}
	if hasFlagList && !dec.ExpectSP() {
		return dec.Err()
	}

	t, err := wire.DecodeDateTime(dec)
	if err != nil {
		return err
	}
	if !t.IsZero() && !dec.ExpectSP() {
		return dec.Err()
	}
	options.Time = t

	var dataExt string
	if !dec.Special('~') && dec.Atom(&dataExt) { // ignore literal8 prefix if any for BINARY
		switch strings.ToUpper(dataExt) {
		case "UTF8":
			// '~' is the literal8 prefix
			if !dec.ExpectSP() || !dec.ExpectSpecial('(') || !dec.ExpectSpecial('~') {
				return dec.Err()
			}
		default:
			return newClientBugError("Unknown APPEND data extension")
		}
	}

	lit, nonSync, err := dec.ExpectLiteralReader()
	if err != nil {
		return err
	}

	appendLimit := int64(defaultAppendLimit)
	if appendLimitSession, ok := c.session.(SessionAppendLimit); ok {
		appendLimit = int64(appendLimitSession.AppendLimit())
	}

	var refused error
	if lit.Size() > appendLimit {
		refused = &imap.Error{
			Type: imap.StatusResponseTypeNo,
			Code: imap.ResponseCodeTooBig,
			Text: fmt.Sprintf("Literals are limited to %v bytes for this command", appendLimit),
		}
	} else {
		refused = c.acceptLiteral(lit.Size(), nonSync)
	}
	if refused != nil {
		// quill: upstream left a refused non-synchronizing literal unread,
		// so the message's lines ran as commands. Cut short, what follows
		// is no command line either: the connection ends.
		if !lit.Refuse() {
			c.state = imap.ConnStateLogout
		}
		return refused
	}

	c.setReadTimeout(literalReadTimeout)
	defer c.setReadTimeout(cmdReadTimeout)

	r := &appendLiteral{lit: lit, dec: dec, utf8: dataExt != ""}
	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		io.Copy(io.Discard, r)
		return err
	}

	data, appendErr := c.session.Append(mailbox, r, &options)
	// The rest of the literal, if the session did not read it all, and the
	// end of the command.
	if _, err := io.Copy(io.Discard, r); err != nil {
		return err // quill: upstream returned nil here, and stored the message anyway
	}
	if appendErr != nil {
		return appendErr
	}
	if err := c.poll("APPEND"); err != nil {
		return err
	}
	return c.writeAppendOK(tag, data)
}

// appendLiteral is the message literal as Session.Append reads it (quill).
// Upstream checked the end of the command (CRLF, or ")" CRLF after a UTF8
// literal) only after Append returned, so a message whose command was then
// answered BAD had been stored. The literal is streamed, not buffered (it
// may be as large as the APPEND limit), so the check is made when the
// session reaches the literal's end: Read returns the syntax error instead
// of io.EOF, and a session that reads to io.EOF and fails on a read error
// (as Append must) stores nothing. A literal cut short (the client went
// away) is io.ErrUnexpectedEOF, not a short message ending in io.EOF.
type appendLiteral struct {
	lit  *imapwire.LiteralReader
	dec  *imapwire.Decoder
	utf8 bool

	n   int64 // bytes read
	end error // once the literal is over: io.EOF, or why the command is not well-formed
}

func (r *appendLiteral) Size() int64 { return r.lit.Size() }

func (r *appendLiteral) Read(b []byte) (int, error) {
	if r.end != nil {
		return 0, r.end
	}
	n, err := r.lit.Read(b)
	r.n += int64(n)
	if err != io.EOF {
		return n, err
	}
	switch {
	case r.n < r.lit.Size():
		r.end = io.ErrUnexpectedEOF
	case (r.utf8 && !r.dec.ExpectSpecial(')')) || !r.dec.ExpectCRLF():
		r.end = r.dec.Err()
	default:
		r.end = io.EOF
	}
	return n, r.end
}

func (c *Conn) writeAppendOK(tag string, data *imap.AppendData) error {
	enc := newResponseEncoder(c)
	defer enc.end()

	enc.Atom(tag).SP().Atom("OK").SP()
	if data != nil {
		enc.Special('[')
		enc.Atom("APPENDUID").SP().Number(data.UIDValidity).SP().UID(data.UID)
		enc.Special(']').SP()
	}
	enc.Text("APPEND completed")
	return enc.CRLF()
}

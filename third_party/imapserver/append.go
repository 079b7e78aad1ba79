package imapserver

import (
	"bytes"
	"fmt"
	"io"
	"strings"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
	"github.com/quillmail/quill/third_party/imapserver/internal/wire"
)

// defaultAppendLimit is the default maximum size of an APPEND payload.
const defaultAppendLimit = 100 * 1024 * 1024 // 100MiB

// quill: APPEND reads each message whole before the session stores it, so
// that a command found malformed at its end stores nothing, and so that
// several messages (MULTIAPPEND, RFC 3502) and messages built from parts
// (CATENATE, RFC 4469) reach the session as one request: it stores all
// of them or none. Upstream streamed one literal into Session.Append; the
// session read it into memory all the same.
func (c *Conn) handleAppend(tag string, dec *imapwire.Decoder) error {
	var mailbox string
	if !dec.ExpectSP() || !dec.ExpectMailbox(&mailbox) || !dec.ExpectSP() {
		return dec.Err()
	}
	// No literal is taken before login: the bytes would be read only to
	// be refused (upstream read them first).
	authErr := c.checkState(imap.ConnStateAuthenticated)

	appendLimit := int64(defaultAppendLimit)
	if appendLimitSession, ok := c.session.(SessionAppendLimit); ok {
		appendLimit = int64(appendLimitSession.AppendLimit())
	}
	multi, _ := c.session.(SessionMultiAppend)
	var msgs []AppendMessage
	var total int64
	for {
		m := AppendMessage{}
		data, err := c.readAppendMessage(dec, &m.Options, appendLimit, total, len(msgs), authErr)
		if err != nil {
			return err
		}
		m.Data = data
		msgs = append(msgs, m)
		total += int64(len(data))
		if !dec.SP() {
			break
		}
		if multi == nil {
			err := newClientBugError("One message per APPEND (no MULTIAPPEND)")
			c.discardAppendRest(dec)
			return err
		}
	}
	if !dec.ExpectCRLF() {
		return dec.Err()
	}
	if len(msgs) > 1 {
		data, err := multi.AppendMulti(mailbox, msgs)
		if err != nil {
			return err
		}
		if err := c.poll("APPEND"); err != nil {
			return err
		}
		return c.writeMultiAppendOK(tag, data)
	}
	data, err := c.session.Append(mailbox, &bytesLiteral{Reader: bytes.NewReader(msgs[0].Data), size: int64(len(msgs[0].Data))}, &msgs[0].Options)
	if err != nil {
		return err
	}
	if err := c.poll("APPEND"); err != nil {
		return err
	}
	return c.writeAppendOK(tag, data)
}

// maxMultiAppend bounds the messages of one MULTIAPPEND (quill); their
// bytes together are bounded by the APPEND limit.
const maxMultiAppend = 1000

// readAppendMessage reads one append-message: [flag-list SP] [date-time
// SP] then a literal, a UTF8 literal8 (RFC 6855) or a CATENATE list (RFC
// 4469). prior and n are the bytes and messages read before it in this
// command. A refusal (too large, not logged in, a bad URL) ends the
// command: the rest of its messages is skipped (see discardAppendRest).
func (c *Conn) readAppendMessage(dec *imapwire.Decoder, options *imap.AppendOptions, limit, prior int64, n int, authErr error) ([]byte, error) {
	hasFlagList, err := dec.List(func() error {
		flag, err := wire.ExpectFlag(dec)
		if err != nil {
			return err
		}
		options.Flags = append(options.Flags, flag)
		return nil
	})
	if err != nil {
		return nil, err
	}
	if hasFlagList && !dec.ExpectSP() {
		return nil, dec.Err()
	}
	t, err := wire.DecodeDateTime(dec)
	if err != nil {
		return nil, err
	}
	if !t.IsZero() && !dec.ExpectSP() {
		return nil, dec.Err()
	}
	options.Time = t

	var dataExt string
	if !dec.Special('~') && dec.Atom(&dataExt) { // ignore literal8 prefix if any for BINARY
		switch strings.ToUpper(dataExt) {
		case "UTF8":
			// '~' is the literal8 prefix
			if !dec.ExpectSP() || !dec.ExpectSpecial('(') || !dec.ExpectSpecial('~') {
				return nil, dec.Err()
			}
			data, err := c.readAppendLiteral(dec, limit, prior, n, authErr)
			if err != nil {
				return nil, err
			}
			if !dec.ExpectSpecial(')') {
				return nil, dec.Err()
			}
			return data, nil
		case "CATENATE":
			if _, ok := c.session.(SessionCatenate); !ok {
				return nil, newClientBugError("Unknown APPEND data extension")
			}
			if !dec.ExpectSP() {
				return nil, dec.Err()
			}
			return c.readCatenate(dec, limit, prior, n, authErr)
		default:
			return nil, newClientBugError("Unknown APPEND data extension")
		}
	}
	return c.readAppendLiteral(dec, limit, prior, n, authErr)
}

// readAppendLiteral reads a message literal whole, or refuses it.
func (c *Conn) readAppendLiteral(dec *imapwire.Decoder, limit, prior int64, n int, authErr error) ([]byte, error) {
	lit, nonSync, err := dec.ExpectLiteralReader()
	if err != nil {
		return nil, err
	}
	refused := authErr
	switch {
	case refused != nil:
	case lit.Size() > limit:
		refused = &imap.Error{
			Type: imap.StatusResponseTypeNo,
			Code: imap.ResponseCodeTooBig,
			Text: fmt.Sprintf("Literals are limited to %v bytes for this command", limit),
		}
	case prior+lit.Size() > limit:
		refused = &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeTooBig,
			Text: fmt.Sprintf("The messages of one APPEND are limited to %v bytes in all: append fewer at a time", limit)}
	case n >= maxMultiAppend:
		refused = &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeLimit,
			Text: fmt.Sprintf("One APPEND takes at most %d messages", maxMultiAppend)}
	default:
		refused = c.acceptLiteral(lit.Size(), nonSync)
	}
	if refused != nil {
		// quill: upstream left a refused non-synchronizing literal unread,
		// so the message's lines ran as commands. Cut short, what follows
		// is no command line either: the connection ends.
		if !lit.Refuse() {
			c.state = imap.ConnStateLogout
			return nil, refused
		}
		if nonSync {
			c.discardAppendRest(dec)
		}
		return nil, refused
	}
	c.setReadTimeout(literalReadTimeout)
	defer c.setReadTimeout(cmdReadTimeout)
	data := make([]byte, lit.Size())
	n, rerr := io.ReadFull(lit, data)
	err = rerr
	if err == nil {
		// Read on to io.EOF, which hands the line back to the decoder.
		var more [1]byte
		if k, end := lit.Read(more[:]); k != 0 || end != io.EOF {
			err = fmt.Errorf("literal longer than its count (%v)", end)
		}
	}
	if err != nil {
		data = data[:n]
		// The client went away in the middle: nothing is stored.
		return nil, fmt.Errorf("APPEND literal cut short after %d of %d bytes: %w", len(data), lit.Size(), err)
	}
	return data, nil
}

// discardAppendRest skips what is left of an APPEND after a refusal:
// further messages whose non-synchronizing literals the client sends
// without waiting (RFC 7888 §4). A synchronizing literal ends the line
// unsent (the client reads the tagged answer instead of "+"). Anything
// that does not parse is left to the line's discarding.
func (c *Conn) discardAppendRest(dec *imapwire.Decoder) {
	for i := 0; i < maxMultiAppend*16; i++ {
		if dec.Special('(') {
			continue // a flag list, a UTF8 or CATENATE list
		}
		if dec.Special(')') || dec.SP() {
			continue
		}
		if lit, nonSync, ok := dec.LiteralReader(); ok {
			if !lit.Refuse() {
				c.state = imap.ConnStateLogout
				return
			}
			if !nonSync {
				return
			}
			continue
		}
		var s string
		if dec.Special('~') || dec.Quoted(&s) || dec.Atom(&s) || dec.Special('\\') {
			continue
		}
		return
	}
}

// bytesLiteral is a message read whole, as Session.Append reads it.
type bytesLiteral struct {
	*bytes.Reader
	size int64
}

func (l *bytesLiteral) Size() int64 { return l.size }

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

// writeMultiAppendOK answers a MULTIAPPEND: APPENDUID with the UIDs of
// the messages in their order (RFC 3502 §6.3.11 with UIDPLUS).
func (c *Conn) writeMultiAppendOK(tag string, data *MultiAppendData) error {
	enc := newResponseEncoder(c)
	defer enc.end()

	enc.Atom(tag).SP().Atom("OK").SP()
	if data != nil && len(data.UIDs) > 0 {
		var set imap.UIDSet
		for _, uid := range data.UIDs {
			set.AddNum(uid)
		}
		enc.Special('[')
		enc.Atom("APPENDUID").SP().Number(data.UIDValidity).SP().NumSet(set)
		enc.Special(']').SP()
	}
	enc.Text("APPEND completed")
	return enc.CRLF()
}

// SessionMultiAppend is a Session that takes several messages in one
// APPEND (RFC 3502 MULTIAPPEND): it stores every message, or none and
// leaves the mailbox as it was (quill).
type SessionMultiAppend interface {
	Session
	AppendMulti(mailbox string, msgs []AppendMessage) (*MultiAppendData, error)
}

// AppendMessage is one message of an APPEND, read whole (quill).
type AppendMessage struct {
	Options imap.AppendOptions
	Data    []byte
}

// MultiAppendData is what a MULTIAPPEND stored: the UIDs of the
// messages, in their order (quill).
type MultiAppendData struct {
	UIDValidity uint32
	UIDs        []imap.UID
}

// SessionCatenate is a Session that resolves the URL parts of an APPEND
// CATENATE (RFC 4469), without URLAUTH (quill).
type SessionCatenate interface {
	Session
	// CatenateURL returns the bytes an IMAP URL (RFC 5092) names: a
	// message of this user, or a part of one. A URL it cannot use is an
	// error made by BadURL.
	CatenateURL(url string) ([]byte, error)
}

// BadURL is the refusal of a CATENATE URL part: NO [BADURL "url"] (RFC
// 4469 §6).
func BadURL(url, why string) error {
	return &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCode("BADURL " + quoteURL(url)), Text: why}
}

// quoteURL makes a URL a quoted string for a response code; characters a
// quoted string cannot hold (the client sent the URL as a literal) are
// dropped, as the code only names it.
func quoteURL(url string) string {
	var b strings.Builder
	b.WriteByte('"')
	for i := 0; i < len(url) && i < 1024; i++ {
		ch := url[i]
		switch {
		case ch == '"' || ch == '\\':
			b.WriteByte('\\')
			b.WriteByte(ch)
		case ch < 0x20 || ch >= 0x7f:
		default:
			b.WriteByte(ch)
		}
	}
	b.WriteByte('"')
	return b.String()
}

// readCatenate reads "(" cat-part *(SP cat-part) ")", each part a TEXT
// literal, a UTF8 literal8 (RFC 6855 §4) or a URL the session resolves,
// and returns the message they make. A URL is resolved as it comes, so a
// bad one is answered before the client sends more (RFC 4469 §5).
func (c *Conn) readCatenate(dec *imapwire.Decoder, limit, prior int64, n int, authErr error) ([]byte, error) {
	cat := c.session.(SessionCatenate)
	if !dec.ExpectSpecial('(') {
		return nil, dec.Err()
	}
	var msg []byte
	for {
		var kind string
		if !dec.ExpectAtom(&kind) || !dec.ExpectSP() {
			return nil, dec.Err()
		}
		switch strings.ToUpper(kind) {
		case "TEXT":
			data, err := c.readAppendLiteral(dec, limit, prior+int64(len(msg)), n, authErr)
			if err != nil {
				return nil, err
			}
			msg = append(msg, data...)
		case "UTF8":
			if !dec.ExpectSpecial('(') || !dec.ExpectSpecial('~') {
				return nil, dec.Err()
			}
			data, err := c.readAppendLiteral(dec, limit, prior+int64(len(msg)), n, authErr)
			if err != nil {
				return nil, err
			}
			if !dec.ExpectSpecial(')') {
				return nil, dec.Err()
			}
			msg = append(msg, data...)
		case "URL":
			var url string
			if !dec.ExpectAString(&url) {
				return nil, dec.Err()
			}
			err := authErr
			var data []byte
			if err == nil {
				data, err = cat.CatenateURL(url)
			}
			if err == nil && prior+int64(len(msg))+int64(len(data)) > limit {
				err = &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeTooBig,
					Text: fmt.Sprintf("The message CATENATE makes is over the limit of %v bytes", limit)}
			}
			if err != nil {
				c.discardAppendRest(dec)
				return nil, err
			}
			msg = append(msg, data...)
		default:
			return nil, newClientBugError("A CATENATE part is TEXT, URL or UTF8")
		}
		if dec.Special(')') {
			return msg, nil
		}
		if !dec.ExpectSP() {
			return nil, dec.Err()
		}
	}
}

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
	st := &appendState{limit: defaultAppendLimit}
	if appendLimitSession, ok := c.session.(SessionAppendLimit); ok {
		st.limit = int64(appendLimitSession.AppendLimit())
	}
	// No literal is taken before login: the bytes would be read only to
	// be refused (upstream read them first).
	st.authErr = c.checkState(imap.ConnStateAuthenticated)
	// A syntax error leaves the rest of the line to the decoder's
	// DiscardLine, which skips non-synchronizing literals in it.
	msgs, err := c.readAppend(dec, st)
	if err != nil {
		return err
	}
	if len(msgs) > 1 {
		data, err := c.session.(SessionMultiAppend).AppendMulti(mailbox, msgs)
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

// appendState is what one APPEND has read so far (quill).
type appendState struct {
	limit   int64 // the APPEND limit, for each message and for all
	authErr error // not logged in: every literal is refused
	total   int64 // bytes of the messages read
	msgs    int   // messages begun
	urls    int   // CATENATE URL parts resolved
}

// maxMultiAppend bounds the messages of one MULTIAPPEND (quill); their
// bytes together are bounded by the APPEND limit.
const maxMultiAppend = 1000

// maxCatenateURLs bounds the URL parts of one APPEND: each reads a stored
// message.
const maxCatenateURLs = 100

// readAppend reads the messages of an APPEND to the end of the command.
func (c *Conn) readAppend(dec *imapwire.Decoder, st *appendState) ([]AppendMessage, error) {
	_, multi := c.session.(SessionMultiAppend)
	var msgs []AppendMessage
	for {
		if st.msgs >= maxMultiAppend {
			return nil, c.refuseRest(dec, st, &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeLimit,
				Text: fmt.Sprintf("One APPEND takes at most %d messages", maxMultiAppend)})
		}
		st.msgs++
		m := AppendMessage{}
		data, err := c.readAppendMessage(dec, &m.Options, st)
		if err != nil {
			return nil, err
		}
		m.Data = data
		msgs = append(msgs, m)
		st.total += int64(len(data))
		if !dec.SP() {
			break
		}
		if !multi {
			return nil, c.refuseRest(dec, st, newClientBugError("One message per APPEND (no MULTIAPPEND)"))
		}
	}
	if !dec.ExpectCRLF() {
		return nil, dec.Err()
	}
	return msgs, nil
}

// refuseRest drops the rest of the command and returns err.
func (c *Conn) refuseRest(dec *imapwire.Decoder, st *appendState, err error) error {
	c.discardAppendRest(dec)
	return err
}

// readAppendMessage reads one append-message: [flag-list SP] [date-time
// SP] then a literal, a UTF8 literal8 (RFC 6855) or a CATENATE list (RFC
// 4469). A refusal (too large, not logged in, a bad URL) ends the
// command: the rest of its messages is skipped (see discardAppendRest).
func (c *Conn) readAppendMessage(dec *imapwire.Decoder, options *imap.AppendOptions, st *appendState) ([]byte, error) {
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
			data, err := c.readAppendLiteral(dec, st, 0)
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
			return c.readCatenate(dec, st)
		default:
			return nil, newClientBugError("Unknown APPEND data extension")
		}
	}
	return c.readAppendLiteral(dec, st, 0)
}

// readAppendLiteral reads a message literal (or a CATENATE text part
// after part bytes) whole, or refuses it.
func (c *Conn) readAppendLiteral(dec *imapwire.Decoder, st *appendState, part int64) ([]byte, error) {
	lit, nonSync, err := dec.ExpectLiteralReader()
	if err != nil {
		return nil, err
	}
	refused := st.authErr
	switch {
	case refused != nil:
	case part+lit.Size() > st.limit:
		refused = &imap.Error{
			Type: imap.StatusResponseTypeNo,
			Code: imap.ResponseCodeTooBig,
			Text: fmt.Sprintf("Literals are limited to %v bytes for this command", st.limit),
		}
	case st.total+part+lit.Size() > st.limit:
		refused = &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeTooBig,
			Text: fmt.Sprintf("The messages of one APPEND are limited to %v bytes in all: append fewer at a time", st.limit)}
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
	// Grown as the bytes come, not reserved from the announced size.
	buf := bytes.NewBuffer(make([]byte, 0, min(lit.Size(), 64<<10)))
	// To io.EOF, which hands the line back to the decoder.
	if _, err := io.Copy(buf, lit); err != nil || int64(buf.Len()) != lit.Size() {
		// Cut short (the client went away, or stalled past the read
		// timeout): nothing is stored, and what follows is no command
		// line.
		if err == nil {
			err = io.ErrUnexpectedEOF
		}
		c.state = imap.ConnStateLogout
		return nil, fmt.Errorf("APPEND literal cut short after %d of %d bytes: %w", buf.Len(), lit.Size(), err)
	}
	return buf.Bytes(), nil
}

// discardAppendRest skips what is left of an APPEND after a refusal:
// further messages whose non-synchronizing literals the client sends
// without waiting (RFC 7888 §4). A synchronizing literal ends the line
// unsent (the client reads the tagged answer instead of "+"). It stops at
// the end of the line, or at what does not parse (left to the line's
// discarding, which the decoder bounds).
func (c *Conn) discardAppendRest(dec *imapwire.Decoder) {
	for {
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

// BadURL is the refusal of a CATENATE URL part: NO [BADURL url] (RFC
// 4469 §6: the code's argument is the URL as text, without "]").
func BadURL(url, why string) error {
	return &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCode("BADURL " + urlRespText(url)), Text: why}
}

// urlRespText makes a URL a url-resp-text: TEXT-CHARs but "]"; what a
// response code cannot hold is dropped, as the code only names the URL.
func urlRespText(url string) string {
	var b strings.Builder
	for i := 0; i < len(url) && b.Len() < 1024; i++ {
		if ch := url[i]; ch > 0x20 && ch < 0x7f && ch != ']' {
			b.WriteByte(ch)
		}
	}
	return b.String()
}

// readCatenate reads "(" cat-part *(SP cat-part) ")", each part a TEXT
// literal, a UTF8 literal8 (RFC 6855 §4) or a URL the session resolves,
// and returns the message they make. A URL is resolved as it comes, so a
// bad one is answered before the client sends more (RFC 4469 §5).
func (c *Conn) readCatenate(dec *imapwire.Decoder, st *appendState) ([]byte, error) {
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
			data, err := c.readAppendLiteral(dec, st, int64(len(msg)))
			if err != nil {
				return nil, err
			}
			msg = append(msg, data...)
		case "UTF8":
			if !dec.ExpectSpecial('(') || !dec.ExpectSpecial('~') {
				return nil, dec.Err()
			}
			data, err := c.readAppendLiteral(dec, st, int64(len(msg)))
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
			err := st.authErr
			st.urls++
			if err == nil && st.urls > maxCatenateURLs {
				err = &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeLimit,
					Text: fmt.Sprintf("One APPEND takes at most %d CATENATE URLs", maxCatenateURLs)}
			}
			var data []byte
			if err == nil {
				data, err = cat.CatenateURL(url)
			}
			if err == nil && st.total+int64(len(msg))+int64(len(data)) > st.limit {
				err = &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeTooBig,
					Text: fmt.Sprintf("The message CATENATE makes is over the limit of %v bytes", st.limit)}
			}
			if err != nil {
				return nil, c.refuseRest(dec, st, err)
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

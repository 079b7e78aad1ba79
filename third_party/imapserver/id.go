package imapserver

// quill: upstream beta.8 has no server side of ID (RFC 2971); an unknown
// command before login even closes the connection, which broke clients that
// send ID first.

import (
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
)

// maxIDParams bounds the field-value pairs a client may send in ID (RFC 2971
// §3.3 allows at most 30).
const maxIDParams = 30

func (c *Conn) handleID(dec *imapwire.Decoder) error {
	if !dec.ExpectSP() {
		return dec.Err()
	}
	var client []string
	isList, err := dec.List(func() error {
		// RFC 2971 asks for strings; atoms are accepted too, as other
		// servers do, since clients (imaplib2's self-test) send them.
		var k, v string
		if !dec.ExpectAString(&k) || !dec.ExpectSP() || !dec.ExpectAString(&v) {
			return dec.Err()
		}
		if v == "NIL" {
			v = ""
		}
		client = append(client, k, v)
		if len(client) > 2*maxIDParams {
			return newClientBugError("ID: too many fields (RFC 2971 allows 30)")
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !isList && !dec.ExpectNIL() {
		return dec.Err()
	}
	if !dec.ExpectCRLF() {
		return dec.Err()
	}
	if s, ok := c.session.(SessionID); ok {
		s.ClientID(client)
	}

	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("ID").SP()
	id := c.server.options.ServerID
	if len(id) < 2 {
		enc.NIL()
	} else {
		enc.List(len(id)/2, func(i int) {
			enc.String(id[2*i]).SP()
			if v := id[2*i+1]; v == "" {
				enc.NIL()
			} else {
				enc.String(v)
			}
		})
	}
	return enc.CRLF()
}

// SessionID is a session that wants to know what the client said about
// itself in ID (key, value pairs; keys are case-insensitive).
type SessionID interface {
	ClientID(fields []string)
}

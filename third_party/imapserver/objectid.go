package imapserver

// quill: OBJECTID (RFC 8474), which upstream beta.8 neither parses nor
// writes: MAILBOXID in SELECT/EXAMINE, CREATE and STATUS (also LIST RETURN
// STATUS), the EMAILID and THREADID fetch items (fetch.go) and search keys
// (search.go). The ids are the session's (SessionObjectID, and the
// FetchWriter for messages).

import (
	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
)

// SessionObjectID is a session that supports OBJECTID: MailboxID returns a
// mailbox's id (RFC 8474 §4: 1-255 letters, digits, "-" or "_", kept
// across RENAME, never given to another mailbox), or "" if it has none.
type SessionObjectID interface {
	Session
	MailboxID(mailbox string) (string, error)
}

// The EMAILID and THREADID search keys (RFC 8474 §6) travel in
// imap.SearchCriteria as header criteria under these keys, which no
// header field can have (they hold a NUL): the criteria type has no field
// for them.
const (
	SearchKeyEmailID  = "\x00EMAILID"
	SearchKeyThreadID = "\x00THREADID"
)

// mailboxID asks the session for a mailbox's id; "" when it does not
// support OBJECTID or has none.
func (c *Conn) mailboxID(mailbox string) string {
	so, ok := c.session.(SessionObjectID)
	if !ok {
		return ""
	}
	id, err := so.MailboxID(mailbox)
	if err != nil {
		// The command itself succeeded: it answers without the id
		// rather than fail, and the cause goes to the log.
		c.server.logger().Printf("MAILBOXID of %q: %v", mailbox, err)
		return ""
	}
	if !ValidObjectID(id) {
		c.server.logger().Printf("MAILBOXID of %q: %q is not an object id", mailbox, id)
		return ""
	}
	return id
}

func (c *Conn) writeMailboxID(id string) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("OK").SP()
	enc.Special('[').Atom("MAILBOXID").SP().Special('(').Atom(id).Special(')').Special(']')
	enc.SP().Text("Ok")
	return enc.CRLF()
}

// ValidObjectID reports whether s is an objectid (RFC 8474 §7).
func ValidObjectID(s string) bool {
	if len(s) == 0 || len(s) > 255 {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// readObjectID reads an objectid search argument.
func readObjectID(dec *imapwire.Decoder) (string, error) {
	var id string
	if !dec.ExpectSP() || !dec.ExpectAtom(&id) {
		return "", dec.Err()
	}
	if !ValidObjectID(id) {
		return "", newClientBugError("not an object id")
	}
	return id, nil
}

// objectIDCriterion is the header criterion a search key stands for.
func objectIDCriterion(key, id string) imap.SearchCriteriaHeaderField {
	return imap.SearchCriteriaHeaderField{Key: key, Value: id}
}

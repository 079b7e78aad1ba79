package mailbox

import (
	"github.com/quillmail/quill/internal/replica"
)

// Census is one message record as a stopped node's store holds it, with
// the object record beside it: what the fault harness reads from each
// node's store after a run to say which copies exist where (replica.Scan
// leaves out records without replicas, and a tombstone is no record).
type Census struct {
	User    string
	Message Message
	// Stamp is the object record's version; Body whether the bytes are
	// here.
	Stamp replica.Stamp
	Body  bool
}

// Census calls fn for every message record this store holds.
func (m *Manager) Census(fn func(c Census) error) error {
	return m.eachRecord(func(user string, v []byte) error {
		c := Census{User: user}
		if err := decodeMessage(v, &c.Message); err != nil {
			return err
		}
		var rec objectRecord
		if _, err := getJSON(m.db, objectKey(c.User, c.Message.ID), &rec); err != nil {
			return err
		}
		c.Stamp = rec.Stamp
		has, err := m.hasBody(m.db, c.User, c.Message.ID)
		if err != nil {
			return err
		}
		c.Body = has
		return fn(c)
	})
}

// Tombstone reports whether this store keeps a record of the object
// without the message (dropped or expunged here), and its stamp.
func (m *Manager) Tombstone(user, id string) (replica.Stamp, bool, error) {
	var rec objectRecord
	ok, err := getJSON(m.db, objectKey(user, id), &rec)
	if err != nil || !ok {
		return replica.Stamp{}, false, err
	}
	return rec.Stamp, rec.Deleted, nil
}

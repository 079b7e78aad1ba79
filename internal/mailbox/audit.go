package mailbox

import (
	"encoding/binary"
	"hash/fnv"

	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/replica"
)

// What a fragment tells the writers' anti-entropy audit (usermgr/audit.go):
// the users it holds mail of in some buckets, and per mailbox a digest of
// its messages (how many, and an order-independent hash of each message's
// id and version) that the writer compares with its view; on a mismatch
// the writer asks for the list itself. A digest costs one pass over the
// mailbox's index records and a few bytes on the wire.

// AuditBox names a mailbox of a user to digest.
type AuditBox struct {
	User        string `json:"user"`
	UIDValidity uint32 `json:"v"`
}

// AuditRequest asks a node about its fragments.
type AuditRequest struct {
	// Buckets: list the users with fragments in these buckets.
	Buckets []uint8 `json:"buckets,omitempty"`
	// Users: list those of these users that have messages here (a
	// manager asking whether a node may leave a user's mail map, and the
	// admin API's user view).
	Users []string `json:"users,omitempty"`
	// Boxes: digest these mailboxes; with List, list their messages.
	Boxes []AuditBox `json:"boxes,omitempty"`
	List  bool       `json:"list,omitempty"`
	// Before leaves out of digests the messages whose version is not
	// older than this clock reading (0: none left out): both sides leave
	// out the same recent changes, so replication in progress does not
	// look like a difference.
	Before hlc.Timestamp `json:"before,omitempty"`
}

// AuditMsg is one message of a fragment as the audit compares it.
type AuditMsg struct {
	UID     uint32        `json:"uid"`
	ID      string        `json:"id"`
	Version replica.Stamp `json:"version"`
}

// AuditDigest is one mailbox's fragment.
type AuditDigest struct {
	AuditBox
	Count    int        `json:"count"`
	Hash     uint64     `json:"hash"`
	Messages []AuditMsg `json:"messages,omitempty"`
}

// AuditReply is a node's answer.
type AuditReply struct {
	Users []string      `json:"users,omitempty"`
	Boxes []AuditDigest `json:"boxes,omitempty"`
	// UsersAnswered: the request's Users were looked up. A node older
	// than the field leaves it false, and its empty Users then do not
	// mean it holds no mail of them (a mail map must never lose a holder).
	UsersAnswered bool `json:"users_answered,omitempty"`
}

// DigestHash is one message's share of a digest: XORed over a mailbox's
// messages, so the writer computes the same value from its view in any
// order.
func DigestHash(id string, v replica.Stamp) uint64 {
	h := fnv.New64a()
	h.Write([]byte(id))
	var b [9]byte
	binary.BigEndian.PutUint64(b[1:], uint64(v.Clock))
	h.Write(b[:])
	h.Write([]byte(v.Node))
	return h.Sum64()
}

// Audit answers an audit request from this node's store.
func (m *Manager) Audit(req *AuditRequest) (*AuditReply, error) {
	out := &AuditReply{}
	for _, b := range req.Buckets {
		if err := m.FragmentUsers(int(b), func(user string, n int) error {
			if n > 0 {
				out.Users = append(out.Users, user)
			}
			return nil
		}); err != nil {
			return nil, err
		}
	}
	out.UsersAnswered = len(req.Users) > 0
	for _, u := range req.Users {
		held, err := m.HoldsMail(u)
		if err != nil {
			return nil, err
		}
		if held {
			out.Users = append(out.Users, u)
		}
	}
	for _, box := range req.Boxes {
		d, err := m.auditBox(box, req.List, req.Before)
		if err != nil {
			return nil, err
		}
		out.Boxes = append(out.Boxes, *d)
	}
	return out, nil
}

func (m *Manager) auditBox(box AuditBox, list bool, before hlc.Timestamp) (*AuditDigest, error) {
	out := &AuditDigest{AuditBox: box}
	t := &tx{m: m, b: m.db.NewIndexedBatch()}
	defer t.abort()
	mb, err := m.fragmentByValidity(t, box.User, box.UIDValidity)
	if err != nil || mb == nil {
		return out, err
	}
	it, err := m.db.PrefixIter(nil, messagePrefix(box.User, mb.ID))
	if err != nil {
		return nil, err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		msg := Message{UID: binary.BigEndian.Uint32(k[len(k)-4:])}
		if err := decodeMessage(it.Value(), &msg); err != nil {
			continue // a damaged record: the writer's load reports it
		}
		if before != 0 && msg.Version.Clock >= before {
			continue
		}
		out.Count++
		out.Hash ^= DigestHash(msg.ID, msg.Version)
		if list {
			out.Messages = append(out.Messages, AuditMsg{UID: msg.UID, ID: msg.ID, Version: msg.Version})
		}
	}
	return out, it.Error()
}

package imap

import "sync"

// recentTracker decides which session is the first to learn of a message,
// the one that sees it with \Recent (RFC 3501 §2.3.2). It keeps, per
// mailbox, the highest UID already announced to some read-write session.
// This is soft state of one node; see the package comment.
type recentTracker struct {
	mu      sync.Mutex
	claimed map[recentKey]uint32
}

type recentKey struct {
	user string
	mbox uint64
}

func newRecentTracker() *recentTracker {
	return &recentTracker{claimed: map[recentKey]uint32{}}
}

// claim returns the first UID that is recent for a session that now sees
// every message up to maxUID: messages with UID >= the result are recent to
// it. A read-write session takes them (RFC 3501 §6.3.2: EXAMINE must not
// make messages lose \Recent, so a read-only one does not).
func (r *recentTracker) claim(user string, mbox uint64, maxUID uint32, readOnly bool) uint32 {
	r.mu.Lock()
	defer r.mu.Unlock()
	k := recentKey{user, mbox}
	first := r.claimed[k] + 1
	if !readOnly && maxUID > r.claimed[k] {
		r.claimed[k] = maxUID
	}
	return first
}

// count returns how many of uids would be recent to a new session (STATUS
// RECENT), without claiming them.
func (r *recentTracker) count(user string, mbox uint64, uids []uint32) uint32 {
	r.mu.Lock()
	c := r.claimed[recentKey{user, mbox}]
	r.mu.Unlock()
	n := uint32(0)
	for _, u := range uids {
		if u > c {
			n++
		}
	}
	return n
}

// forget drops the state of a deleted mailbox.
func (r *recentTracker) forget(user string, mbox uint64) {
	r.mu.Lock()
	delete(r.claimed, recentKey{user, mbox})
	r.mu.Unlock()
}

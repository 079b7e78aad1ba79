package guard

import (
	"sync"
	"time"
)

// SendWindow is the period a user's sending limit counts over.
const SendWindow = time.Hour

// Sends counts the messages each user submitted in the last SendWindow,
// on this node and (through Note, from the cluster's notices) on the
// others, and says when a user has reached their limit: a stolen password
// or a compromised client is not turned into a spam cannon.
type Sends struct {
	limit int
	mu    sync.Mutex
	// at holds, per user, the times of their recent messages, oldest
	// first, at most limit of them (more cannot change a decision).
	at map[string][]time.Time
}

// NewSends returns a counter allowing limit messages per user and window;
// 0 or less allows everything.
func NewSends(limit int) *Sends { return &Sends{limit: limit, at: map[string][]time.Time{}} }

// Limit is the number of messages allowed per window.
func (s *Sends) Limit() int { return s.limit }

// Allow reports whether user may submit one more message now, and how
// many they sent in the window.
func (s *Sends) Allow(user string, now time.Time) (bool, int) {
	if s.limit <= 0 {
		return true, 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.prune(user, now))
	return n < s.limit, n
}

// Take counts a message user is about to submit at now, if the limit
// allows one more, and reports whether it did and how many they sent in
// the window before it. Check and count are one step, so sessions of the
// same user in parallel cannot all pass a check made before any of them
// counted; Undo takes the count back if the message is not accepted.
func (s *Sends) Take(user string, now time.Time) (bool, int) {
	if s.limit <= 0 {
		return true, 0
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	n := len(s.prune(user, now))
	if n >= s.limit {
		return false, n
	}
	s.noteLocked(user, now)
	return true, n
}

// Undo takes back a count Take made at at.
func (s *Sends) Undo(user string, at time.Time) {
	if s.limit <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	ts := s.at[user]
	for i := len(ts) - 1; i >= 0; i-- {
		if ts[i].Equal(at) {
			s.at[user] = append(ts[:i:i], ts[i+1:]...)
			return
		}
	}
}

// Note records a message user submitted at a time (here or on another
// node).
func (s *Sends) Note(user string, at time.Time) {
	if s.limit <= 0 {
		return
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.noteLocked(user, at)
}

func (s *Sends) noteLocked(user string, at time.Time) {
	ts := s.prune(user, time.Now())
	i := len(ts)
	for i > 0 && ts[i-1].After(at) {
		i--
	}
	ts = append(ts, time.Time{})
	copy(ts[i+1:], ts[i:])
	ts[i] = at
	if len(ts) > s.limit {
		ts = ts[len(ts)-s.limit:]
	}
	s.at[user] = ts
	if len(s.at) > maxTracked {
		s.sweep(time.Now())
	}
}

// maxTracked bounds the users tracked before a sweep of the idle ones.
const maxTracked = 100000

// prune drops a user's times older than the window; s.mu is held.
func (s *Sends) prune(user string, now time.Time) []time.Time {
	ts := s.at[user]
	cut := 0
	for cut < len(ts) && now.Sub(ts[cut]) >= SendWindow {
		cut++
	}
	ts = ts[cut:]
	if len(ts) == 0 {
		delete(s.at, user)
		return nil
	}
	s.at[user] = ts
	return ts
}

func (s *Sends) sweep(now time.Time) {
	for u := range s.at {
		s.prune(u, now)
	}
}

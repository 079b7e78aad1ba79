package mailbox

import "sync"

// Notifier lets sessions learn about changes made by other sessions: IMAP
// IDLE and the untagged updates sent between commands. A subscriber that
// falls behind loses events, not the change itself: it re-reads the mailbox
// on the next event or command.
type Notifier struct {
	mu   sync.Mutex
	subs map[string]map[*subscription]struct{}
}

type subscription struct {
	ch chan Change
}

// subscriberBuffer is how many changes a slow subscriber may fall behind
// before further events are dropped for it.
const subscriberBuffer = 64

// Subscribe returns a channel of changes to the user's mail and a function
// that ends the subscription.
func (n *Notifier) Subscribe(user string) (<-chan Change, func()) {
	s := &subscription{ch: make(chan Change, subscriberBuffer)}
	n.mu.Lock()
	if n.subs == nil {
		n.subs = map[string]map[*subscription]struct{}{}
	}
	if n.subs[user] == nil {
		n.subs[user] = map[*subscription]struct{}{}
	}
	n.subs[user][s] = struct{}{}
	n.mu.Unlock()
	return s.ch, func() {
		n.mu.Lock()
		delete(n.subs[user], s)
		if len(n.subs[user]) == 0 {
			delete(n.subs, user)
		}
		n.mu.Unlock()
	}
}

// Publish tells the user's subscribers about a change.
func (n *Notifier) Publish(c Change) {
	n.mu.Lock()
	defer n.mu.Unlock()
	for s := range n.subs[c.User] {
		select {
		case s.ch <- c:
		default:
		}
	}
}

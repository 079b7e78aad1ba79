package mailbox

// Subscriptions let sessions learn about changes made by other sessions on
// this node: IMAP IDLE and the untagged updates sent between commands. A
// subscriber that falls behind loses events, not the change itself: it
// re-reads the mailbox on the next event or command.

type subscription struct {
	ch chan Change
}

// subscriberBuffer is how many changes a slow subscriber may fall behind
// before further events are dropped for it.
const subscriberBuffer = 64

// Subscribe returns a channel of changes to the user's mail and a function
// that ends the subscription.
func (m *Manager) Subscribe(user string) (<-chan Change, func()) {
	s := &subscription{ch: make(chan Change, subscriberBuffer)}
	m.subMu.Lock()
	if m.subs[user] == nil {
		m.subs[user] = map[*subscription]struct{}{}
	}
	m.subs[user][s] = struct{}{}
	m.subMu.Unlock()
	return s.ch, func() {
		m.subMu.Lock()
		delete(m.subs[user], s)
		if len(m.subs[user]) == 0 {
			delete(m.subs, user)
		}
		m.subMu.Unlock()
	}
}

func (m *Manager) publish(c Change) {
	m.subMu.Lock()
	defer m.subMu.Unlock()
	for s := range m.subs[c.User] {
		select {
		case s.ch <- c:
		default:
		}
	}
}

package writer

import "time"

// A loaded mailbox view holds every message of the mailbox (about 300
// bytes each), and a node manages the writers of a growing number of
// users: without a limit its memory grows with every mailbox anyone opened
// or was delivered to since it started (1,000 users of 100 messages held
// 30 MB). A view unused for viewIdle is let go; its next use loads it from
// the fragments again, as after a restart. The counters, allocations in
// flight and recent removals stay: they are what a reload cannot rebuild.
const (
	// viewIdle is how long a user's writer must go unused before its
	// views are let go: far longer than a client's pause between commands
	// or a polling client's interval, so an active mailbox is not loaded
	// over and over.
	viewIdle = 5 * time.Minute
	// viewSweep is how often idle views are looked for.
	viewSweep = time.Minute
)

// sweepViews lets idle views go every viewSweep until Close.
func (m *Manager) sweepViews() {
	t := time.NewTicker(viewSweep)
	defer t.Stop()
	for {
		select {
		case <-m.ctx.Done():
			return
		case <-t.C:
		}
		m.DropIdleViews(viewIdle)
	}
}

// DropIdleViews lets go of the loaded views of the users whose writer has
// not been used for idle, and returns how many it let go. A writer busy
// now is skipped (it is not idle); so is a view with an allocation in
// flight, whose confirmation is on its way.
func (m *Manager) DropIdleViews(idle time.Duration) int {
	before := time.Now().Add(-idle)
	m.mu.Lock()
	var ws []*userWriter
	for _, users := range m.writers {
		for _, w := range users {
			ws = append(ws, w)
		}
	}
	m.mu.Unlock()
	dropped := 0
	for _, w := range ws {
		if !w.mu.TryLock() {
			continue
		}
		if !w.used.After(before) {
			for _, b := range w.boxes {
				if b.loaded && len(b.inflight) == 0 {
					b.msgs, b.loaded, b.holders = nil, false, nil
					dropped++
				}
			}
		}
		w.mu.Unlock()
	}
	return dropped
}

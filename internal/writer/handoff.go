package writer

// The writer's half of handing a bucket over (the user manager's half, and
// why, is in internal/usermgr/handoff.go). When a bucket moves away its
// writers are fenced and drained, and their state goes to the next manager's
// writers: UID and MODSEQ counters, the allocations still in flight, and
// the writer's own reservation, which the next writer continues.

import (
	"fmt"
	"time"

	"github.com/quillmail/quill/internal/cluster"
)

// handoffRecent is how recently a writer must have been used for its state
// to travel in a handoff: the next manager's scans, taken after the drain,
// already show everything older.
const handoffRecent = 10 * time.Minute

// BoxState is the writer's state of one mailbox.
type BoxState struct {
	UIDValidity uint32       `json:"v"`
	UIDNext     uint32       `json:"uidnext"`
	ModSeq      uint64       `json:"modseq"`
	Inflight    []Allocation `json:"inflight,omitempty"`
	// ReservedUID and ReservedModSeq are the reserved ends the writer
	// wrote into the profile itself: the next writer may go on inside
	// that block (this one is fenced) instead of skipping past it.
	ReservedUID    uint32 `json:"reserved_uid,omitempty"`
	ReservedModSeq uint64 `json:"reserved_modseq,omitempty"`
}

// Allocation is a UID handed out and not yet confirmed or cancelled.
type Allocation struct {
	UID  uint32         `json:"uid"`
	Age  time.Duration  `json:"age"`
	From cluster.Member `json:"from"`
	at   time.Time      // when it was made, for Age at sending time
}

// UserState is one user's writer state.
type UserState struct {
	User  string     `json:"user"`
	Boxes []BoxState `json:"boxes,omitempty"`
}

// Aged returns the state with every allocation's Age measured now (it may
// wait a while between the drain and its sending).
func (us UserState) Aged() UserState {
	boxes := make([]BoxState, len(us.Boxes))
	for i, b := range us.Boxes {
		fl := make([]Allocation, len(b.Inflight))
		for j, a := range b.Inflight {
			a.Age = time.Since(a.at)
			fl[j] = a
		}
		b.Inflight = fl
		boxes[i] = b
	}
	us.Boxes = boxes
	return us
}

// Open starts the writers of a bucket the user manager took in a new
// tenure. The user manager calls it with its own lock held.
func (m *Manager) Open(b uint8, tenure uint64) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.tenure[b] = tenure
	m.writers[b] = map[string]*userWriter{}
	m.store.Opened(b)
	if m.redo != nil {
		m.redo.opened(b)
	}
}

// Dropped are the writers of a bucket that moved away, to be drained.
type Dropped struct {
	writers map[string]*userWriter
	// drained tells the writer the drain is over.
	drained func()
}

// Drop closes a bucket that moved away: no writer of it is handed out any
// more. The user manager calls it with its own lock held; Drain does the
// waiting.
func (m *Manager) Drop(b uint8) Dropped {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.draining[b]++
	d := Dropped{writers: m.writers[b], drained: func() {
		m.mu.Lock()
		m.draining[b]--
		m.mu.Unlock()
	}}
	m.tenure[b], m.writers[b] = 0, nil
	return d
}

// Drain waits for the operations in progress on the dropped writers, fences
// them (an operation that takes a writer's lock later is sent to the new
// manager), and returns the state of those used recently.
func (d Dropped) Drain() []UserState {
	if d.drained != nil {
		defer d.drained()
	}
	var out []UserState
	for u, w := range d.writers {
		w.mu.Lock()
		w.dead = true
		if time.Since(w.used) < handoffRecent {
			us := UserState{User: u}
			for v, b := range w.boxes {
				bs := BoxState{UIDValidity: v, UIDNext: b.uidNext, ModSeq: b.modseq,
					ReservedUID: b.mineUID, ReservedModSeq: b.mineMod}
				for uid, a := range b.inflight {
					bs.Inflight = append(bs.Inflight, Allocation{UID: uid, From: a.from, at: a.at})
				}
				us.Boxes = append(us.Boxes, bs)
			}
			out = append(out, us)
		}
		w.mu.Unlock()
	}
	return out
}

// Reset forgets, in a bucket rebuilt from scratch because its soft state was
// stale (a pause), the allocations in flight made before cutoff by this
// node (not those a handoff brought): the deliveries they were made for
// confirmed to whoever managed the bucket meanwhile, or gave up, and each
// would hide every higher UID until allocTimeout. The views load again
// (the user manager moved the bucket's view generation) and show what was
// stored.
func (m *Manager) Reset(b uint8, cutoff time.Time) {
	m.mu.Lock()
	ws := make([]*userWriter, 0, len(m.writers[b]))
	for _, w := range m.writers[b] {
		ws = append(ws, w)
	}
	m.mu.Unlock()
	if len(ws) == 0 {
		return
	}
	m.spawn(func() {
		for _, w := range ws {
			w.mu.Lock()
			for _, bx := range w.boxes {
				for uid, a := range bx.inflight {
					if !a.handed && a.at.Before(cutoff) {
						delete(bx.inflight, uid)
						bx.partial, bx.loadedAt = true, time.Time{}
					}
				}
			}
			w.mu.Unlock()
		}
	})
}

// Take merges the previous manager's writer state of a user into the user's
// writer here: counters, its reservation (continued if this writer has
// reserved nothing yet) and its allocations in flight (unless this writer
// has seen them settled: a confirmation may overtake the handoff).
func (m *Manager) Take(b uint8, us UserState) error {
	m.mu.Lock()
	if m.writers[b] == nil {
		m.mu.Unlock()
		return fmt.Errorf("bucket %d not managed here", b)
	}
	w := m.writers[b][us.User]
	if w == nil {
		w = newUserWriter()
		m.writers[b][us.User] = w
	}
	m.mu.Unlock()
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, bs := range us.Boxes {
		bx := w.boxes[bs.UIDValidity]
		if bx == nil {
			bx = &boxView{inflight: map[uint32]allocation{}}
			w.boxes[bs.UIDValidity] = bx
		}
		bx.continueFrom(counters{uidNext: bs.UIDNext, modseq: bs.ModSeq, mineUID: bs.ReservedUID, mineMod: bs.ReservedModSeq})
		for _, a := range bs.Inflight {
			_, flying := bx.inflight[a.UID]
			_, settled := bx.settled[a.UID]
			_, stored := bx.msgs[a.UID]
			if !flying && !settled && !stored {
				bx.inflight[a.UID] = allocation{at: time.Now().Add(-a.Age), from: a.From, handed: true}
			}
		}
	}
	return nil
}

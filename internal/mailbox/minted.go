package mailbox

import "sync"

// mintedIDs holds the message ids NewMessageID handed out that no Apply on
// this node has seen yet. An id is a time and 64 random bits, never used
// before, so no object under it can exist here until its first Apply: a
// new delivery is stored without reading what it would replace (the object
// record and the body it would overwrite), the point reads a profile of
// the delivery path showed. Forgetting an id is always safe (its Apply
// then reads as for any update), so the set is bounded by emptying it when
// full: ids of messages placed only on other nodes are never applied here
// and would otherwise stay.
type mintedIDs struct {
	mu  sync.Mutex
	ids map[string]struct{}
}

// maxMinted bounds the set: far more than the deliveries in flight at once
// (each holds its id from minting to its Apply, milliseconds), a few
// hundred kilobytes at most.
const maxMinted = 4096

func (s *mintedIDs) add(id string) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.ids == nil || len(s.ids) >= maxMinted {
		s.ids = make(map[string]struct{}, 64)
	}
	s.ids[id] = struct{}{}
}

// fresh reports, for each object of one Apply, whether it cannot exist
// here yet, and forgets the ids: a later Apply of them reads. An object
// named twice in the same Apply is fresh only the first time (the second
// must see what the first wrote).
func (s *mintedIDs) fresh(objs []*Object) []bool {
	out := make([]bool, len(objs))
	s.mu.Lock()
	defer s.mu.Unlock()
	taken := map[string]bool{}
	seen := map[[2]string]bool{}
	for i, o := range objs {
		ok, known := taken[o.ID]
		if !known {
			_, ok = s.ids[o.ID]
			delete(s.ids, o.ID)
			taken[o.ID] = ok
		}
		k := [2]string{o.User, o.ID}
		out[i] = ok && !seen[k]
		seen[k] = true
	}
	return out
}

package imap

import (
	"fmt"
	"sort"

	"github.com/emersion/go-imap/v2"
)

// Resolving message sets against a session's view. The view is the list of
// UIDs, ascending, that sequence numbers 1..n index.

// maxSetMembers bounds how many messages one set may name after resolution,
// so "1:4294967295" against a huge mailbox cannot make a huge slice; it is
// far above any mailbox the store holds.
const maxSetMembers = 10_000_000

// errBadSeq is returned for a sequence number the client cannot know (RFC
// 9051 §9: seq-number is at most the number of messages in the mailbox).
type errBadSeq struct{ n, max uint32 }

func (e errBadSeq) Error() string {
	if e.max == 0 {
		return fmt.Sprintf("message sequence number %d: the mailbox is empty", e.n)
	}
	return fmt.Sprintf("message sequence number %d is out of range 1:%d", e.n, e.max)
}

// resolveSeqSet returns the 0-based view indexes named by a sequence set, in
// ascending order without duplicates. "*" is the last message (RFC 9051
// §9, seq-number). A number past the end is an error, as is "*" in an empty
// mailbox; lenient makes both match nothing instead (SEARCH).
func resolveSeqSet(set imap.SeqSet, n uint32, lenient bool) ([]int, error) {
	var out []int
	seen := map[uint32]bool{}
	for _, r := range set {
		start, stop := r.Start, r.Stop
		if start == 0 {
			start = n
		}
		if stop == 0 {
			stop = n
		}
		if start > stop {
			start, stop = stop, start
		}
		if start == 0 || stop > n {
			if lenient {
				if start == 0 {
					start = 1
				}
				if stop > n {
					stop = n
				}
				if start > stop {
					continue
				}
			} else {
				bad := stop
				if start == 0 {
					bad = 0
				}
				return nil, errBadSeq{bad, n}
			}
		}
		if uint64(len(out))+uint64(stop-start)+1 > maxSetMembers {
			return nil, fmt.Errorf("message set names more than %d messages", maxSetMembers)
		}
		for i := start; i <= stop; i++ {
			if !seen[i] {
				seen[i] = true
				out = append(out, int(i-1))
			}
			if i == stop { // stop may be MaxUint32
				break
			}
		}
	}
	sort.Ints(out)
	return out, nil
}

// resolveUIDSet returns the 0-based view indexes of the messages whose UID
// is in the set. UIDs not in the view are ignored (RFC 9051 §6.4.9). "*" is
// the highest UID in the view, and a range "n:*" includes it even when n is
// larger (RFC 9051 §6.4.9, RFC 3501 §6.4.8).
func resolveUIDSet(set imap.UIDSet, view []uint32) []int {
	if len(view) == 0 {
		return nil
	}
	last := view[len(view)-1]
	var out []int
	for _, r := range set {
		start, stop := uidRange(r, last)
		lo := sort.Search(len(view), func(i int) bool { return view[i] >= start })
		for i := lo; i < len(view) && view[i] <= stop; i++ {
			out = append(out, i)
		}
	}
	sort.Ints(out)
	return dedupInts(out)
}

// uidRange returns a range's ends in ascending order, "*" being last (so
// "n:*" with n past last is last:n, RFC 9051 §6.4.9).
func uidRange(r imap.UIDRange, last uint32) (lo, hi uint32) {
	lo, hi = uint32(r.Start), uint32(r.Stop)
	if lo == 0 {
		lo = last
	}
	if hi == 0 {
		hi = last
	}
	return min(lo, hi), max(lo, hi)
}

// resolveUIDs returns the view indexes of a list of UIDs (a saved SEARCH
// result, RFC 5182), skipping those no longer in the view.
func resolveUIDs(uids []uint32, view []uint32) []int {
	var out []int
	for _, u := range uids {
		i := sort.Search(len(view), func(i int) bool { return view[i] >= u })
		if i < len(view) && view[i] == u {
			out = append(out, i)
		}
	}
	sort.Ints(out)
	return dedupInts(out)
}

func dedupInts(s []int) []int {
	if len(s) < 2 {
		return s
	}
	j := 1
	for i := 1; i < len(s); i++ {
		if s[i] != s[j-1] {
			s[j] = s[i]
			j++
		}
	}
	return s[:j]
}

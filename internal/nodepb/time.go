package nodepb

import "time"

// Nanos encodes a time as nanoseconds since the Unix epoch, 0 for the zero
// time (which UnixNano cannot express).
func Nanos(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.UnixNano()
}

// Time decodes Nanos, in the local zone: the zone a fragment read from
// this node's own disk comes back in, so that one mailbox shows every
// INTERNALDATE with the same offset whichever node its message came from.
func Time(n int64) time.Time {
	if n == 0 {
		return time.Time{}
	}
	return time.Unix(0, n)
}

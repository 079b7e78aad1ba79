package migrate

// FlagChange sets the flags of a message already at the destination to
// those it has at the source.
type FlagChange struct {
	UID   uint32
	Flags []string
}

// Plan is what a run does to one folder.
type Plan struct {
	// Append are the source's messages the destination lacks, as indexes
	// into the source's list, in the source's order (so UIDs follow it).
	Append []int
	// Flags are the destination's messages whose flags differ from their
	// source's.
	Flags []FlagChange
	// Same counts the source's messages already at the destination with
	// the same flags.
	Same int
}

// Decide says what copying the folder src onto dst needs (imapsync's
// rule): a source message is at the destination when a destination
// message has its key; keys are matched as a multiset, so two copies at
// the source need two at the destination. A message found with other
// flags gets the source's flags (the source wins, as imapsync's flag
// resync). Messages only at the destination are left alone: an import
// adds, it never deletes. Each side is taken in its own order (the
// destination's by UID), so of several copies the earliest pair first.
func Decide(src, dst []Item) Plan {
	var p Plan
	waiting := map[string][]int{} // key -> indexes into dst not yet matched
	for i, d := range dst {
		waiting[d.Key] = append(waiting[d.Key], i)
	}
	for i, s := range src {
		q := waiting[s.Key]
		if len(q) == 0 {
			p.Append = append(p.Append, i)
			continue
		}
		d := dst[q[0]]
		waiting[s.Key] = q[1:]
		if SameFlags(s.Flags, d.Flags) {
			p.Same++
			continue
		}
		p.Flags = append(p.Flags, FlagChange{UID: d.UID, Flags: CleanFlags(s.Flags)})
	}
	return p
}

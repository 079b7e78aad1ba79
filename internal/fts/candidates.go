package fts

import "strings"

// Index is what Candidates reads: one user's terms by field, and the
// documents (small numbers the index gives messages) that hold each.
type Index interface {
	Terms(field string) ([]string, error)
	Postings(field, term string) ([]uint32, error)
}

// maxTermsPerToken: a needle token found in more terms than this (a single
// letter, a common prefix) narrows little and costs a union of that many
// postings; it is not used to narrow.
const maxTermsPerToken = 4096

// Candidates returns the documents that may match q: every document that
// matches holds, in one of q's fields, a term containing the needle (whole
// fields) or, for each token of the needle, a term containing it. ok is
// false when the index cannot narrow q at all.
func Candidates(ix Index, q Query) (docs Bitset, ok bool, err error) {
	for _, f := range q.Fields {
		d, narrowed, err := fieldCandidates(ix, f, q.Needle)
		if err != nil || !narrowed {
			return nil, false, err
		}
		docs.Or(d)
	}
	return docs, true, nil
}

// Sure returns the documents that certainly match q, so SEARCH need not
// read them for it: those holding, in a whole field of q, a value that
// contains the needle. A whole field keeps exactly the values SEARCH
// compares for its key (Terms: each value unfolded, as written and
// decoded, lower-cased), so such a value is the match itself; a value too
// long to keep (LongValue) proves nothing. Token fields prove nothing.
func Sure(ix Index, q Query) (docs Bitset, err error) {
	n := strings.ToLower(q.Needle)
	for _, f := range q.Fields {
		if !Whole(f) {
			continue
		}
		terms, err := ix.Terms(f)
		if err != nil {
			return nil, err
		}
		for _, t := range terms {
			if t != LongValue && strings.Contains(t, n) {
				if err := union(ix, &docs, f, t); err != nil {
					return nil, err
				}
			}
		}
	}
	return docs, nil
}

func fieldCandidates(ix Index, field, needle string) (Bitset, bool, error) {
	terms, err := ix.Terms(field)
	if err != nil {
		return nil, false, err
	}
	if Whole(field) {
		n := strings.ToLower(needle)
		var docs Bitset
		for _, t := range terms {
			if t == LongValue || strings.Contains(t, n) {
				if err := union(ix, &docs, field, t); err != nil {
					return nil, false, err
				}
			}
		}
		return docs, true, nil
	}
	var docs Bitset
	narrowed := false
	for _, tok := range NeedleTokens(needle) {
		var matched []string
		for _, t := range terms {
			if strings.Contains(t, tok) {
				if matched = append(matched, t); len(matched) > maxTermsPerToken {
					break
				}
			}
		}
		if len(matched) > maxTermsPerToken {
			continue
		}
		var these Bitset
		for _, t := range matched {
			if err := union(ix, &these, field, t); err != nil {
				return nil, false, err
			}
		}
		if !narrowed {
			docs, narrowed = these, true
		} else {
			docs.And(these)
		}
		if docs.Empty() {
			break
		}
	}
	return docs, narrowed, nil
}

func union(ix Index, into *Bitset, field, term string) error {
	p, err := ix.Postings(field, term)
	if err != nil {
		return err
	}
	for _, d := range p {
		into.Set(d)
	}
	return nil
}

// Bitset is a set of document numbers.
type Bitset []uint64

// Set adds d.
func (b *Bitset) Set(d uint32) {
	i := int(d >> 6)
	if i >= len(*b) {
		*b = append(*b, make([]uint64, i+1-len(*b))...)
	}
	(*b)[i] |= 1 << (d & 63)
}

// Has reports whether d is in the set.
func (b Bitset) Has(d uint32) bool {
	i := int(d >> 6)
	return i < len(b) && b[i]&(1<<(d&63)) != 0
}

// Or adds every member of o.
func (b *Bitset) Or(o Bitset) {
	if len(o) > len(*b) {
		*b = append(*b, make([]uint64, len(o)-len(*b))...)
	}
	for i, w := range o {
		(*b)[i] |= w
	}
}

// And keeps only the members that are also in o.
func (b *Bitset) And(o Bitset) {
	for i := range *b {
		if i < len(o) {
			(*b)[i] &= o[i]
		} else {
			(*b)[i] = 0
		}
	}
}

// Empty reports whether the set has no member.
func (b Bitset) Empty() bool {
	for _, w := range b {
		if w != 0 {
			return false
		}
	}
	return true
}

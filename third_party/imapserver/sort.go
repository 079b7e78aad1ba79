package imapserver

// quill: SORT and THREAD (RFC 5256), SORT=DISPLAY (RFC 5957) and ESORT
// (RFC 5267 §3), none of which upstream beta.8 parses or writes. The
// parsing and the responses are here; the ordering and the threading are
// the session's (SessionSort, SessionThread).

import (
	"fmt"
	"strings"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
)

// SortKey is one key of a sort program (RFC 5256 §3, RFC 5957 §3).
type SortKey string

const (
	SortArrival     SortKey = "ARRIVAL"
	SortCc          SortKey = "CC"
	SortDate        SortKey = "DATE"
	SortFrom        SortKey = "FROM"
	SortSize        SortKey = "SIZE"
	SortSubject     SortKey = "SUBJECT"
	SortTo          SortKey = "TO"
	SortDisplayFrom SortKey = "DISPLAYFROM"
	SortDisplayTo   SortKey = "DISPLAYTO"
)

// SortCriterion is a key and whether REVERSE precedes it.
type SortCriterion struct {
	Key     SortKey
	Reverse bool
}

// ThreadAlgorithm names a THREAD algorithm (RFC 5256 §3).
type ThreadAlgorithm string

const (
	ThreadOrderedSubject ThreadAlgorithm = "ORDEREDSUBJECT"
	ThreadReferences     ThreadAlgorithm = "REFERENCES"
)

// Thread is a node of a THREAD answer: a message and the threads that
// answer it. Num 0 is a message that is not there (a dummy parent of
// several threads).
type Thread struct {
	Num      uint32
	Children []Thread
}

// SessionSort is a session that supports SORT (RFC 5256) and ESORT
// (RFC 5267): it returns the numbers (sequence numbers or UIDs, by kind)
// of the messages that match criteria, in the order of the sort program,
// and, when criteria has a MODSEQ key, each one's mod-sequence (RFC 7162
// §3.1.5), else nil.
type SessionSort interface {
	Session
	Sort(kind NumKind, program []SortCriterion, criteria *imap.SearchCriteria) (nums []uint32, modSeqs []uint64, err error)
}

// SessionThread is a session that supports THREAD (RFC 5256).
type SessionThread interface {
	Session
	Thread(kind NumKind, algorithm ThreadAlgorithm, criteria *imap.SearchCriteria) ([]Thread, error)
}

// maxSortKeys bounds a sort program: each key is one comparison per pair
// of messages, and no real client sends more than a few.
const maxSortKeys = 16

func (c *Conn) handleSort(tag string, dec *imapwire.Decoder, numKind NumKind) error {
	if !dec.ExpectSP() {
		return dec.Err()
	}
	var (
		options  imap.SearchOptions
		ext      searchReturnExt
		extended bool
		atom     string
	)
	if dec.Atom(&atom) {
		if !strings.EqualFold(atom, "RETURN") {
			return newClientBugError("SORT takes a sort program in parentheses")
		}
		if err := readSortReturnOpts(dec, &options, &ext); err != nil {
			return fmt.Errorf("in sort-return-opts: %w", err)
		}
		if !dec.ExpectSP() {
			return dec.Err()
		}
		extended = true
	}
	var program []SortCriterion
	reverse := false
	err := dec.ExpectList(func() error {
		var key string
		if !dec.ExpectAtom(&key) {
			return dec.Err()
		}
		key = strings.ToUpper(key)
		if key == "REVERSE" {
			if reverse {
				return newClientBugError("REVERSE twice in a row")
			}
			reverse = true
			return nil
		}
		switch k := SortKey(key); k {
		case SortArrival, SortCc, SortDate, SortFrom, SortSize, SortSubject, SortTo, SortDisplayFrom, SortDisplayTo:
			if len(program) == maxSortKeys {
				return newClientBugError("too many sort keys")
			}
			program = append(program, SortCriterion{Key: k, Reverse: reverse})
			reverse = false
			return nil
		}
		return newClientBugError("unknown sort key " + key)
	})
	if err != nil {
		return err
	}
	if reverse || len(program) == 0 {
		return newClientBugError("REVERSE must precede a sort key, and the program needs one")
	}
	criteria, err := readCharsetAndKeys(dec)
	if err != nil {
		return err
	}
	if err := c.checkState(imap.ConnStateSelected); err != nil {
		return err
	}
	ss, ok := c.session.(SessionSort)
	if !ok {
		return newClientBugError("SORT is not supported")
	}
	if err := c.checkContextTag(tag, &ext); err != nil {
		return err
	}
	nums, modSeqs, err := ss.Sort(numKind, program, criteria)
	if err != nil {
		return err
	}
	if criteria.ModSeq != nil {
		c.enableCondStore(true)
	}
	if ext.update {
		if err := c.registerContext(tag, numKind, program, criteria, nums); err != nil {
			return err
		}
	}
	if extended {
		return c.writeESort(tag, nums, modSeqs, &options, numKind, ext.partial)
	}
	var modSeq uint64
	for _, m := range modSeqs {
		modSeq = max(modSeq, m)
	}
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("SORT")
	for _, n := range nums {
		enc.SP().Number(n)
	}
	if modSeq != 0 && len(nums) > 0 { // RFC 7162 §3.1.5: sort-data ends with it
		enc.SP().Special('(').Atom("MODSEQ").SP().ModSeq(modSeq).Special(')')
	}
	return enc.CRLF()
}

// readCharsetAndKeys reads the charset and the search keys that end SORT
// and THREAD, where the charset is not optional.
func readCharsetAndKeys(dec *imapwire.Decoder) (*imap.SearchCriteria, error) {
	var charset string
	if !dec.ExpectSP() || !dec.ExpectAString(&charset) || !dec.ExpectSP() {
		return nil, dec.Err()
	}
	if err := checkCharset(charset); err != nil {
		return nil, err
	}
	return readSearchKeys(dec, "")
}

// readSortReturnOpts reads ESORT's return options (RFC 5267 §3.2): those of
// ESEARCH but SAVE, which RFC 5182 defines for SEARCH only.
func readSortReturnOpts(dec *imapwire.Decoder, options *imap.SearchOptions, ext *searchReturnExt) error {
	if err := readSearchReturnOpts(dec, options, ext); err != nil {
		return err
	}
	if options.ReturnSave {
		return newClientBugError("SAVE is not a SORT return option")
	}
	defaultReturnAll(options, ext)
	return nil
}

// writeESort answers SORT RETURN (RFC 5267 §3.2): MIN and MAX are the
// first and the last message in sort order, ALL lists them in that order.
func (c *Conn) writeESort(tag string, nums []uint32, modSeqs []uint64, options *imap.SearchOptions, numKind NumKind, partial *partialRange) error {
	// RFC 7162 §3.1.5: the highest mod-sequence of the messages the
	// answer names: all of them with ALL or COUNT, else MIN's and MAX's.
	var modSeq uint64
	if len(modSeqs) == len(nums) && len(nums) > 0 {
		if options.ReturnAll || options.ReturnCount {
			for _, m := range modSeqs {
				modSeq = max(modSeq, m)
			}
		} else {
			if partial != nil { // quill: the window's (RFC 5267 §4.4)
				lo, hi := partial.bounds(len(modSeqs))
				for _, m := range modSeqs[lo:hi] {
					modSeq = max(modSeq, m)
				}
			}
			if options.ReturnMin {
				modSeq = modSeqs[0]
			}
			if options.ReturnMax {
				modSeq = max(modSeq, modSeqs[len(modSeqs)-1])
			}
		}
	}
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("ESEARCH").SP().Special('(').Atom("TAG").SP().String(tag).Special(')')
	if numKind == NumKindUID {
		enc.SP().Atom("UID")
	}
	if len(nums) > 0 {
		if options.ReturnMin {
			enc.SP().Atom("MIN").SP().Number(nums[0])
		}
		if options.ReturnMax {
			enc.SP().Atom("MAX").SP().Number(nums[len(nums)-1])
		}
		if options.ReturnAll {
			enc.SP().Atom("ALL").SP().Atom(OrderedSet(nums))
		}
	}
	if options.ReturnCount {
		enc.SP().Atom("COUNT").SP().Number(uint32(len(nums)))
	}
	if partial != nil { // quill: RFC 5267 §4.4, in sort order
		enc.SP().Atom("PARTIAL").SP().Atom(partialData(partial, nums, true))
	}
	if modSeq != 0 && len(nums) > 0 { // RFC 7162 §3.1.5 with RFC 4731
		enc.SP().Atom("MODSEQ").SP().ModSeq(modSeq)
	}
	return enc.CRLF()
}

// OrderedSet writes numbers as a sequence-set that keeps their order: a
// run that ascends by one is a range, anything else is listed.
func OrderedSet(nums []uint32) string {
	var b strings.Builder
	for i := 0; i < len(nums); {
		j := i
		for j+1 < len(nums) && nums[j+1] == nums[j]+1 {
			j++
		}
		if b.Len() > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(&b, "%d", nums[i])
		if j > i {
			fmt.Fprintf(&b, ":%d", nums[j])
		}
		i = j + 1
	}
	return b.String()
}

func (c *Conn) handleThread(dec *imapwire.Decoder, numKind NumKind) error {
	var alg string
	if !dec.ExpectSP() || !dec.ExpectAtom(&alg) {
		return dec.Err()
	}
	algorithm := ThreadAlgorithm(strings.ToUpper(alg))
	switch algorithm {
	case ThreadOrderedSubject, ThreadReferences:
	default:
		return newClientBugError("unknown THREAD algorithm " + alg)
	}
	criteria, err := readCharsetAndKeys(dec)
	if err != nil {
		return err
	}
	if err := c.checkState(imap.ConnStateSelected); err != nil {
		return err
	}
	st, ok := c.session.(SessionThread)
	if !ok {
		return newClientBugError("THREAD is not supported")
	}
	threads, err := st.Thread(numKind, algorithm, criteria)
	if err != nil {
		return err
	}
	if criteria.ModSeq != nil {
		c.enableCondStore(true)
	}
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("THREAD")
	if len(threads) > 0 {
		enc.SP().Atom(FormatThreads(threads))
	}
	return enc.CRLF()
}

// FormatThreads writes threads as RFC 5256's thread-lists: a chain of
// single answers is written flat, a message with several answers is
// followed by one list per answer, and a dummy parent writes only its
// answers' lists.
func FormatThreads(threads []Thread) string {
	var b strings.Builder
	for i := range threads {
		writeThread(&b, &threads[i])
	}
	return b.String()
}

func writeThread(b *strings.Builder, t *Thread) {
	b.WriteByte('(')
	first := true
	for {
		if t.Num != 0 {
			if !first {
				b.WriteByte(' ')
			}
			fmt.Fprintf(b, "%d", t.Num)
			first = false
		}
		if len(t.Children) != 1 {
			break
		}
		t = &t.Children[0]
	}
	if len(t.Children) > 1 {
		if !first {
			b.WriteByte(' ')
		}
		for i := range t.Children {
			writeThread(b, &t.Children[i])
		}
	}
	b.WriteByte(')')
}

package imapserver

import (
	"fmt"
	"strings"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
	"github.com/quillmail/quill/third_party/imapserver/internal/wire"
)

func (c *Conn) handleSearch(tag string, dec *imapwire.Decoder, numKind NumKind) error {
	if !dec.ExpectSP() {
		return dec.Err()
	}
	var (
		atom     string
		options  imap.SearchOptions
		ext      searchReturnExt
		extended bool
	)
	if maybeReadSearchKeyAtom(dec, &atom) && strings.EqualFold(atom, "RETURN") {
		if err := readSearchReturnOpts(dec, &options, &ext); err != nil {
			return fmt.Errorf("in search-return-opts: %w", err)
		}
		if !dec.ExpectSP() {
			return dec.Err()
		}
		extended = true
		atom = ""
		maybeReadSearchKeyAtom(dec, &atom)
	}
	if strings.EqualFold(atom, "CHARSET") {
		var charset string
		if !dec.ExpectSP() || !dec.ExpectAString(&charset) || !dec.ExpectSP() {
			return dec.Err()
		}
		if err := checkCharset(charset); err != nil {
			return err
		}
		atom = ""
		maybeReadSearchKeyAtom(dec, &atom)
	}

	criteria, err := readSearchKeys(dec, atom)
	if err != nil {
		return err
	}

	if err := c.checkState(imap.ConnStateSelected); err != nil {
		return err
	}
	if err := c.checkContextTag(tag, &ext); err != nil {
		return err
	}

	// If no return option is specified, ALL is assumed
	defaultReturnAll(&options, &ext)

	// quill: PARTIAL and UPDATE take the whole result list from data.All,
	// which the session fills whatever the options (context.go); the
	// options stay the client's, so SAVE and MODSEQ are as without them.
	data, err := c.session.Search(numKind, criteria, &options)
	if err != nil {
		return err
	}

	if criteria.ModSeq != nil {
		c.enableCondStore(true)
	}
	var partial string
	if ext.partial != nil || ext.update {
		nums := numsOf(data.All)
		if ext.partial != nil {
			partial = partialData(ext.partial, nums, false)
		}
		if ext.update {
			if err := c.registerContext(tag, numKind, nil, criteria, nums); err != nil {
				return err
			}
		}
	}
	if c.enabled.Has(imap.CapIMAP4rev2) || extended {
		return c.writeESearch(tag, data, &options, numKind, partial)
	} else {
		return c.writeSearch(data.All, data.ModSeq)
	}
}

// checkCharset accepts the charsets SEARCH, SORT and THREAD must know
// (RFC 9051 §6.4.4, RFC 5256 §3).
func checkCharset(charset string) error {
	switch strings.ToUpper(charset) {
	case "US-ASCII", "UTF-8":
		return nil
	}
	return &imap.Error{
		Type: imap.StatusResponseTypeNo,
		Code: imap.ResponseCodeBadCharset,
		Text: "Only US-ASCII and UTF-8 are supported charsets",
	}
}

// readSearchKeys reads the search keys that end a SEARCH, SORT or THREAD
// command, and its CRLF; atom is a first key already read. (quill:
// shared by sort.go)
func readSearchKeys(dec *imapwire.Decoder, atom string) (*imap.SearchCriteria, error) {
	var criteria imap.SearchCriteria
	for {
		var err error
		if atom != "" {
			err = readSearchKeyWithAtom(&criteria, dec, atom)
			atom = ""
		} else {
			err = readSearchKey(&criteria, dec)
		}
		if err != nil {
			return nil, fmt.Errorf("in search-key: %w", err)
		}
		if !dec.SP() {
			break
		}
	}
	if !dec.ExpectCRLF() {
		return nil, dec.Err()
	}
	return &criteria, nil
}

func (c *Conn) writeESearch(tag string, data *imap.SearchData, options *imap.SearchOptions, numKind NumKind, partial string) error {
	enc := newResponseEncoder(c)
	defer enc.end()

	enc.Atom("*").SP().Atom("ESEARCH")
	if tag != "" {
		enc.SP().Special('(').Atom("TAG").SP().String(tag).Special(')')
	}
	if numKind == NumKindUID {
		enc.SP().Atom("UID")
	}
	// When there is no result, we need to send an ESEARCH response with no ALL
	// keyword
	if options.ReturnAll && !isNumSetEmpty(data.All) {
		enc.SP().Atom("ALL").SP().NumSet(data.All)
	}
	if options.ReturnMin && data.Min > 0 {
		enc.SP().Atom("MIN").SP().Number(data.Min)
	}
	if options.ReturnMax && data.Max > 0 {
		enc.SP().Atom("MAX").SP().Number(data.Max)
	}
	if options.ReturnCount {
		enc.SP().Atom("COUNT").SP().Number(data.Count)
	}
	if partial != "" { // quill: RFC 5267 §4.4
		enc.SP().Atom("PARTIAL").SP().Atom(partial)
	}
	if data.ModSeq != 0 { // quill: RFC 7162 §3.1.5 with RFC 4731
		enc.SP().Atom("MODSEQ").SP().ModSeq(data.ModSeq)
	}
	return enc.CRLF()
}

func isNumSetEmpty(numSet imap.NumSet) bool {
	switch numSet := numSet.(type) {
	case imap.SeqSet:
		return len(numSet) == 0
	case imap.UIDSet:
		return len(numSet) == 0
	default:
		panic("unknown imap.NumSet type")
	}
}

func (c *Conn) writeSearch(numSet imap.NumSet, modSeq uint64) error {
	enc := newResponseEncoder(c)
	defer enc.end()

	enc.Atom("*").SP().Atom("SEARCH")
	var ok bool
	switch numSet := numSet.(type) {
	case imap.SeqSet:
		var nums []uint32
		nums, ok = numSet.Nums()
		for _, num := range nums {
			enc.SP().Number(num)
		}
	case imap.UIDSet:
		var uids []imap.UID
		uids, ok = numSet.Nums()
		for _, uid := range uids {
			enc.SP().UID(uid)
		}
	}
	if !ok {
		return fmt.Errorf("imapserver: failed to enumerate message numbers in SEARCH response")
	}
	if modSeq != 0 { // quill: RFC 7162 §3.1.5
		enc.SP().Special('(').Atom("MODSEQ").SP().ModSeq(modSeq).Special(')')
	}
	return enc.CRLF()
}

func readSearchReturnOpts(dec *imapwire.Decoder, options *imap.SearchOptions, ext *searchReturnExt) error {
	if !dec.ExpectSP() {
		return dec.Err()
	}
	err := dec.ExpectList(func() error {
		var name string
		if !dec.ExpectAtom(&name) {
			return dec.Err()
		}
		switch strings.ToUpper(name) {
		// quill: RFC 5267 §4 (context.go).
		case "CONTEXT": // a hint (§4.2), which needs no action here
			return nil
		case "UPDATE":
			ext.update = true
			return nil
		case "PARTIAL":
			var r string
			if !dec.ExpectSP() || !dec.ExpectAtom(&r) {
				return dec.Err()
			}
			if ext.partial != nil {
				return newClientBugError("PARTIAL twice")
			}
			p, err := parsePartialRange(r)
			ext.partial = p
			return err
		case "MIN":
			options.ReturnMin = true
		case "MAX":
			options.ReturnMax = true
		case "ALL":
			options.ReturnAll = true
		case "COUNT":
			options.ReturnCount = true
		case "SAVE":
			options.ReturnSave = true
		default:
			return newClientBugError("unknown SEARCH RETURN option")
		}
		return nil
	})
	if err == nil && ext.partial != nil && options.ReturnAll {
		return newClientBugError("PARTIAL and ALL exclude each other (RFC 5267 §4.4)")
	}
	return err
}

// defaultReturnAll is the rule of RFC 4731 §3.1: no result option (MIN,
// MAX, ALL, COUNT, or PARTIAL) is ALL; UPDATE, CONTEXT and SAVE are no
// result options.
func defaultReturnAll(options *imap.SearchOptions, ext *searchReturnExt) {
	if !options.ReturnMin && !options.ReturnMax && !options.ReturnAll && !options.ReturnCount && ext.partial == nil {
		options.ReturnAll = true
	}
}

func maybeReadSearchKeyAtom(dec *imapwire.Decoder, ptr *string) bool {
	return dec.Func(ptr, func(ch byte) bool {
		return ch == '*' || imapwire.IsAtomChar(ch)
	})
}

func readSearchKey(criteria *imap.SearchCriteria, dec *imapwire.Decoder) error {
	var key string
	if maybeReadSearchKeyAtom(dec, &key) {
		return readSearchKeyWithAtom(criteria, dec, key)
	}
	return dec.ExpectList(func() error {
		return readSearchKey(criteria, dec)
	})
}

func readSearchKeyWithAtom(criteria *imap.SearchCriteria, dec *imapwire.Decoder, key string) error {
	key = strings.ToUpper(key)
	switch key {
	case "ALL":
		// nothing to do
	case "UID":
		var uidSet imap.UIDSet
		if !dec.ExpectSP() || !dec.ExpectUIDSet(&uidSet) {
			return dec.Err()
		}
		criteria.UID = append(criteria.UID, uidSet)
	case "ANSWERED", "DELETED", "DRAFT", "FLAGGED", "RECENT", "SEEN":
		criteria.Flag = append(criteria.Flag, searchKeyFlag(key))
	case "UNANSWERED", "UNDELETED", "UNDRAFT", "UNFLAGGED", "UNSEEN":
		notKey := strings.TrimPrefix(key, "UN")
		criteria.NotFlag = append(criteria.NotFlag, searchKeyFlag(notKey))
	case "NEW":
		criteria.Flag = append(criteria.Flag, wire.FlagRecent)
		criteria.NotFlag = append(criteria.NotFlag, imap.FlagSeen)
	case "OLD":
		criteria.NotFlag = append(criteria.NotFlag, wire.FlagRecent)
	case "KEYWORD", "UNKEYWORD":
		if !dec.ExpectSP() {
			return dec.Err()
		}
		flag, err := wire.ExpectFlag(dec)
		if err != nil {
			return err
		}
		switch key {
		case "KEYWORD":
			criteria.Flag = append(criteria.Flag, flag)
		case "UNKEYWORD":
			criteria.NotFlag = append(criteria.NotFlag, flag)
		}
	case "BCC", "CC", "FROM", "SUBJECT", "TO":
		var value string
		if !dec.ExpectSP() || !dec.ExpectAString(&value) {
			return dec.Err()
		}
		criteria.Header = append(criteria.Header, imap.SearchCriteriaHeaderField{
			Key:   strings.Title(strings.ToLower(key)),
			Value: value,
		})
	case "HEADER":
		var key, value string
		if !dec.ExpectSP() || !dec.ExpectAString(&key) || !dec.ExpectSP() || !dec.ExpectAString(&value) {
			return dec.Err()
		}
		criteria.Header = append(criteria.Header, imap.SearchCriteriaHeaderField{
			Key:   key,
			Value: value,
		})
	case "SINCE", "BEFORE", "ON", "SENTSINCE", "SENTBEFORE", "SENTON":
		if !dec.ExpectSP() {
			return dec.Err()
		}
		t, err := wire.ExpectDate(dec)
		if err != nil {
			return err
		}
		var dateCriteria imap.SearchCriteria
		switch key {
		case "SINCE":
			dateCriteria.Since = t
		case "BEFORE":
			dateCriteria.Before = t
		case "ON":
			dateCriteria.Since = t
			dateCriteria.Before = t.Add(24 * time.Hour)
		case "SENTSINCE":
			dateCriteria.SentSince = t
		case "SENTBEFORE":
			dateCriteria.SentBefore = t
		case "SENTON":
			dateCriteria.SentSince = t
			dateCriteria.SentBefore = t.Add(24 * time.Hour)
		}
		criteria.And(&dateCriteria)
	case "BODY":
		var body string
		if !dec.ExpectSP() || !dec.ExpectAString(&body) {
			return dec.Err()
		}
		criteria.Body = append(criteria.Body, body)
	case "TEXT":
		var text string
		if !dec.ExpectSP() || !dec.ExpectAString(&text) {
			return dec.Err()
		}
		criteria.Text = append(criteria.Text, text)
	case "LARGER", "SMALLER":
		var n int64
		if !dec.ExpectSP() || !dec.ExpectNumber64(&n) {
			return dec.Err()
		}
		switch key {
		case "LARGER":
			criteria.And(&imap.SearchCriteria{Larger: n})
		case "SMALLER":
			if n == 0 {
				// quill: Smaller 0 means "no limit" in SearchCriteria,
				// but SMALLER 0 matches nothing: say NOT ALL.
				criteria.Not = append(criteria.Not, imap.SearchCriteria{})
				break
			}
			criteria.And(&imap.SearchCriteria{Smaller: n})
		}
	case "NOT":
		if !dec.ExpectSP() {
			return dec.Err()
		}
		var not imap.SearchCriteria
		if err := readSearchKey(&not, dec); err != nil {
			return err
		}
		criteria.Not = append(criteria.Not, not)
	case "OR":
		if !dec.ExpectSP() {
			return dec.Err()
		}
		var or [2]imap.SearchCriteria
		if err := readSearchKey(&or[0], dec); err != nil {
			return err
		}
		if !dec.ExpectSP() {
			return dec.Err()
		}
		if err := readSearchKey(&or[1], dec); err != nil {
			return err
		}
		criteria.Or = append(criteria.Or, or)
	case "$":
		criteria.UID = append(criteria.UID, imap.SearchRes())
	case "EMAILID", "THREADID": // quill: RFC 8474 §6
		id, err := readObjectID(dec)
		if err != nil {
			return err
		}
		k := SearchKeyEmailID
		if key == "THREADID" {
			k = SearchKeyThreadID
		}
		criteria.Header = append(criteria.Header, objectIDCriterion(k, id))
	case "MODSEQ": // quill: RFC 7162 §3.1.5, not parsed upstream
		if !dec.ExpectSP() {
			return dec.Err()
		}
		ms := &imap.SearchCriteriaModSeq{}
		var entry string
		if dec.String(&entry) {
			var typ string
			if !dec.ExpectSP() || !dec.ExpectAtom(&typ) || !dec.ExpectSP() {
				return dec.Err()
			}
			switch strings.ToLower(typ) {
			case "priv", "shared", "all":
			default:
				return newClientBugError("MODSEQ entry type must be priv, shared or all")
			}
			// The entry names a flag, "/flags/<flag>"; we keep one
			// mod-sequence per message, so it only narrows nothing.
			ms.MetadataName = entry
			ms.MetadataType = imap.SearchCriteriaMetadataType(strings.ToLower(typ))
		}
		if !dec.ExpectModSeq(&ms.ModSeq) {
			return dec.Err()
		}
		if ms.ModSeq > MaxModSeq {
			return newClientBugError("MODSEQ value out of range")
		}
		if criteria.ModSeq == nil || ms.ModSeq > criteria.ModSeq.ModSeq {
			criteria.ModSeq = ms
		}
	default:
		seqSet, err := imapwire.ParseSeqSet(key)
		if err != nil {
			// quill: an unknown key is the client's error (BAD).
			return newClientBugError("Unknown search key or bad sequence set: " + key)
		}
		criteria.SeqNum = append(criteria.SeqNum, seqSet)
	}
	return nil
}

func searchKeyFlag(key string) imap.Flag {
	return imap.Flag("\\" + strings.Title(strings.ToLower(key)))
}

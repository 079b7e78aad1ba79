package imapserver

import (
	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
)

// quill: QRESYNC (RFC 7162 §3.2), which upstream beta.8 neither parses nor
// writes: ENABLE QRESYNC, SELECT/EXAMINE (QRESYNC (...)), the UID FETCH
// modifier VANISHED, and VANISHED in place of EXPUNGE once enabled.

// QResyncParams are the QRESYNC parameters of SELECT or EXAMINE (RFC 7162
// §3.2.5): what the client knew of the mailbox when it last had it.
type QResyncParams struct {
	UIDValidity uint32
	ModSeq      uint64
	// KnownUIDs are the UIDs the client holds; nil when it did not say
	// (all of them).
	KnownUIDs imap.UIDSet
	// SeqMatch pairs message numbers with the UIDs they had (the
	// seq-match-data), or nil; a hint the server may use.
	SeqMatch *QResyncSeqMatch
}

// QResyncSeqMatch is a QRESYNC seq-match-data: the UIDs KnownUIDs the
// client had at message numbers Seqs.
type QResyncSeqMatch struct {
	Seqs      imap.SeqSet
	KnownUIDs imap.UIDSet
}

// SessionQResync is a session that supports QRESYNC.
type SessionQResync interface {
	Session
	// QResync runs after a SELECT or EXAMINE with QRESYNC parameters has
	// written its untagged responses and before its tagged OK: it writes
	// VANISHED (EARLIER) for the known messages that are gone and FETCH
	// (UID FLAGS MODSEQ) for those changed since params.ModSeq, or nothing
	// when the mailbox's UIDVALIDITY is not params.UIDValidity.
	QResync(w *FetchWriter, params *QResyncParams) error
	// HighestModSeq is the selected mailbox's HIGHESTMODSEQ as the
	// session last synced it: the tagged OK of an EXPUNGE that removed
	// messages carries it (RFC 7162 §3.2.10).
	HighestModSeq() uint64
}

// qresyncEnabled reports whether the client sent ENABLE QRESYNC.
func (c *Conn) qresyncEnabled() bool {
	c.mutex.Lock()
	defer c.mutex.Unlock()
	return c.enabled.Has(imap.CapQResync)
}

// readQResyncParams reads what follows "QRESYNC " in select-params:
// "(" uidvalidity SP mod-sequence-value [SP known-uids] [SP seq-match-data] ")".
func readQResyncParams(dec *imapwire.Decoder) (*QResyncParams, error) {
	var p QResyncParams
	if !dec.ExpectSpecial('(') || !dec.ExpectNumber(&p.UIDValidity) || !dec.ExpectSP() || !dec.ExpectModSeq(&p.ModSeq) {
		return nil, dec.Err()
	}
	if p.UIDValidity == 0 {
		return nil, newClientBugError("QRESYNC UIDVALIDITY must not be zero")
	}
	if p.ModSeq > MaxModSeq {
		return nil, newClientBugError("QRESYNC mod-sequence out of range")
	}
	if dec.SP() {
		if !dec.Special('(') {
			if !dec.ExpectUIDSet(&p.KnownUIDs) {
				return nil, dec.Err()
			}
			if !dec.SP() {
				return &p, expectClose(dec)
			}
			if !dec.ExpectSpecial('(') {
				return nil, dec.Err()
			}
		}
		var m QResyncSeqMatch
		var seqs imap.NumSet
		if !dec.ExpectNumSet(imapwire.NumKindSeq, &seqs) || !dec.ExpectSP() || !dec.ExpectUIDSet(&m.KnownUIDs) || !dec.ExpectSpecial(')') {
			return nil, dec.Err()
		}
		ss, ok := seqs.(imap.SeqSet)
		if !ok {
			return nil, newClientBugError("QRESYNC seq-match-data needs message numbers")
		}
		m.Seqs = ss
		p.SeqMatch = &m
	}
	return &p, expectClose(dec)
}

func expectClose(dec *imapwire.Decoder) error {
	if !dec.ExpectSpecial(')') {
		return dec.Err()
	}
	return nil
}

// writeVanished writes VANISHED, or VANISHED (EARLIER) (RFC 7162 §3.2.10).
func (c *Conn) writeVanished(uids imap.UIDSet, earlier bool, buffered bool) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("VANISHED").SP()
	if earlier {
		enc.Special('(').Atom("EARLIER").Special(')').SP()
	}
	enc.NumSet(uids)
	if buffered {
		return enc.CRLFBuffered()
	}
	return enc.CRLF()
}

// QResync reports whether expunges go out as VANISHED (the client enabled
// QRESYNC, RFC 7162 §3.2.7).
func (w *UpdateWriter) QResync() bool { return w.conn.qresyncEnabled() }

// WriteVanished writes a VANISHED response: the messages with these UIDs
// are expunged. It is allowed where EXPUNGE is.
func (w *UpdateWriter) WriteVanished(uids imap.UIDSet) error {
	if !w.allowExpunge {
		return errExpungeNotAllowed
	}
	return w.conn.writeVanished(uids, false, false)
}

// QResync reports whether expunges go out as VANISHED; never for CLOSE,
// which sends no expunge at all.
func (w *ExpungeWriter) QResync() bool { return w.conn != nil && w.conn.qresyncEnabled() }

// WriteVanished writes a VANISHED response for EXPUNGE or UID EXPUNGE.
func (w *ExpungeWriter) WriteVanished(uids imap.UIDSet) error {
	if w.conn == nil {
		return nil
	}
	w.vanished = true
	return w.conn.writeVanished(uids, false, false)
}

// QResync reports whether MOVE's expunges go out as VANISHED.
func (w *MoveWriter) QResync() bool { return w.conn.qresyncEnabled() }

// WriteVanished writes a VANISHED response for a MOVE command.
func (w *MoveWriter) WriteVanished(uids imap.UIDSet) error {
	return w.conn.writeVanished(uids, false, false)
}

// Vanished reports whether a UID FETCH carried the VANISHED modifier: the
// session writes VANISHED (EARLIER) for the messages of the set that are
// gone before the FETCH responses (RFC 7162 §3.2.6).
func (w *FetchWriter) Vanished() bool { return w.options.vanished }

// WriteVanishedEarlier writes VANISHED (EARLIER): messages expunged before
// this session knew of it (UID FETCH VANISHED, SELECT QRESYNC).
func (w *FetchWriter) WriteVanishedEarlier(uids imap.UIDSet) error {
	return w.conn.writeVanished(uids, true, w.buffered)
}

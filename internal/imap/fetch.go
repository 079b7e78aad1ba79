package imap

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"math"
	"strconv"
	"strings"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/third_party/imapserver"
)

// Fetch answers FETCH and UID FETCH (RFC 9051 §6.4.5, RFC 7162 §3.1.4).
func (s *session) Fetch(w *imapserver.FetchWriter, numSet imap.NumSet, options *imap.FetchOptions) (err error) {
	sel := s.sel
	idx, err := s.resolve(numSet, false)
	if err != nil {
		return err
	}
	needBody := options.Envelope || options.BodyStructure != nil || len(options.BodySection) > 0 ||
		len(options.BinarySection) > 0 || len(options.BinarySectionSize) > 0 || w.Preview()
	wantEmailID, _ := w.ObjectIDs()
	hdrOnly := needBody && headerOnly(options, w.Preview(), wantEmailID)
	ranger, _ := s.srv.store.(BodyRanger)
	ranged := needBody && !hdrOnly && ranger != nil && rangesOnly(options, w.Preview(), wantEmailID)
	parter, _ := s.srv.store.(BodyParter)
	parted := needBody && !hdrOnly && !ranged && parter != nil && !w.Preview() && !wantEmailID
	setSeen := false
	for _, bs := range options.BodySection {
		setSeen = setSeen || !bs.Peek
	}
	for _, bs := range options.BinarySection {
		setSeen = setSeen || !bs.Peek
	}
	setSeen = setSeen && !sel.readOnly
	condStore := s.condStore()
	expungeIssued := false
	if uids, ok := numSet.(imap.UIDSet); ok && w.Vanished() {
		// RFC 7162 §3.2.6: the UIDs of the set that are gone, before the
		// FETCH responses (qresync.go says which).
		if gone := vanishedUIDs(uids, sel.view(), sel.lastUID()); len(gone) > 0 {
			if err := w.WriteVanishedEarlier(gone); err != nil {
				return err
			}
		}
	}

	// RFC 9051 §6.4.5: BODY[...] (not .PEEK) sets \Seen. One flag change
	// for all the messages, started now so that its round trip to the
	// writer (replicated and fsync'd there) overlaps the first body's
	// read, and awaited before the first response shows any flags.
	seen := s.setSeen(sel, idx, setSeen, options.ChangedSince)
	var seenUIDs map[uint32]bool
	var flipped []mailbox.Message // what the \Seen change changed
	// served names the UIDs whose response went out whole, kept only when
	// there is a change to take back (not for FETCH 1:* FLAGS).
	var served map[uint32]bool
	if seen != nil {
		served = map[uint32]bool{}
	}
	defer func() {
		if seen != nil { // never awaited: nothing was served
			if r := <-seen; r.err == nil {
				flipped = r.updated
			}
		}
		if err != nil {
			s.unseeUnserved(sel, flipped, served)
		}
	}()

	// opened are the ranges of the message being answered, closed once
	// its response is written (or the FETCH ends).
	var opened []section
	defer func() { closeSections(opened) }()
	for _, i := range idx {
		closeSections(opened)
		opened = nil
		m := sel.msgs[i]
		if options.ChangedSince > 0 && m.modSeq <= options.ChangedSince {
			continue
		}
		var raw []byte
		var ranges []section   // the sections' bytes, when read as ranges
		var parts *partsAnswer // the items, when answered from the part table
		if needBody {
			// A message another session expunged (m.gone) is served while
			// its replica keeps the body (RFC 2180 §4.1.2,
			// mailbox.ExpungedBodyGrace); after, the others are answered
			// and the command ends NO [EXPUNGEISSUED] (§4.1.3).
			switch {
			case hdrOnly:
				raw, err = s.header(m)
			case ranged:
				ranges, err = s.ranges(ranger, m.id, options.BodySection)
				opened = ranges
			case parted:
				parts, raw, err = s.fromParts(parter, m.id, options)
				if parts != nil {
					ranges = parts.body
					opened = parts.opened()
				}
			default:
				raw, err = s.srv.store.Body(s.ctx(), s.user, m.id)
			}
			if errors.Is(err, mailbox.ErrNoMessage) {
				expungeIssued = true
				continue
			}
			if err != nil {
				return err
			}
		}
		emailID := ""
		if wantEmailID {
			// Made before the response starts: a message expunged
			// meanwhile is left out like one whose body is gone.
			emailID, err = s.emailID(m, raw)
			if errors.Is(err, mailbox.ErrNoMessage) {
				expungeIssued = true
				continue
			}
			if err != nil {
				return storeErr("FETCH EMAILID", err)
			}
		}
		if seen != nil {
			r := <-seen
			seen = nil
			if r.err != nil {
				return storeErr("FETCH (setting \\Seen)", r.err)
			}
			flipped = r.updated
			seenUIDs = sel.seenSet(idx, r.updated)
		}
		// BINARY is decoded before the message's response starts, so that
		// a part that cannot be fails the FETCH without half a response.
		var bins []section
		var binSizes []uint32
		if parts != nil {
			bins, binSizes = parts.bins, parts.binSizes
		} else if bins, binSizes, err = binarySections(raw, options); err != nil {
			return err
		}
		flagsChanged := seenUIDs[m.uid]
		rw := w.CreateMessage(uint32(i + 1))
		// RFC 7162 §3.1: once CONDSTORE is enabled, a FETCH response
		// that reports a flag change (here the \Seen this FETCH set)
		// carries the UID and the MODSEQ.
		if options.UID || (condStore && flagsChanged) {
			rw.WriteUID(imap.UID(m.uid))
		}
		if options.Flags || flagsChanged {
			rw.WriteFlags(m.imapFlags(s.rev2()))
		}
		if options.ModSeq || (condStore && (options.Flags || flagsChanged)) {
			rw.WriteModSeq(m.modSeq)
		}
		if options.InternalDate {
			rw.WriteInternalDate(m.date)
		}
		if options.RFC822Size {
			rw.WriteRFC822Size(m.size)
		}
		if options.Envelope {
			if parts != nil {
				rw.WriteEnvelopeRoutes(envelopeRoutesOf(readHeader(parts.header)))
			} else {
				rw.WriteEnvelopeRoutes(envelopeRoutesOf(readHeader(raw)))
			}
		}
		if options.BodyStructure != nil {
			if parts != nil {
				rw.WriteBodyStructure(parts.structure)
			} else {
				rw.WriteBodyStructure(bodyStructure(raw))
			}
		}
		for k, bs := range options.BodySection {
			if ranges != nil {
				// Copied from the store as it is read: a large message
				// is never held whole here.
				wc := rw.WriteBodySection(bs, ranges[k].n)
				if got, err := io.Copy(wc, nulMapper{io.LimitReader(ranges[k].r, ranges[k].n)}); err != nil {
					return err
				} else if got < ranges[k].n {
					// The literal's length is sent: a store that holds
					// fewer bytes than it said (a truncated file) must
					// end the response, not leave it short.
					return fmt.Errorf("message %s: %d of %d bytes read: %w", m.id, got, ranges[k].n, io.ErrUnexpectedEOF)
				}
				if err := wc.Close(); err != nil {
					return err
				}
				continue
			}
			b := noNULs(bodySection(raw, bs))
			wc := rw.WriteBodySection(bs, int64(len(b)))
			if _, err := wc.Write(b); err != nil {
				return err
			}
			if err := wc.Close(); err != nil {
				return err
			}
		}
		for k, bs := range options.BinarySection {
			wc := rw.WriteBinarySection(bs, bins[k].n)
			if got, err := io.Copy(wc, io.LimitReader(bins[k].r, bins[k].n)); err != nil {
				return err
			} else if got < bins[k].n {
				return fmt.Errorf("message %s: BINARY[%s]: %d of %d bytes read: %w", m.id, partString(bs.Part), got, bins[k].n, io.ErrUnexpectedEOF)
			}
			if err := wc.Close(); err != nil {
				return err
			}
		}
		for k, bs := range options.BinarySectionSize {
			rw.WriteBinarySectionSize(bs, binSizes[k])
		}
		if emailID != "" {
			rw.WriteEmailID(emailID)
		}
		if _, threadID := w.ObjectIDs(); threadID {
			rw.WriteThreadID("")
		}
		if w.Preview() {
			rw.WritePreview(preview(raw))
		}
		if err := rw.Close(); err != nil {
			return err
		}
		if served != nil {
			served[m.uid] = true
		}
	}
	if expungeIssued {
		// RFC 5530 EXPUNGEISSUED: the rest was answered.
		return no(codeExpungeIssued, "FETCH: some of the messages were expunged by another session")
	}
	return nil
}

// binarySections decodes the BINARY and BINARY.SIZE items of options from
// the message raw. A part in a transfer encoding the server cannot decode
// fails the FETCH with NO [UNKNOWN-CTE] (RFC 3516 §4.2).
func binarySections(raw []byte, options *imap.FetchOptions) (bins []section, sizes []uint32, err error) {
	for _, bs := range options.BinarySection {
		b, err := imapserver.ExtractBinarySection(bytes.NewReader(raw), bs)
		if err != nil {
			return nil, nil, binaryErr(bs.Part, err)
		}
		bins = append(bins, bytesSection(b))
	}
	for _, bs := range options.BinarySectionSize {
		n, err := imapserver.ExtractBinarySectionSize(bytes.NewReader(raw), bs)
		if err != nil {
			return nil, nil, binaryErr(bs.Part, err)
		}
		sizes = append(sizes, n)
	}
	return bins, sizes, nil
}

func binaryErr(part []int, err error) error {
	if errors.Is(err, imapserver.ErrUnknownCTE) {
		return no(imap.ResponseCodeUnknownCTE, "FETCH BINARY[%s]: the part's Content-Transfer-Encoding is unknown", partString(part))
	}
	return err
}

// partString is a part number as IMAP writes it ("1.2").
func partString(part []int) string {
	s := make([]string, len(part))
	for i, n := range part {
		s[i] = strconv.Itoa(n)
	}
	return strings.Join(s, ".")
}

// seenResult is the outcome of FETCH's flag change (setSeen).
type seenResult struct {
	updated []mailbox.Message
	err     error
}

// setSeen starts, if set, the flag change that gives \Seen to the messages
// of idx a FETCH serves without it, and returns where its outcome arrives
// (nil when there is nothing to change). The messages another session
// expunged are left alone; so are those CHANGEDSINCE leaves out, which the
// FETCH does not serve.
func (s *session) setSeen(sel *selected, idx []int, set bool, changedSince uint64) <-chan seenResult {
	if !set {
		return nil
	}
	var uids []uint32
	for _, i := range idx {
		m := sel.msgs[i]
		if (changedSince > 0 && m.modSeq <= changedSince) || m.gone || m.has(`\Seen`) {
			continue
		}
		uids = append(uids, m.uid)
	}
	if len(uids) == 0 {
		return nil
	}
	out := make(chan seenResult, 1)
	// Not cut short by a hang-up: Fetch waits for it in any case, and a
	// change half made is worse than one made and then undone.
	ctx, user, mbox := context.WithoutCancel(s.ctx()), s.user, sel.id
	go func() {
		upd, _, err := s.srv.store.StoreFlags(ctx, user, mbox, uids, mailbox.FlagsAdd, []string{`\Seen`}, 0)
		out <- seenResult{upd, err}
	}()
	return out
}

// unseeUnserved takes \Seen back from the messages a failed FETCH gave it
// to (flipped) but did not send whole (served): a client cut off halfway
// through a batch of unread messages finds the rest still unread, as it
// would have had the change been made one message at a time. The session's
// view keeps them seen until its next poll, which then reports the change.
func (s *session) unseeUnserved(sel *selected, flipped []mailbox.Message, served map[uint32]bool) {
	var uids []uint32
	for _, m := range flipped {
		if !served[m.UID] {
			uids = append(uids, m.UID)
		}
	}
	if len(uids) == 0 {
		return
	}
	ctx := context.WithoutCancel(s.ctx())
	if _, _, err := s.srv.store.StoreFlags(ctx, s.user, sel.id, uids, mailbox.FlagsRemove, []string{`\Seen`}, 0); err != nil {
		s.srv.cfg.Logger.Warn("FETCH failed: \\Seen not taken back from the messages it did not send", "user", s.user, "uids", len(uids), "err", err)
	}
}

// seenSet takes FETCH's \Seen changes into the session's view and returns
// the UIDs whose flags changed (their responses then show FLAGS). As for
// STORE, MODSEQs that are exactly this change's let the session skip the
// next full read of the mailbox.
func (sel *selected) seenSet(idx []int, updated []mailbox.Message) map[uint32]bool {
	if len(updated) == 0 {
		return nil
	}
	byUID := make(map[uint32]*msgState, len(idx)) // the FETCH's messages, not the mailbox's
	for _, i := range idx {
		byUID[sel.msgs[i].uid] = sel.msgs[i]
	}
	changed := make(map[uint32]bool, len(updated))
	var own []uint64
	explained := true
	for _, u := range updated {
		m := byUID[u.UID]
		if m == nil {
			continue
		}
		if u.ModSeq > sel.modSeq {
			own = append(own, u.ModSeq)
			explained = explained && mailbox.SameFlags(u.Flags, mailbox.ApplyFlags(m.flags, mailbox.FlagsAdd, []string{`\Seen`}))
		}
		m.flags, m.modSeq = u.Flags, u.ModSeq
		changed[u.UID] = true
	}
	if explained {
		sel.ownChanges(own)
	}
	return changed
}

// noNULs returns b with every NUL as 0x80: a plain literal may not hold
// NUL (RFC 9051 §4.3, RFC 3516 §4.1: binary data goes through BINARY and
// literal8), so a BODY[] of a part with NULs is sent with them replaced,
// as Dovecot does; the size stays the same. b is copied only if it has
// one.
func noNULs(b []byte) []byte {
	if bytes.IndexByte(b, 0) < 0 {
		return b
	}
	out := bytes.Clone(b)
	for i, c := range out {
		if c == 0 {
			out[i] = 0x80
		}
	}
	return out
}

// BodyRanger is a Store that reads part of a message's bytes without the
// rest: a FETCH of a range of a large message (BODY[]<0.4096>) reads only
// that range, and one of the whole message (BODY[]) copies it from the
// store's file as it goes, never holding it whole (mailbox.OpenBody).
type BodyRanger interface {
	// OpenRange returns a reader of at most n bytes of the message from
	// off, and how many it holds.
	OpenRange(ctx context.Context, user, id string, off, n int64) (io.ReadCloser, int64, error)
}

// section is a body section read as a range of the message.
type section struct {
	r io.ReadCloser
	n int64
}

func closeSections(ss []section) {
	for _, x := range ss {
		x.r.Close()
	}
}

// rangesOnly reports whether every body item of a FETCH is the whole
// message or a range of it (BODY[], BODY[]<o.n>), so that no item needs
// the message parsed.
func rangesOnly(options *imap.FetchOptions, preview, emailID bool) bool {
	if options.Envelope || options.BodyStructure != nil || len(options.BinarySection) > 0 ||
		len(options.BinarySectionSize) > 0 || preview || emailID || len(options.BodySection) == 0 {
		return false
	}
	for _, bs := range options.BodySection {
		if bs.Specifier != imap.PartSpecifierNone || len(bs.Part) > 0 || len(bs.HeaderFields) > 0 || len(bs.HeaderFieldsNot) > 0 {
			return false
		}
	}
	return true
}

// ranges opens the ranges of a message the body sections ask for.
func (s *session) ranges(r BodyRanger, id string, secs []*imap.FetchItemBodySection) ([]section, error) {
	out := make([]section, 0, len(secs))
	for _, bs := range secs {
		off, n := int64(0), int64(math.MaxInt64)
		if p := bs.Partial; p != nil {
			off, n = p.Offset, p.Size
		}
		if off < 0 || n <= 0 {
			out = append(out, section{io.NopCloser(strings.NewReader("")), 0})
			continue
		}
		rc, size, err := r.OpenRange(s.ctx(), s.user, id, off, n)
		if err != nil {
			closeSections(out)
			return nil, err
		}
		out = append(out, section{rc, size})
	}
	return out, nil
}

// nulMapper is noNULs for a stream.
type nulMapper struct{ r io.Reader }

func (m nulMapper) Read(p []byte) (int, error) {
	n, err := m.r.Read(p)
	for i, c := range p[:n] {
		if c == 0 {
			p[i] = 0x80
		}
	}
	return n, err
}

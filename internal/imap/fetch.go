package imap

import (
	"bytes"
	"errors"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/third_party/imapserver"
)

// Fetch answers FETCH and UID FETCH (RFC 9051 §6.4.5, RFC 7162 §3.1.4).
func (s *session) Fetch(w *imapserver.FetchWriter, numSet imap.NumSet, options *imap.FetchOptions) error {
	sel := s.sel
	idx, err := s.resolve(numSet, false)
	if err != nil {
		return err
	}
	needBody := options.Envelope || options.BodyStructure != nil || len(options.BodySection) > 0 ||
		len(options.BinarySection) > 0 || len(options.BinarySectionSize) > 0 || w.Preview()
	wantEmailID, _ := w.ObjectIDs()
	hdrOnly := needBody && headerOnly(options, w.Preview(), wantEmailID)
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

	for _, i := range idx {
		m := sel.msgs[i]
		if options.ChangedSince > 0 && m.modSeq <= options.ChangedSince {
			continue
		}
		var raw []byte
		if needBody {
			// A message another session expunged (m.gone) is served while
			// its replica keeps the body (RFC 2180 §4.1.2,
			// mailbox.ExpungedBodyGrace); after, the others are answered
			// and the command ends NO [EXPUNGEISSUED] (§4.1.3).
			if hdrOnly {
				raw, err = s.header(m)
			} else {
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
		flagsChanged := false
		if setSeen && !m.gone && !m.has(`\Seen`) {
			// RFC 9051 §6.4.5: BODY[...] (not .PEEK) sets \Seen.
			upd, _, err := s.srv.store.StoreFlags(s.ctx(), s.user, sel.id, []uint32{m.uid}, mailbox.FlagsAdd, []string{`\Seen`}, 0)
			if err != nil {
				return storeErr("FETCH (setting \\Seen)", err)
			}
			if len(upd) == 1 {
				if mailbox.SameFlags(upd[0].Flags, mailbox.ApplyFlags(m.flags, mailbox.FlagsAdd, []string{`\Seen`})) {
					sel.ownChanges([]uint64{upd[0].ModSeq})
				}
				m.flags, m.modSeq = upd[0].Flags, upd[0].ModSeq
				flagsChanged = true
			}
		}
		rw := w.CreateMessage(uint32(i + 1))
		if options.UID {
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
			rw.WriteEnvelopeRoutes(envelopeRoutesOf(readHeader(raw)))
		}
		if options.BodyStructure != nil {
			rw.WriteBodyStructure(bodyStructure(raw))
		}
		for _, bs := range options.BodySection {
			b := noNULs(bodySection(raw, bs))
			wc := rw.WriteBodySection(bs, int64(len(b)))
			if _, err := wc.Write(b); err != nil {
				return err
			}
			if err := wc.Close(); err != nil {
				return err
			}
		}
		for _, bs := range options.BinarySection {
			b := imapserver.ExtractBinarySection(bytes.NewReader(raw), bs)
			wc := rw.WriteBinarySection(bs, int64(len(b)))
			if _, err := wc.Write(b); err != nil {
				return err
			}
			if err := wc.Close(); err != nil {
				return err
			}
		}
		for _, bs := range options.BinarySectionSize {
			rw.WriteBinarySectionSize(bs, imapserver.ExtractBinarySectionSize(bytes.NewReader(raw), bs))
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
	}
	if expungeIssued {
		// RFC 5530 EXPUNGEISSUED: the rest was answered.
		return no(codeExpungeIssued, "FETCH: some of the messages were expunged by another session")
	}
	return nil
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

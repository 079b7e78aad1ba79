package imapserver

import (
	"strings"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
	"github.com/quillmail/quill/third_party/imapserver/internal/wire"
)

func (c *Conn) handleStore(tag string, dec *imapwire.Decoder, numKind NumKind) error {
	var (
		numSet  imap.NumSet
		item    string
		options imap.StoreOptions
	)
	if !dec.ExpectSP() || !dec.ExpectNumSet(numKind.wire(), &numSet) || !dec.ExpectSP() {
		return dec.Err()
	}
	// quill: store-modifiers of RFC 7162 §3.1.3 (UNCHANGEDSINCE), which
	// upstream did not parse.
	hasMods, err := dec.List(func() error {
		var name string
		if !dec.ExpectAtom(&name) || !dec.ExpectSP() {
			return dec.Err()
		}
		if !strings.EqualFold(name, "UNCHANGEDSINCE") {
			return newClientBugError("Unknown STORE modifier " + name)
		}
		var v uint64
		if !dec.ExpectModSeq(&v) {
			return dec.Err()
		}
		if v > MaxModSeq {
			return newClientBugError("UNCHANGEDSINCE value out of range")
		}
		options.UnchangedSince = v
		if v == 0 {
			options.UnchangedSince = UnchangedSinceZero
		}
		return nil
	})
	if err != nil {
		return err
	}
	if hasMods {
		if !dec.ExpectSP() {
			return dec.Err()
		}
		c.enableCondStore(true)
	}
	if !dec.ExpectAtom(&item) || !dec.ExpectSP() {
		return dec.Err()
	}
	var flags []imap.Flag
	isList, err := dec.List(func() error {
		flag, err := wire.ExpectFlag(dec)
		if err != nil {
			return err
		}
		flags = append(flags, flag)
		return nil
	})
	if err != nil {
		return err
	} else if !isList {
		for {
			flag, err := wire.ExpectFlag(dec)
			if err == wire.ErrNILFlag && len(flags) == 0 {
				break // quill: a bare NIL is the empty list (as Dovecot reads it)
			}
			if err != nil {
				return err
			}
			flags = append(flags, flag)

			if !dec.SP() {
				break
			}
		}
	}
	if !dec.ExpectCRLF() {
		return dec.Err()
	}

	item = strings.ToUpper(item)
	silent := strings.HasSuffix(item, ".SILENT")
	item = strings.TrimSuffix(item, ".SILENT")

	var op imap.StoreFlagsOp
	switch {
	case strings.HasPrefix(item, "+"):
		op = imap.StoreFlagsAdd
		item = strings.TrimPrefix(item, "+")
	case strings.HasPrefix(item, "-"):
		op = imap.StoreFlagsDel
		item = strings.TrimPrefix(item, "-")
	default:
		op = imap.StoreFlagsSet
	}

	if item != "FLAGS" {
		return newClientBugError("STORE can only change FLAGS")
	}

	if err := c.checkState(imap.ConnStateSelected); err != nil {
		return err
	}

	w := &FetchWriter{conn: c, buffered: true}
	err = c.session.Store(w, numSet, &imap.StoreFlags{
		Op:     op,
		Silent: silent,
		Flags:  flags,
	}, &options)
	if err != nil {
		return err
	}
	cmdName := "STORE"
	if numKind == NumKindUID {
		cmdName = "UID STORE"
	}
	if err := c.poll(cmdName); err != nil {
		return err
	}
	resp := &imap.StatusResponse{Type: imap.StatusResponseTypeOK, Text: cmdName + " completed"}
	if w.modified != nil && !isNumSetEmpty(w.modified) {
		// RFC 7162 §3.1.3: the messages that failed UNCHANGEDSINCE.
		resp.Code = imap.ResponseCode("MODIFIED " + w.modified.String())
		resp.Text = "Conditional STORE failed for some messages"
	}
	return c.writeStatusResp(tag, resp)
}

// MaxModSeq is the largest mod-sequence a client may send (RFC 7162 §7:
// 63-bit). (quill)
const MaxModSeq = 1<<63 - 1

// UnchangedSinceZero is what StoreOptions.UnchangedSince holds when the
// client sent UNCHANGEDSINCE 0, which must fail for every message (RFC 7162
// §3.1.3); 0 itself means no condition. (quill)
const UnchangedSinceZero = ^uint64(0)

// SetModified records the messages that failed an UNCHANGEDSINCE test, for
// the MODIFIED response code. (quill)
func (w *FetchWriter) SetModified(numSet imap.NumSet) { w.modified = numSet }

// WriteMailboxFlags writes FLAGS and, unless permanent is nil, an OK
// [PERMANENTFLAGS] before the FETCH responses of a STORE that brings a
// keyword the session has not seen: a client must know a keyword before
// a FETCH shows it. (quill)
func (w *FetchWriter) WriteMailboxFlags(flags, permanent []imap.Flag) error {
	return w.conn.writeMailboxFlags(flags, permanent)
}

// enableCondStore marks CONDSTORE as enabled on this connection by a
// CONDSTORE-enabling command (RFC 7162 §3.1). The first such command other
// than SELECT or EXAMINE (which report it themselves) owes the client the
// selected mailbox's HIGHESTMODSEQ: UpdateWriter.CondStoreJustEnabled
// tells the session so before the tagged response. (quill)
func (c *Conn) enableCondStore(announce bool) {
	if !c.server.options.caps().Has(imap.CapCondStore) {
		return
	}
	c.mutex.Lock()
	if _, was := c.enabled[imap.CapCondStore]; !was && announce {
		c.condStoreNew = true
	}
	c.enabled[imap.CapCondStore] = struct{}{}
	c.mutex.Unlock()
}

// CondStoreJustEnabled reports, once, that the command being completed
// enabled CONDSTORE implicitly: the session then sends OK
// [HIGHESTMODSEQ] for its selected mailbox (RFC 7162 §3.1). (quill)
func (w *UpdateWriter) CondStoreJustEnabled() bool {
	w.conn.mutex.Lock()
	defer w.conn.mutex.Unlock()
	was := w.conn.condStoreNew
	w.conn.condStoreNew = false
	return was
}

// WriteHighestModSeq writes OK [HIGHESTMODSEQ v]. (quill)
func (w *UpdateWriter) WriteHighestModSeq(v uint64) error { return w.conn.writeHighestModSeq(v) }

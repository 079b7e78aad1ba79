package imapserver

import (
	"fmt"
	"strings"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
)

func (c *Conn) handleSelect(tag string, dec *imapwire.Decoder, readOnly bool) error {
	var mailbox string
	if !dec.ExpectSP() || !dec.ExpectMailbox(&mailbox) {
		return dec.Err()
	}
	// quill: select-params of RFC 7162 §3.1.8 (CONDSTORE) and §3.2.5
	// (QRESYNC), not parsed upstream.
	condStore := false
	var qresync *QResyncParams
	if dec.SP() {
		err := dec.ExpectList(func() error {
			var name string
			if !dec.ExpectAtom(&name) {
				return dec.Err()
			}
			switch {
			case strings.EqualFold(name, "CONDSTORE"):
				condStore = true
			case strings.EqualFold(name, "QRESYNC") && qresync == nil:
				if !dec.ExpectSP() {
					return dec.Err()
				}
				p, err := readQResyncParams(dec)
				if err != nil {
					return err
				}
				qresync = p
			default:
				return newClientBugError("Unknown SELECT parameter " + name)
			}
			return nil
		})
		if err != nil {
			return err
		}
	}
	if !dec.ExpectCRLF() {
		return dec.Err()
	}

	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		return err
	}
	// RFC 7162 §3.2.5: QRESYNC parameters without ENABLE QRESYNC are BAD
	// (and leave the selected mailbox as it was).
	if qresync != nil && !c.qresyncEnabled() {
		return newClientBugError("QRESYNC must be enabled first (ENABLE QRESYNC)")
	}

	if c.state == imap.ConnStateSelected {
		if err := c.session.Unselect(); err != nil {
			return err
		}
		c.state = imap.ConnStateAuthenticated
		c.searchContexts = nil // quill: RFC 5267 §4.3 (context.go)
		err := c.writeStatusResp("", &imap.StatusResponse{
			Type: imap.StatusResponseTypeOK,
			Code: "CLOSED",
			Text: "Previous mailbox is now closed",
		})
		if err != nil {
			return err
		}
	}

	if condStore {
		c.enableCondStore(false)
	}
	options := imap.SelectOptions{ReadOnly: readOnly, CondStore: condStore}
	data, err := c.session.Select(mailbox, &options)
	if err != nil {
		return err
	}

	if err := c.writeExists(data.NumMessages); err != nil {
		return err
	}
	if !c.enabled.Has(imap.CapIMAP4rev2) && c.server.options.caps().Has(imap.CapIMAP4rev1) {
		if err := c.writeObsoleteRecent(data.NumRecent); err != nil {
			return err
		}
		if data.FirstUnseenSeqNum != 0 {
			if err := c.writeObsoleteUnseen(data.FirstUnseenSeqNum); err != nil {
				return err
			}
		}
	}
	if err := c.writeUIDValidity(data.UIDValidity); err != nil {
		return err
	}
	if err := c.writeUIDNext(data.UIDNext); err != nil {
		return err
	}
	if c.server.options.caps().Has(imap.CapCondStore) {
		// RFC 7162 §3.1.2.1: every SELECT/EXAMINE of a mailbox with
		// persistent mod-sequences reports HIGHESTMODSEQ. (quill)
		if err := c.writeHighestModSeq(data.HighestModSeq); err != nil {
			return err
		}
	}
	if id := c.mailboxID(mailbox); id != "" { // quill: RFC 8474 §4.2
		if err := c.writeMailboxID(id); err != nil {
			return err
		}
	}
	if err := c.writeFlags(data.Flags); err != nil {
		return err
	}
	if err := c.writePermanentFlags(data.PermanentFlags); err != nil {
		return err
	}
	if data.List != nil {
		if err := c.writeList(data.List); err != nil {
			return err
		}
	}

	c.state = imap.ConnStateSelected
	c.searchContexts = nil // quill: RFC 5267 §4.3, contexts end with the selection (context.go)
	// TODO: forbid write commands in read-only mode

	// quill: what changed since the client last had the mailbox (RFC 7162
	// §3.2.5.2), before the tagged OK.
	if qs, ok := c.session.(SessionQResync); ok && qresync != nil {
		if err := qs.QResync(&FetchWriter{conn: c, buffered: true}, qresync); err != nil {
			// The SELECT failed: nothing stays selected.
			c.session.Unselect()
			c.state = imap.ConnStateAuthenticated
			return err
		}
	}

	var (
		cmdName string
		code    imap.ResponseCode
	)
	if readOnly {
		cmdName = "EXAMINE"
		code = "READ-ONLY"
	} else {
		cmdName = "SELECT"
		code = "READ-WRITE"
	}
	return c.writeStatusResp(tag, &imap.StatusResponse{
		Type: imap.StatusResponseTypeOK,
		Code: code,
		Text: fmt.Sprintf("%v completed", cmdName),
	})
}

func (c *Conn) handleUnselect(dec *imapwire.Decoder, expunge bool) error {
	if !dec.ExpectCRLF() {
		return dec.Err()
	}

	if err := c.checkState(imap.ConnStateSelected); err != nil {
		return err
	}

	if expunge {
		w := &ExpungeWriter{}
		if err := c.session.Expunge(w, nil); err != nil {
			return err
		}
	}

	if err := c.session.Unselect(); err != nil {
		return err
	}

	c.state = imap.ConnStateAuthenticated
	c.searchContexts = nil // quill: RFC 5267 §4.3 (context.go)
	return nil
}

func (c *Conn) writeExists(numMessages uint32) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	return enc.Atom("*").SP().Number(numMessages).SP().Atom("EXISTS").CRLF()
}

func (c *Conn) writeObsoleteRecent(n uint32) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	return enc.Atom("*").SP().Number(n).SP().Atom("RECENT").CRLF()
}

func (c *Conn) writeObsoleteUnseen(n uint32) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("OK").SP()
	enc.Special('[').Atom("UNSEEN").SP().Number(n).Special(']')
	enc.SP().Text("First unseen message")
	return enc.CRLF()
}

func (c *Conn) writeUIDValidity(uidValidity uint32) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("OK").SP()
	enc.Special('[').Atom("UIDVALIDITY").SP().Number(uidValidity).Special(']')
	enc.SP().Text("UIDs valid")
	return enc.CRLF()
}

func (c *Conn) writeUIDNext(uidNext imap.UID) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("OK").SP()
	enc.Special('[').Atom("UIDNEXT").SP().UID(uidNext).Special(']')
	enc.SP().Text("Predicted next UID")
	return enc.CRLF()
}

func (c *Conn) writeHighestModSeq(v uint64) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("OK").SP()
	if v == 0 {
		enc.Special('[').Atom("NOMODSEQ").Special(']')
		enc.SP().Text("No persistent mod-sequences")
	} else {
		enc.Special('[').Atom("HIGHESTMODSEQ").SP().ModSeq(v).Special(']')
		enc.SP().Text("Highest")
	}
	return enc.CRLF()
}

func (c *Conn) writeFlags(flags []imap.Flag) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("FLAGS").SP().List(len(flags), func(i int) {
		enc.Flag(flags[i])
	})
	return enc.CRLF()
}

func (c *Conn) writeMailboxFlags(flags, permanent []imap.Flag) error {
	if err := c.writeFlags(flags); err != nil || permanent == nil {
		return err
	}
	return c.writePermanentFlags(permanent)
}

func (c *Conn) writePermanentFlags(flags []imap.Flag) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("OK").SP()
	enc.Special('[').Atom("PERMANENTFLAGS").SP().List(len(flags), func(i int) {
		enc.Flag(flags[i])
	}).Special(']')
	enc.SP().Text("Permanent flags")
	return enc.CRLF()
}

package imapserver

import (
	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
	"github.com/quillmail/quill/third_party/imapserver/internal/wire"
)

func (c *Conn) handleEnable(dec *imapwire.Decoder) error {
	var requested []imap.Cap
	for dec.SP() {
		cap, err := wire.ExpectCap(dec)
		if err != nil {
			return err
		}
		requested = append(requested, cap)
	}
	if !dec.ExpectCRLF() {
		return dec.Err()
	}

	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		return err
	}

	var enabled []imap.Cap
	for _, req := range requested {
		switch req {
		case imap.CapIMAP4rev2, imap.CapUTF8Accept:
			enabled = append(enabled, req)
		case imap.CapCondStore: // quill: RFC 7162 §3.1
			if c.server.options.caps().Has(imap.CapCondStore) {
				enabled = append(enabled, req)
			}
		case imap.CapQResync: // quill: RFC 7162 §3.2.3
			if _, ok := c.session.(SessionQResync); ok && c.server.options.caps().Has(imap.CapQResync) {
				enabled = append(enabled, req)
			}
		}
	}

	c.mutex.Lock()
	for _, e := range enabled {
		c.enabled[e] = struct{}{}
		if e == imap.CapQResync {
			// QRESYNC implies CONDSTORE (RFC 7162 §3.2.3).
			c.enabled[imap.CapCondStore] = struct{}{}
		}
	}
	c.mutex.Unlock()

	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("ENABLED")
	for _, c := range enabled {
		enc.SP().Atom(string(c))
	}
	return enc.CRLF()
}

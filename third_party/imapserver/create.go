package imapserver

import (
	"strings"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
	"github.com/quillmail/quill/third_party/imapserver/internal/wire"
)

func (c *Conn) handleCreate(tag string, dec *imapwire.Decoder) error {
	var (
		name    string
		options imap.CreateOptions
	)
	if !dec.ExpectSP() || !dec.ExpectMailbox(&name) {
		return dec.Err()
	}
	if dec.SP() {
		var name string
		if !dec.ExpectSpecial('(') || !dec.ExpectAtom(&name) || !dec.ExpectSP() {
			return dec.Err()
		}
		switch strings.ToUpper(name) {
		case "USE":
			var err error
			options.SpecialUse, err = wire.ExpectMailboxAttrList(dec)
			if err != nil {
				return err
			}
		default:
			return newClientBugError("unknown CREATE parameter")
		}
		if !dec.ExpectSpecial(')') {
			return dec.Err()
		}
	}
	if !dec.ExpectCRLF() {
		return dec.Err()
	}
	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		return err
	}
	if err := c.session.Create(name, &options); err != nil {
		return err
	}
	// quill: the tagged OK names the new mailbox's id (RFC 8474 §4.1).
	resp := &imap.StatusResponse{Type: imap.StatusResponseTypeOK, Text: "CREATE completed"}
	if id := c.mailboxID(name); id != "" {
		resp.Code = imap.ResponseCode("MAILBOXID (" + id + ")")
	}
	if err := c.poll("CREATE"); err != nil {
		return err
	}
	return c.writeStatusResp(tag, resp)
}

package imap

import (
	"strings"

	"github.com/emersion/go-imap/v2"
	gomessage "github.com/emersion/go-message"
	"github.com/emersion/go-message/mail"
	"github.com/emersion/go-message/textproto"
	"github.com/quillmail/quill/internal/fts"
	"github.com/quillmail/quill/third_party/imapserver"
)

// Address fields are parsed by fts (shared with the text index).
func parseAddressList(v string) []imap.Address { return fts.ParseAddressList(v) }

func parseAddressRoutes(v string) ([]imap.Address, []string) { return fts.ParseAddressRoutes(v) }

// envelopeOf builds the ENVELOPE from a parsed header.
func envelopeOf(h textproto.Header) *imap.Envelope {
	env, _ := envelopeRoutesOf(h)
	return env
}

// envelopeRoutesOf builds the ENVELOPE and its addresses' source routes.
func envelopeRoutesOf(h textproto.Header) (*imap.Envelope, *imapserver.EnvelopeRoutes) {
	mh := mail.Header{Header: gomessage.Header{Header: h}}
	env := &imap.Envelope{Subject: unfold(h.Get("Subject"))}
	routes := &imapserver.EnvelopeRoutes{Date: strings.TrimSpace(unfold(h.Get("Date")))}
	env.Date, _ = mh.Date()
	list := func(k string, r *[]string) []imap.Address {
		if !h.Has(k) {
			return nil
		}
		l, rs := parseAddressRoutes(h.Get(k))
		*r = rs
		return l
	}
	env.From, env.Sender, env.ReplyTo = list("From", &routes.From), list("Sender", &routes.Sender), list("Reply-To", &routes.ReplyTo)
	env.To, env.Cc, env.Bcc = list("To", &routes.To), list("Cc", &routes.Cc), list("Bcc", &routes.Bcc)
	// The library's writer wraps these in <>; hand it the raw value
	// without its outer brackets so what the header says comes out.
	env.InReplyTo = rawIDs(h.Get("In-Reply-To"))
	if ids := rawIDs(h.Get("Message-Id")); len(ids) > 0 {
		env.MessageID = ids[0]
	}
	return env, routes
}

func rawIDs(v string) []string {
	v = strings.TrimSpace(unfold(v))
	if v == "" {
		return nil
	}
	v = strings.TrimSuffix(strings.TrimPrefix(v, "<"), ">")
	return []string{v}
}

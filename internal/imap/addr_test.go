package imap

import (
	"fmt"
	"strings"
	"testing"

	"github.com/emersion/go-imap/v2"
)

func fmtAddrs(l []imap.Address) string {
	var parts []string
	for _, a := range l {
		parts = append(parts, fmt.Sprintf("(%q %q %q)", a.Name, a.Mailbox, a.Host))
	}
	return strings.Join(parts, "")
}

// Cases after Dovecot's imaptest fetch-envelope script, plus a few more.
func TestParseAddressList(t *testing.T) {
	cases := []struct{ in, want string }{
		{"From Real <fromuser@fromdomain.org>", `("From Real" "fromuser" "fromdomain.org")`},
		{"user@domain", `("" "user" "domain")`},
		{"user@domain (Real Name)", `("Real Name" "user" "domain")`},
		{"group: g1@d1.org, g2@d2.org;, group2: g3@d3.org;",
			`("" "group" "")("" "g1" "d1.org")("" "g2" "d2.org")("" "" "")("" "group2" "")("" "g3" "d3.org")("" "" "")`},
		{"<@route:user@domain>", `("" "user" "domain")`},
		{`"Doe, John" <jd@x.org>, ann@y.org`, `("Doe, John" "jd" "x.org")("" "ann" "y.org")`},
		{`=?utf-8?q?Jos=C3=A9?= <j@x.org>`, `("=?utf-8?q?Jos=C3=A9?=" "j" "x.org")`},
		{"undisclosed-recipients:;", `("" "undisclosed-recipients" "")("" "" "")`},
		{"nodomain", `("" "nodomain" "MISSING_DOMAIN")`},
		{"", ``},
	}
	for _, c := range cases {
		if got := fmtAddrs(parseAddressList(c.in)); got != c.want {
			t.Errorf("%q:\n got %s\nwant %s", c.in, got, c.want)
		}
	}
}

func TestEnvelopeRaw(t *testing.T) {
	raw := "Message-ID: <msg@id>\r\nIn-Reply-To: <reply@to.id>\r\nDate: Sat, 01 Feb 2007 01:02:03 +0200\r\n" +
		"Subject: =?utf-8?q?caf=C3=A9?= and\r\n more\r\nFrom: user@domain (Real Name)\r\nSender: \r\n\r\nbody\r\n"
	env := envelope([]byte(raw))
	if env.Subject != "=?utf-8?q?caf=C3=A9?= and more" {
		t.Errorf("subject %q", env.Subject)
	}
	if env.MessageID != "msg@id" || len(env.InReplyTo) != 1 || env.InReplyTo[0] != "reply@to.id" {
		t.Errorf("ids %q %q", env.MessageID, env.InReplyTo)
	}
	if len(env.From) != 1 || env.From[0].Name != "Real Name" || env.Sender != nil {
		t.Errorf("from %v sender %v", env.From, env.Sender)
	}
	if env.Date.IsZero() {
		t.Errorf("no date")
	}
}

func FuzzAddressList(f *testing.F) {
	for _, s := range []string{"a <b@c>", "g: a@b, (c) d@e;", `"x\" y" <@r,@s:u@h>`, "((nested) comment) u@h"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		depth := 0
		for _, a := range parseAddressList(s) {
			switch {
			case a.IsGroupEnd():
				depth--
			case a.IsGroupStart():
				depth++
			}
			if depth < 0 || depth > 1 {
				t.Fatalf("%q: unbalanced group markers", s)
			}
		}
		if depth != 0 {
			t.Fatalf("%q: unterminated group", s)
		}
	})
}

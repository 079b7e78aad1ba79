package fts

import (
	"strings"

	"github.com/emersion/go-imap/v2"
)

// Address header fields are parsed here, for ENVELOPE (RFC 9051 §7.5.2)
// and for SEARCH FROM/TO/CC/BCC, whose matches the text index must cover, rather than by
// the library, whose ExtractEnvelope goes through net/mail: that drops group
// syntax (RFC 5322 §3.4: "team: a@x, b@y;" must give a group start and end
// marker), and drops the whole field when one address is unusual (an
// obsolete route, a missing domain). This parser is lenient: it never fails,
// and an address it cannot split still shows up.

// Placeholders Dovecot also uses for a missing part of an address: an empty
// host would read as a group marker.
const (
	missingMailbox = "MISSING_MAILBOX"
	missingDomain  = "MISSING_DOMAIN"
)

// maxEnvelopeAddrs bounds the addresses one header field contributes.
const maxEnvelopeAddrs = 1000

// ParseAddressList parses the value of an address header.
func ParseAddressList(v string) []imap.Address {
	l, _ := ParseAddressRoutes(v)
	return l
}

// ParseAddressRoutes parses the value of an address header into its
// addresses and their obsolete source routes ("@a,@b", or "").
func ParseAddressRoutes(v string) ([]imap.Address, []string) {
	var out []imap.Address
	var routes []string
	p := addrParser{s: Unfold(v)}
	for !p.done() && len(out) < maxEnvelopeAddrs {
		item, sep := p.item(",:;")
		if sep == ':' {
			// Group: "name:" members ";".
			name := phrase(item)
			if name == "" {
				name = missingMailbox // an empty name would read as a group end
			}
			out, routes = append(out, imap.Address{Mailbox: name}), append(routes, "")
			for !p.done() {
				m, sep := p.item(",;")
				if a, route, ok := parseMailbox(m); ok {
					out, routes = append(out, a), append(routes, route)
				}
				if sep == ';' || sep == 0 {
					break
				}
			}
			out, routes = append(out, imap.Address{}), append(routes, "")
			continue
		}
		if a, route, ok := parseMailbox(item); ok {
			out, routes = append(out, a), append(routes, route)
		}
	}
	return out, routes
}

type addrParser struct {
	s string
	i int
}

func (p *addrParser) done() bool {
	for p.i < len(p.s) && (p.s[p.i] == ' ' || p.s[p.i] == '\t' || p.s[p.i] == ',') {
		p.i++
	}
	return p.i >= len(p.s)
}

// item returns the text up to the next separator that is outside quotes,
// comments and angle brackets, and that separator (0 at the end).
func (p *addrParser) item(seps string) (string, byte) {
	start := p.i
	angle := false
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i = skipQuoted(p.s, p.i)
			continue
		case c == '(':
			p.i = skipComment(p.s, p.i)
			continue
		case c == '<':
			angle = true
		case c == '>':
			angle = false
		case !angle && strings.IndexByte(seps, c) >= 0:
			item := p.s[start:p.i]
			p.i++
			return item, c
		}
		p.i++
	}
	return p.s[start:], 0
}

// skipQuoted returns the index after the quoted-string starting at i.
func skipQuoted(s string, i int) int {
	for i++; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '"':
			return i + 1
		}
	}
	return len(s)
}

// skipComment returns the index after the (nested) comment starting at i.
func skipComment(s string, i int) int {
	depth := 0
	for ; i < len(s); i++ {
		switch s[i] {
		case '\\':
			i++
		case '(':
			depth++
		case ')':
			depth--
			if depth == 0 {
				return i + 1
			}
		}
	}
	return len(s)
}

// stripComments removes comments and returns the text of the last one.
func stripComments(s string) (string, string) {
	var b strings.Builder
	last := ""
	for i := 0; i < len(s); {
		switch s[i] {
		case '"':
			j := skipQuoted(s, i)
			b.WriteString(s[i:j])
			i = j
		case '(':
			j := skipComment(s, i)
			last = strings.TrimSpace(strings.TrimSuffix(s[i+1:j], ")"))
			b.WriteByte(' ')
			i = j
		default:
			b.WriteByte(s[i])
			i++
		}
	}
	return b.String(), last
}

// phrase turns a display name into the text ENVELOPE carries: quotes and
// escapes removed, white space collapsed, encoded-words left as they are.
func phrase(s string) string {
	s, _ = stripComments(s)
	var b strings.Builder
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c == '"' {
			for i++; i < len(s) && s[i] != '"'; i++ {
				if s[i] == '\\' && i+1 < len(s) {
					i++
				}
				b.WriteByte(s[i])
			}
			continue
		}
		b.WriteByte(c)
	}
	return strings.Join(strings.Fields(b.String()), " ")
}

// parseMailbox parses one "name <addr>" or "addr (comment)", and the
// obsolete route of "<@a,@b:addr>" (RFC 5322 §4.4), which ENVELOPE keeps
// as the address's adl.
func parseMailbox(s string) (a imap.Address, route string, ok bool) {
	text, comment := stripComments(s)
	text = strings.TrimSpace(text)
	if text == "" {
		return imap.Address{}, "", false
	}
	var name, spec string
	if i := strings.IndexByte(text, '<'); i >= 0 {
		name = phrase(text[:i])
		spec = text[i+1:]
		if j := strings.IndexByte(spec, '>'); j >= 0 {
			spec = spec[:j]
		}
		// Obsolete route (RFC 5322 §4.4): "@a,@b:user@host".
		if strings.HasPrefix(strings.TrimSpace(spec), "@") {
			if j := strings.IndexByte(spec, ':'); j >= 0 {
				route = strings.Join(strings.Fields(spec[:j]), "")
				spec = spec[j+1:]
			}
		}
	} else {
		spec = text
		name = comment
	}
	spec = strings.Join(strings.Fields(spec), "")
	local, host := spec, ""
	if i := strings.LastIndexByte(spec, '@'); i >= 0 {
		local, host = spec[:i], spec[i+1:]
	}
	local = strings.Trim(local, `"`)
	if local == "" {
		local = missingMailbox
	}
	if host == "" {
		host = missingDomain
	}
	return imap.Address{Name: name, Mailbox: local, Host: host}, route, true
}

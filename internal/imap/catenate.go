package imap

// CATENATE (RFC 4469): an APPEND whose message is made of literal text and
// of messages, or parts of messages, the user already has, named by IMAP
// URLs (RFC 5092). The fork reads the command and asks the session for
// each URL's bytes (CatenateURL); this file parses the URL and cuts the
// bytes from the stored message like FETCH BODY[section]<partial> does.
// URLAUTH is not offered, so a URL names this user's own mail only.

import (
	"errors"
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/third_party/imapserver"
)

// imapURL is the part of an IMAP URL (RFC 5092 §6) that names a message
// or a part of one.
type imapURL struct {
	user        string // "" when the URL names none
	mailbox     string // "" for the selected mailbox (a relative URL)
	uidValidity uint32 // 0 when not given
	uid         uint32
	section     *imap.FetchItemBodySection
}

// maxURLLen bounds a CATENATE URL; a message's parts are named in a few
// dozen bytes.
const maxURLLen = 4096

// parseIMAPURL reads an IMAP URL naming a message or a part of one:
// "imap://[user[;AUTH=...]@]host[:port]/mailbox[;UIDVALIDITY=n]/;UID=n
// [/;SECTION=s][/;PARTIAL=o[.l]]", the same from "/mailbox..." on (a
// reference relative to this server), or from ";UID=n" on (relative to
// the selected mailbox). URLAUTH's ";EXPIRE=", ";URLAUTH=" and the rest
// are refused.
func parseIMAPURL(raw string) (*imapURL, error) {
	if len(raw) > maxURLLen {
		return nil, fmt.Errorf("longer than %d bytes", maxURLLen)
	}
	u := &imapURL{}
	rest := raw
	if len(rest) >= 7 && strings.EqualFold(rest[:7], "imap://") {
		rest = rest[7:]
		slash := strings.IndexByte(rest, '/')
		if slash < 0 {
			return nil, errors.New("names a server, not a message")
		}
		server := rest[:slash]
		rest = rest[slash:]
		if at := strings.LastIndexByte(server, '@'); at >= 0 {
			info := server[:at]
			if i := strings.IndexByte(info, ';'); i >= 0 {
				if !strings.HasPrefix(strings.ToUpper(info[i:]), ";AUTH=") {
					return nil, fmt.Errorf("user part %q", info)
				}
				info = info[:i]
			}
			user, err := url.PathUnescape(info)
			if err != nil {
				return nil, fmt.Errorf("user %q: %v", info, err)
			}
			u.user = user
		}
	}
	if strings.HasPrefix(rest, "/") {
		rest = rest[1:]
		// The mailbox runs to the next "/;" (a mailbox name may hold "/").
		end := strings.Index(rest, "/;")
		if end < 0 {
			return nil, errors.New("names a mailbox, not a message (no ;UID=)")
		}
		box := rest[:end]
		rest = rest[end+1:]
		if i := strings.IndexByte(box, ';'); i >= 0 {
			v, ok := strings.CutPrefix(strings.ToUpper(box[i:]), ";UIDVALIDITY=")
			n, err := strconv.ParseUint(v, 10, 32)
			if !ok || err != nil || n == 0 {
				return nil, fmt.Errorf("mailbox parameter %q", box[i:])
			}
			u.uidValidity = uint32(n)
			box = box[:i]
		}
		name, err := url.PathUnescape(box)
		if err != nil || name == "" {
			return nil, fmt.Errorf("mailbox %q", box)
		}
		u.mailbox = name
	}
	// What is left: ";UID=n" then "/;SECTION=..." and "/;PARTIAL=...".
	parts := strings.Split(rest, "/;")
	v, ok := cutPrefixFold(parts[0], ";UID=")
	n, err := strconv.ParseUint(v, 10, 32)
	if !ok || err != nil || n == 0 {
		return nil, fmt.Errorf("%q is not ;UID=n", parts[0])
	}
	u.uid = uint32(n)
	for _, p := range parts[1:] {
		if v, ok := cutPrefixFold(p, "SECTION="); ok && u.section == nil {
			spec, err := url.PathUnescape(v)
			if err != nil {
				return nil, fmt.Errorf("section %q: %v", v, err)
			}
			if u.section, err = parseSection(spec); err != nil {
				return nil, fmt.Errorf("section %q: %v", spec, err)
			}
			continue
		}
		if v, ok := cutPrefixFold(p, "PARTIAL="); ok {
			part, err := parsePartialRange(v)
			if err != nil {
				return nil, fmt.Errorf("partial %q: %v", v, err)
			}
			if u.section == nil {
				u.section = &imap.FetchItemBodySection{}
			}
			if u.section.Partial != nil {
				return nil, errors.New("two ;PARTIAL=")
			}
			u.section.Partial = part
			continue
		}
		return nil, fmt.Errorf("%q (URLAUTH and other parameters are not offered)", ";"+p)
	}
	if u.section == nil {
		u.section = &imap.FetchItemBodySection{}
	}
	return u, nil
}

func cutPrefixFold(s, prefix string) (string, bool) {
	if len(s) < len(prefix) || !strings.EqualFold(s[:len(prefix)], prefix) {
		return s, false
	}
	return s[len(prefix):], true
}

// parsePartialRange reads "offset[.length]" (RFC 5092 §6: the length is
// not zero).
func parsePartialRange(s string) (*imap.SectionPartial, error) {
	off, length, hasLen := strings.Cut(s, ".")
	o, err := strconv.ParseInt(off, 10, 64)
	if err != nil || o < 0 {
		return nil, errors.New("offset is not a number")
	}
	p := &imap.SectionPartial{Offset: o, Size: 1<<63 - 1 - o}
	if hasLen {
		l, err := strconv.ParseInt(length, 10, 64)
		if err != nil || l <= 0 {
			return nil, errors.New("length is not a positive number")
		}
		p.Size = l
	}
	return p, nil
}

// maxSectionDepth bounds the part numbers of a section; FETCH's parser has
// the same kind of bound.
const maxSectionDepth = 64

// parseSection reads a section-spec (RFC 9051 §9 "section-spec"): part
// numbers, then HEADER, HEADER.FIELDS[.NOT] (names), TEXT or, after part
// numbers, MIME.
func parseSection(s string) (*imap.FetchItemBodySection, error) {
	sec := &imap.FetchItemBodySection{}
	for s != "" {
		i := strings.IndexByte(s, '.')
		head := s
		if i >= 0 {
			head = s[:i]
		}
		n, err := strconv.ParseUint(head, 10, 31)
		if err != nil {
			break
		}
		if n == 0 || len(sec.Part) >= maxSectionDepth {
			return nil, fmt.Errorf("part number %q", head)
		}
		sec.Part = append(sec.Part, int(n))
		if i < 0 {
			return sec, nil
		}
		s = s[i+1:]
		if s == "" {
			return nil, errors.New("ends with a dot")
		}
	}
	if s == "" {
		return sec, nil
	}
	word, list, hasList := strings.Cut(s, " ")
	switch strings.ToUpper(word) {
	case "HEADER":
		sec.Specifier = imap.PartSpecifierHeader
	case "TEXT":
		sec.Specifier = imap.PartSpecifierText
	case "MIME":
		if len(sec.Part) == 0 {
			return nil, errors.New("MIME needs part numbers")
		}
		sec.Specifier = imap.PartSpecifierMIME
	case "HEADER.FIELDS", "HEADER.FIELDS.NOT":
		sec.Specifier = imap.PartSpecifierHeader
		if !hasList || !strings.HasPrefix(list, "(") || !strings.HasSuffix(list, ")") {
			return nil, errors.New("HEADER.FIELDS needs a list of names")
		}
		names := strings.Fields(list[1 : len(list)-1])
		if len(names) == 0 {
			return nil, errors.New("HEADER.FIELDS needs a list of names")
		}
		if strings.EqualFold(word, "HEADER.FIELDS") {
			sec.HeaderFields = names
		} else {
			sec.HeaderFieldsNot = names
		}
		return sec, nil
	default:
		return nil, fmt.Errorf("%q is not a section", word)
	}
	if hasList {
		return nil, fmt.Errorf("%q after %s", list, word)
	}
	return sec, nil
}

// CatenateURL implements imapserver.SessionCatenate: the bytes a URL names,
// from this user's mail.
func (s *session) CatenateURL(raw string) ([]byte, error) {
	u, err := parseIMAPURL(raw)
	if err != nil {
		return nil, imapserver.BadURL(raw, "CATENATE: the URL "+err.Error())
	}
	if u.user != "" && !strings.EqualFold(u.user, s.user) {
		return nil, imapserver.BadURL(raw, "CATENATE: the URL names another user's mail")
	}
	var mbID uint64
	var uidValidity uint32
	var id string
	if u.mailbox == "" {
		if s.sel == nil {
			return nil, imapserver.BadURL(raw, "CATENATE: a relative URL needs a selected mailbox")
		}
		mbID, uidValidity = s.sel.id, s.sel.uidValidity
	} else {
		mb, err := s.srv.store.Mailbox(s.ctx(), s.user, u.mailbox)
		if errors.Is(err, mailbox.ErrNoMailbox) {
			return nil, imapserver.BadURL(raw, "CATENATE: no such mailbox")
		}
		if err != nil {
			return nil, storeErr("CATENATE", err)
		}
		mbID, uidValidity = mb.ID, mb.UIDValidity
	}
	if u.uidValidity != 0 && u.uidValidity != uidValidity {
		return nil, imapserver.BadURL(raw, "CATENATE: the mailbox's UIDVALIDITY is not the URL's")
	}
	msgs, err := s.srv.store.Messages(s.ctx(), s.user, mbID)
	if err != nil {
		return nil, storeErr("CATENATE", err)
	}
	for i := range msgs {
		if msgs[i].UID == u.uid {
			id = msgs[i].ID
			break
		}
	}
	if id == "" {
		return nil, imapserver.BadURL(raw, fmt.Sprintf("CATENATE: no message with UID %d", u.uid))
	}
	body, err := s.srv.store.Body(s.ctx(), s.user, id)
	if err != nil {
		return nil, storeErr("CATENATE", err)
	}
	b := bodySection(body, u.section)
	if b == nil && len(u.section.Part) > 0 {
		return nil, imapserver.BadURL(raw, "CATENATE: the message has no such part")
	}
	return b, nil
}

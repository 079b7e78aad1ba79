package migrate

import (
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/emersion/go-imap/utf7"
)

// Separator is the hierarchy delimiter of Quill's mailbox names
// (mailbox.Separator).
const Separator = "/"

// Inbox is the mailbox every user has (RFC 9051 §5.1: case-insensitive).
const Inbox = "INBOX"

// Folder is one folder of a source.
type Folder struct {
	// Name is the folder's name at the source, for messages (decoded from
	// modified UTF-7, with the source's own delimiter).
	Name string
	// Path is the folder's name in Quill's terms: levels joined by "/",
	// before special-use mapping (MapFolders).
	Path string
	// SpecialUse is the source's RFC 6154 attribute (\Sent ...), if any.
	SpecialUse string
	Subscribed bool
	// Src locates the folder at the source: a Maildir directory, an mbox
	// file, an IMAP mailbox name.
	Src string
}

// Mailbox is a mailbox at the destination, as far as mapping needs.
type Mailbox struct {
	Name       string `json:"name"`
	SpecialUse string `json:"special_use,omitempty"`
	Subscribed bool   `json:"subscribed,omitempty"`
}

// wellKnown are the names clients and servers give special-use folders,
// for sources that carry no RFC 6154 attributes (Maildir, mbox, IMAP
// servers without SPECIAL-USE): imapsync's --automap list, in English.
var wellKnown = map[string][]string{
	`\Sent`:    {"Sent", "Sent Items", "Sent Messages", "Sent Mail", "sent-mail"},
	`\Drafts`:  {"Drafts", "Draft"},
	`\Trash`:   {"Trash", "Deleted Items", "Deleted Messages", "Bin"},
	`\Junk`:    {"Junk", "Spam", "Junk E-mail", "Junk Email", "Bulk Mail"},
	`\Archive`: {"Archive", "Archives"},
}

// specialUses are the RFC 6154 uses Quill's users have a mailbox for, in
// a fixed order.
var specialUses = []string{`\Sent`, `\Drafts`, `\Trash`, `\Junk`, `\Archive`}

// MapFolders says which destination mailbox each source folder goes to:
// its Path, except that for each special use the destination has a
// mailbox of (the user's Sent, Drafts, Trash, Junk, Archive), one source
// folder goes there: the first marked with that use, else the first whose
// name is a well-known name of it. The others keep their names, so a
// source with two Sent folders keeps the second as it is.
func MapFolders(src []Folder, dst []Mailbox) []string {
	out := make([]string, len(src))
	for i, f := range src {
		out[i] = f.Path
	}
	for _, use := range specialUses {
		j := slices.IndexFunc(dst, func(m Mailbox) bool { return strings.EqualFold(m.SpecialUse, use) })
		if j < 0 {
			continue
		}
		target := dst[j].Name
		i := slices.IndexFunc(src, func(f Folder) bool { return strings.EqualFold(f.SpecialUse, use) })
		if i < 0 {
			i = slices.IndexFunc(src, func(f Folder) bool {
				return f.SpecialUse == "" && slices.ContainsFunc(wellKnown[use], func(n string) bool { return strings.EqualFold(n, f.Path) })
			})
		}
		if i >= 0 {
			out[i] = target
		}
	}
	return out
}

// MapName turns a source's mailbox name into Quill's: the personal
// namespace prefix (RFC 2342, "INBOX." on Courier-style servers) is
// dropped, levels are split at the source's delimiter (0: the name is
// flat) and joined with "/", a "/" inside a level becomes "_" (it would
// start a level here), empty levels are dropped, and INBOX is spelled
// INBOX in any case.
func MapName(name string, delim rune, prefix string) string {
	if prefix != "" && !strings.EqualFold(name, Inbox) && len(name) > len(prefix) && strings.EqualFold(name[:len(prefix)], prefix) {
		name = name[len(prefix):]
	}
	var levels []string
	if delim == 0 {
		levels = []string{name}
	} else {
		levels = strings.Split(name, string(delim))
	}
	out := levels[:0]
	for _, l := range levels {
		if string(delim) != Separator {
			l = strings.ReplaceAll(l, Separator, "_")
		}
		if l != "" {
			out = append(out, l)
		}
	}
	if len(out) > 0 && strings.EqualFold(out[0], Inbox) {
		out[0] = Inbox
	}
	return strings.Join(out, Separator)
}

// MaildirFolderName returns the name of a Maildir++ folder directory
// (".Foo.Bar", each level in modified UTF-7 as Dovecot and Courier write
// it) in Quill's terms ("Foo/Bar"). Dovecot's listescape form of a "." or
// "\" inside a level ("\2e", "\5c") is decoded too.
func MaildirFolderName(dir string) (string, error) {
	if len(dir) < 2 || dir[0] != '.' || dir == ".." {
		return "", fmt.Errorf("maildir folder %q: not a Maildir++ folder (.Name)", dir)
	}
	var levels []string
	for _, l := range strings.Split(dir[1:], ".") {
		if l == "" {
			return "", fmt.Errorf("maildir folder %q: empty level", dir)
		}
		l, err := unescapeLevel(l)
		if err != nil {
			return "", fmt.Errorf("maildir folder %q: %w", dir, err)
		}
		dec, err := utf7.Encoding.NewDecoder().String(l)
		if err != nil {
			return "", fmt.Errorf("maildir folder %q: modified UTF-7: %w", dir, err)
		}
		if strings.Contains(dec, Separator) {
			dec = strings.ReplaceAll(dec, Separator, "_")
		}
		levels = append(levels, dec)
	}
	if strings.EqualFold(levels[0], Inbox) && len(levels) == 1 {
		levels[0] = Inbox
	}
	return strings.Join(levels, Separator), nil
}

// MaildirDirName is MaildirFolderName's inverse: the directory of a
// Quill mailbox in a Maildir++ tree ("" for INBOX, the tree's root). A "."
// or "\" inside a level, which Maildir++ cannot hold, is written as
// Dovecot's listescape plugin does ("\2e", "\5c").
func MaildirDirName(name string) string {
	if strings.EqualFold(name, Inbox) {
		return ""
	}
	levels := strings.Split(name, Separator)
	for i, l := range levels {
		enc, err := utf7.Encoding.NewEncoder().String(l)
		if err != nil {
			enc = l // the encoder takes any valid UTF-8; names are
		}
		enc = strings.ReplaceAll(enc, `\`, `\5c`)
		levels[i] = strings.ReplaceAll(enc, ".", `\2e`)
	}
	return "." + strings.Join(levels, ".")
}

// unescapeLevel decodes listescape's "\XX" hexadecimal escapes.
func unescapeLevel(l string) (string, error) {
	if !strings.Contains(l, `\`) {
		return l, nil
	}
	var b strings.Builder
	for i := 0; i < len(l); i++ {
		if l[i] != '\\' {
			b.WriteByte(l[i])
			continue
		}
		if i+2 >= len(l) {
			return "", fmt.Errorf(`bad escape %q`, l[i:])
		}
		v, err := strconv.ParseUint(l[i+1:i+3], 16, 8)
		if err != nil {
			return "", fmt.Errorf(`bad escape %q`, l[i:i+3])
		}
		b.WriteByte(byte(v))
		i += 2
	}
	return b.String(), nil
}

// sortFolders puts INBOX first, and the others by name if byName (else
// in the source's order).
func sortFolders(fs []Folder, byName bool) {
	slices.SortStableFunc(fs, func(a, b Folder) int {
		switch {
		case a.Path == Inbox && b.Path != Inbox:
			return -1
		case b.Path == Inbox && a.Path != Inbox:
			return 1
		case byName:
			return strings.Compare(a.Path, b.Path)
		}
		return 0
	})
}

package migrate

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Maildir's info flags (cr.yp.to/proto/maildir.html, in ASCII order) and
// the IMAP flags they stand for. P ("passed", mutt's forwarded) is
// $Forwarded, the keyword Dovecot and Thunderbird use for it.
var maildirFlags = []struct {
	c    byte
	flag string
}{
	{'D', `\Draft`},
	{'F', `\Flagged`},
	{'P', `$Forwarded`},
	{'R', `\Answered`},
	{'S', `\Seen`},
	{'T', `\Deleted`},
}

// KeywordsFile is Dovecot's list of a Maildir folder's keywords: line
// "N name" gives keyword name the letter 'a'+N in file names.
const KeywordsFile = "dovecot-keywords"

// maxKeywords is how many keywords a Maildir folder can name in its file
// names: the letters a to z.
const maxKeywords = 26

// ParseKeywords reads a dovecot-keywords file.
func ParseKeywords(data []byte) []string {
	kw := make([]string, maxKeywords)
	for _, line := range strings.Split(string(data), "\n") {
		n, name, ok := strings.Cut(strings.TrimSpace(line), " ")
		i, err := strconv.Atoi(n)
		if !ok || err != nil || i < 0 || i >= maxKeywords || !ValidFlag(name) {
			continue
		}
		kw[i] = name
	}
	return kw
}

// infoSeps are the characters that start a Maildir file name's info
// part: ':' as the spec says, ';' and '!' where file systems refuse ':'.
const infoSeps = ":;!"

// ParseMaildirName splits a Maildir file name into its unique part and
// the flags of its info ("2," and the flag letters), keyword letters
// looked up in keywords (ParseKeywords; unknown letters are dropped).
// The unique part keeps Dovecot's ",S=" and ",W=" fields.
func ParseMaildirName(name string, keywords []string) (unique string, flags []string) {
	i := strings.LastIndexAny(name, infoSeps)
	if i < 0 || !strings.HasPrefix(name[i+1:], "2,") {
		return name, nil
	}
	unique = name[:i]
	for _, c := range []byte(name[i+3:]) {
		switch {
		case c >= 'a' && c <= 'z':
			if k := int(c - 'a'); k < len(keywords) && keywords[k] != "" {
				flags = append(flags, keywords[k])
			}
		default:
			for _, f := range maildirFlags {
				if f.c == c {
					flags = append(flags, f.flag)
				}
			}
		}
	}
	return unique, CleanFlags(flags)
}

// Keywords assigns Maildir keyword letters to a folder's keywords, as
// Dovecot does in dovecot-keywords.
type Keywords struct {
	Names []string // index is the letter - 'a'
}

// letter returns the keyword's letter, giving it the next free one; false
// when the 26 are taken.
func (k *Keywords) letter(kw string) (byte, bool) {
	for i, n := range k.Names {
		if strings.EqualFold(n, kw) {
			return 'a' + byte(i), true
		}
	}
	for i, n := range k.Names {
		if n == "" {
			k.Names[i] = kw
			return 'a' + byte(i), true
		}
	}
	if len(k.Names) >= maxKeywords {
		return 0, false
	}
	k.Names = append(k.Names, kw)
	return 'a' + byte(len(k.Names)-1), true
}

// File returns the dovecot-keywords file of the keywords.
func (k *Keywords) File() []byte {
	var b bytes.Buffer
	for i, n := range k.Names {
		if n != "" {
			fmt.Fprintf(&b, "%d %s\n", i, n)
		}
	}
	return b.Bytes()
}

// MaildirInfo returns the info part (":2," and letters, in ASCII order) of
// a file with flags, keywords getting letters from k. dropped lists the
// keywords beyond the 26 a folder can name.
func MaildirInfo(flags []string, k *Keywords) (info string, dropped []string) {
	var letters []byte
	for _, f := range CleanFlags(flags) {
		// P is read, not written: Dovecot keeps $Forwarded as a keyword
		// and would not see it in a P.
		std := slices.IndexFunc(maildirFlags, func(m struct {
			c    byte
			flag string
		}) bool {
			return m.c != 'P' && strings.EqualFold(m.flag, f)
		})
		switch {
		case std >= 0:
			letters = append(letters, maildirFlags[std].c)
		case strings.HasPrefix(f, `\`):
			// \Recent, or a flag Maildir has no letter for.
		default:
			c, ok := k.letter(f)
			if !ok {
				dropped = append(dropped, f)
				continue
			}
			letters = append(letters, c)
		}
	}
	slices.Sort(letters)
	return ":2," + string(slices.Compact(letters)), dropped
}

// Maildir is a Maildir++ tree read as a source: the root is INBOX, each
// ".Name" directory beside cur/ new/ tmp/ a folder.
type Maildir struct {
	Root string
}

// Folders lists the tree's folders, INBOX first, subscriptions read from
// Dovecot's subscriptions file (or Courier's courierimapsubscribed).
func (m Maildir) Folders() ([]Folder, error) {
	if !isMaildir(m.Root) {
		return nil, fmt.Errorf("maildir %s: no cur/ and new/ directories (not a Maildir)", m.Root)
	}
	subs := m.subscriptions()
	out := []Folder{{Name: Inbox, Path: Inbox, Src: m.Root, Subscribed: true}}
	entries, err := os.ReadDir(m.Root)
	if err != nil {
		return nil, fmt.Errorf("maildir %s: %w", m.Root, err)
	}
	for _, e := range entries {
		name := e.Name()
		if !strings.HasPrefix(name, ".") || name == "." || name == ".." {
			continue
		}
		dir := filepath.Join(m.Root, name)
		if !isMaildir(dir) {
			continue
		}
		path, err := MaildirFolderName(name)
		if err != nil {
			return nil, err
		}
		out = append(out, Folder{Name: name[1:], Path: path, Src: dir, Subscribed: subs[path]})
	}
	slices.SortStableFunc(out[1:], func(a, b Folder) int { return strings.Compare(a.Path, b.Path) })
	return out, nil
}

func isMaildir(dir string) bool {
	for _, d := range []string{"cur", "new"} {
		if st, err := os.Stat(filepath.Join(dir, d)); err != nil || !st.IsDir() {
			return false
		}
	}
	return true
}

// subscriptions reads the names subscribed to: Dovecot's "subscriptions"
// ("V\t2" and a line per name, levels separated by tabs) or Courier's
// "courierimapsubscribed" (a line per name, "INBOX." and dots).
func (m Maildir) subscriptions() map[string]bool {
	out := map[string]bool{}
	if b, err := os.ReadFile(filepath.Join(m.Root, "subscriptions")); err == nil {
		lines := strings.Split(string(b), "\n")
		if len(lines) > 0 && strings.HasPrefix(lines[0], "V\t") {
			for _, l := range lines[1:] {
				if l != "" {
					out[MapName(l, '\t', "")] = true
				}
			}
		} else {
			// Dovecot 1.x wrote one name a line, in the namespace's terms.
			for _, l := range lines {
				if l = strings.TrimSpace(l); l != "" {
					out[MapName(l, '/', "")] = true
				}
			}
		}
	}
	if b, err := os.ReadFile(filepath.Join(m.Root, "courierimapsubscribed")); err == nil {
		for _, l := range strings.Split(string(b), "\n") {
			if l = strings.TrimSpace(l); l != "" {
				out[MapName(l, '.', "INBOX.")] = true
			}
		}
	}
	return out
}

// List returns a folder's messages: those in Dovecot's dovecot-uidlist
// in its UID order, then the others by name (a unique part begins with
// the delivery time). Each file is read for its key and size as sent.
func (m Maildir) List(f *Folder) ([]Item, error) {
	var keywords []string
	if b, err := os.ReadFile(filepath.Join(f.Src, KeywordsFile)); err == nil {
		keywords = ParseKeywords(b)
	}
	order := uidlistOrder(filepath.Join(f.Src, "dovecot-uidlist"))
	var items []Item
	for _, sub := range []string{"cur", "new"} {
		dir := filepath.Join(f.Src, sub)
		entries, err := os.ReadDir(dir)
		if err != nil {
			return nil, fmt.Errorf("maildir %s: %w", dir, err)
		}
		for _, e := range entries {
			if strings.HasPrefix(e.Name(), ".") || !e.Type().IsRegular() {
				continue
			}
			unique, flags := ParseMaildirName(e.Name(), keywords)
			path := filepath.Join(dir, e.Name())
			st, err := e.Info()
			if err != nil {
				return nil, fmt.Errorf("maildir %s: %w", path, err)
			}
			items = append(items, Item{ID: unique, Path: path, Flags: flags, Date: st.ModTime().UTC().Truncate(time.Second), Size: st.Size()})
		}
	}
	slices.SortStableFunc(items, func(a, b Item) int {
		ua, oka := order[uidlistBase(a.ID)]
		ub, okb := order[uidlistBase(b.ID)]
		switch {
		case oka && okb:
			return int(ua) - int(ub)
		case oka:
			return -1
		case okb:
			return 1
		}
		return strings.Compare(a.ID, b.ID)
	})
	for i := range items {
		raw, err := m.Read(&items[i])
		if err != nil {
			return nil, err
		}
		items[i].Key, items[i].Size = KeyOf(raw), int64(len(raw))
	}
	return items, nil
}

// Read returns a message's bytes as sent: with CRLF line ends.
func (m Maildir) Read(it *Item) ([]byte, error) {
	raw, err := os.ReadFile(it.Path)
	if err != nil {
		return nil, fmt.Errorf("maildir message %s: %w", it.Path, err)
	}
	return ToCRLF(raw), nil
}

// uidlistBase is the part of a unique name Dovecot's uidlist keys on: up
// to its first ',' (the S= and W= fields may be missing there).
func uidlistBase(unique string) string {
	b, _, _ := strings.Cut(unique, ",")
	return b
}

// uidlistOrder reads Dovecot's dovecot-uidlist (a header line, then "UID
// [fields] :name" per message): the UID of each unique name.
func uidlistOrder(path string) map[string]uint32 {
	f, err := os.Open(path)
	if err != nil {
		return nil
	}
	defer f.Close()
	out := map[string]uint32{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	first := true
	for sc.Scan() {
		line := sc.Text()
		if first {
			first = false
			continue
		}
		uidStr, rest, ok := strings.Cut(line, " ")
		uid, err := strconv.ParseUint(uidStr, 10, 32)
		if !ok || err != nil {
			continue
		}
		if i := strings.Index(rest, ":"); i >= 0 {
			out[uidlistBase(rest[i+1:])] = uint32(uid)
		}
	}
	return out
}

// Fetch implements Source.
func (m Maildir) Fetch(f *Folder, items []Item, fn func(Item, []byte, error) error) error {
	for _, it := range items {
		raw, err := m.Read(&it)
		if err := fn(it, raw, err); err != nil {
			return err
		}
	}
	return nil
}

// Close implements Source.
func (m Maildir) Close() error { return nil }

package migrate

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// MaildirWriter writes a Maildir++ tree (`quill export`) that Dovecot
// serves as it is: INBOX is the root, mailbox "Foo/Bar" the directory
// ".Foo.Bar", each message a file in cur/ whose info part holds its flags
// (keywords through dovecot-keywords) and whose mtime is its internal
// date, files with LF line ends (Dovecot's own; it serves them with CRLF).
// Dovecot's subscriptions file lists the subscribed mailboxes, and each
// folder's dovecot-uidlist gives Dovecot the mailbox's UIDVALIDITY and
// UIDs, so a client that knew the mailbox in Quill keeps its cache.
//
// A rerun into the same directory finds each message by its unique name
// (made of the mailbox's UIDVALIDITY and the message's UID): one already
// there only has its flags brought up to date (a rename).
type MaildirWriter struct {
	Root string
	subs []string
}

// ExportHost is the host part of exported file names: fixed, so a rerun
// from another machine finds the files of the first.
const ExportHost = "quill"

// MaildirFolder is one folder being written.
type MaildirFolder struct {
	dir         string
	uidValidity uint32
	kw          Keywords
	have        map[string]string // unique -> file name in cur/ or new/
	uids        map[uint32]string // UID -> file name without info, for dovecot-uidlist
	nextUID     uint32
	// Dropped counts keywords beyond the 26 a Maildir folder can name.
	Dropped int
}

// Folder opens (making it if needed) the folder of a mailbox, whose
// UIDVALIDITY and UIDNEXT Dovecot is to go on with.
func (w *MaildirWriter) Folder(name string, uidValidity, uidNext uint32, subscribed bool) (*MaildirFolder, error) {
	dir := filepath.Join(w.Root, MaildirDirName(name))
	for _, sub := range []string{"cur", "new", "tmp"} {
		if err := os.MkdirAll(filepath.Join(dir, sub), 0o700); err != nil {
			return nil, fmt.Errorf("export %s: %w", dir, err)
		}
	}
	if dir != w.Root {
		// Maildir++: a folder directory holds this empty file.
		if err := os.WriteFile(filepath.Join(dir, "maildirfolder"), nil, 0o600); err != nil {
			return nil, fmt.Errorf("export %s: %w", dir, err)
		}
	}
	if subscribed && !strings.EqualFold(name, Inbox) {
		w.subs = append(w.subs, name)
	}
	f := &MaildirFolder{dir: dir, uidValidity: uidValidity, nextUID: uidNext, have: map[string]string{}, uids: map[uint32]string{}}
	if b, err := os.ReadFile(filepath.Join(dir, KeywordsFile)); err == nil {
		f.kw.Names = ParseKeywords(b)
	}
	for _, sub := range []string{"cur", "new"} {
		entries, err := os.ReadDir(filepath.Join(dir, sub))
		if err != nil {
			return nil, fmt.Errorf("export %s: %w", dir, err)
		}
		for _, e := range entries {
			unique, _ := ParseMaildirName(e.Name(), nil)
			f.have[uidlistBase(unique)] = filepath.Join(sub, e.Name())
		}
	}
	return f, nil
}

// Unique is the unique part of an exported message's file name: its
// internal date (as Maildir names begin), the mailbox's UIDVALIDITY and
// its UID.
func Unique(date time.Time, uidValidity, uid uint32) string {
	return fmt.Sprintf("%d.V%xU%x.%s", date.Unix(), uidValidity, uid, ExportHost)
}

// Has reports whether the message is in the folder already, with its flags
// as its file name tells them.
func (f *MaildirFolder) Has(date time.Time, uid uint32) (flags []string, ok bool) {
	name, ok := f.have[Unique(date, f.uidValidity, uid)]
	if !ok {
		return nil, false
	}
	_, flags = ParseMaildirName(filepath.Base(name), f.kw.Names)
	return flags, true
}

// Write stores one message (raw as Quill keeps it, CRLF) with its flags,
// its mtime the internal date; a message there already (Has) is only
// renamed to its new flags, and raw may then be nil.
func (f *MaildirFolder) Write(uid uint32, raw []byte, flags []string, date time.Time) error {
	unique := Unique(date, f.uidValidity, uid)
	info, dropped := MaildirInfo(flags, &f.kw)
	f.Dropped += len(dropped)
	if old, ok := f.have[unique]; ok {
		base, _ := ParseMaildirName(filepath.Base(old), nil)
		f.note(uid, base)
		newName := filepath.Join("cur", base+info)
		if newName != old {
			if err := os.Rename(filepath.Join(f.dir, old), filepath.Join(f.dir, newName)); err != nil {
				return fmt.Errorf("export %s: %w", f.dir, err)
			}
			f.have[unique] = newName
		}
		return nil
	}
	if raw == nil {
		return fmt.Errorf("export %s: message UID %d: no bytes to write", f.dir, uid)
	}
	lf := ToLF(raw)
	// S= is the file's size, W= its size with CRLF line ends (RFC822.SIZE),
	// which Dovecot takes from the name instead of reading the file.
	base := fmt.Sprintf("%s,S=%d,W=%d", unique, len(lf), len(lf)+bytes.Count(lf, []byte("\n")))
	name := base + info
	f.note(uid, base)
	tmp := filepath.Join(f.dir, "tmp", name)
	if err := os.WriteFile(tmp, lf, 0o600); err != nil {
		return fmt.Errorf("export %s: %w", tmp, err)
	}
	if err := os.Chtimes(tmp, date, date); err != nil {
		return fmt.Errorf("export %s: %w", tmp, err)
	}
	if err := os.Rename(tmp, filepath.Join(f.dir, "cur", name)); err != nil {
		return fmt.Errorf("export %s: %w", tmp, err)
	}
	f.have[unique] = filepath.Join("cur", name)
	return nil
}

// note records a message's file name without its info for the uidlist.
func (f *MaildirFolder) note(uid uint32, base string) {
	f.uids[uid] = base
	f.nextUID = max(f.nextUID, uid+1)
}

// Close writes the folder's dovecot-keywords and dovecot-uidlist (version
// 3: "3 V<uidvalidity> N<next uid>", then "<uid> :<name>" per message, in
// UID order), an empty folder's too, so Dovecot keeps its UIDVALIDITY.
func (f *MaildirFolder) Close() error {
	if kw := f.kw.File(); len(kw) > 0 {
		if err := os.WriteFile(filepath.Join(f.dir, KeywordsFile), kw, 0o600); err != nil {
			return fmt.Errorf("export %s: %w", f.dir, err)
		}
	}
	if f.uidValidity == 0 {
		return nil // not known: Dovecot makes its own
	}
	uids := make([]uint32, 0, len(f.uids))
	for u := range f.uids {
		uids = append(uids, u)
	}
	sort.Slice(uids, func(i, j int) bool { return uids[i] < uids[j] })
	var b bytes.Buffer
	fmt.Fprintf(&b, "3 V%d N%d\n", f.uidValidity, f.nextUID)
	for _, u := range uids {
		fmt.Fprintf(&b, "%d :%s\n", u, f.uids[u])
	}
	return os.WriteFile(filepath.Join(f.dir, "dovecot-uidlist"), b.Bytes(), 0o600)
}

// Close writes the subscriptions (Dovecot's format: "V\t2", an empty
// line, then each name with tabs between its levels) and flushes the
// whole tree to disk with one syncfs: an export is a copy that a rerun
// completes, so it is made durable once, at the end, rather than with a
// fsync per file.
func (w *MaildirWriter) Close() error {
	var b bytes.Buffer
	b.WriteString("V\t2\n\n")
	sort.Strings(w.subs)
	for _, s := range w.subs {
		b.WriteString(strings.ReplaceAll(s, Separator, "\t") + "\n")
	}
	if err := os.WriteFile(filepath.Join(w.Root, "subscriptions"), b.Bytes(), 0o600); err != nil {
		return fmt.Errorf("export %s: %w", w.Root, err)
	}
	d, err := os.Open(w.Root)
	if err != nil {
		return fmt.Errorf("export %s: %w", w.Root, err)
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return fmt.Errorf("export %s: sync: %w", w.Root, err)
	}
	return nil
}

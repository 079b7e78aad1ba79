package migrate

import (
	"bufio"
	"bytes"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"net/mail"
	"os"
	"path/filepath"
	"strings"
	"time"
)

// Mbox reads mbox files (mboxrd, and mboxo, which it reads the same way):
// Path is one file, imported into Folder (default INBOX), or a directory
// whose files are folders named by their paths (Thunderbird's "Foo.sbd"
// directories and Apple Mail's "Foo.mbox/mbox" are unwrapped; a top-level
// "Inbox" in any case is INBOX). A file is read one message at a time;
// a message over MaxSize (0: no limit) is listed but not read.
type Mbox struct {
	Path    string
	Folder  string
	MaxSize int64
}

// mboxPrivate are the header fields mbox keeps a message's state in, not
// part of the message as sent: the flags are read from them and the fields
// removed, as Dovecot and other servers hide them when they serve an mbox
// (so the bytes imported are the bytes a client fetched there).
var mboxPrivate = []string{"Status", "X-Status", "X-Keywords", "X-UID", "X-IMAP", "X-IMAPbase", "Content-Length"}

// Folders implements Source.
func (m *Mbox) Folders() ([]Folder, error) {
	st, err := os.Stat(m.Path)
	if err != nil {
		return nil, fmt.Errorf("mbox %s: %w", m.Path, err)
	}
	if !st.IsDir() {
		name := m.Folder
		if name == "" {
			name = Inbox
		}
		if ok, err := isMbox(m.Path); err != nil || !ok {
			return nil, fmt.Errorf("mbox %s: not an mbox file (it does not begin with a \"From \" line)", m.Path)
		}
		return []Folder{{Name: filepath.Base(m.Path), Path: MapName(name, '/', ""), Src: m.Path, Subscribed: true}}, nil
	}
	var out []Folder
	err = filepath.WalkDir(m.Path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return err
		}
		if strings.HasPrefix(d.Name(), ".") && p != m.Path {
			if d.IsDir() {
				return filepath.SkipDir
			}
			return nil
		}
		if !d.Type().IsRegular() || !mboxFileName(d.Name()) {
			return nil
		}
		if ok, err := isMbox(p); err != nil || !ok {
			return err
		}
		rel, _ := filepath.Rel(m.Path, p)
		out = append(out, Folder{Name: rel, Path: mboxFolderName(rel), Src: p, Subscribed: true})
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("mbox %s: %w", m.Path, err)
	}
	sortFolders(out, true)
	return out, nil
}

// mboxFileName reports whether a file in an mbox directory may be an mbox:
// not one of the indexes mail programs keep beside them.
func mboxFileName(name string) bool {
	for _, ext := range []string{".msf", ".dat", ".json", ".idx", ".ibex", ".toc", ".plist", ".sqlite", ".db"} {
		if strings.HasSuffix(strings.ToLower(name), ext) {
			return false
		}
	}
	return true
}

// isMbox reports whether a file begins with a From_ line, or is empty (an
// empty folder).
func isMbox(path string) (bool, error) {
	f, err := os.Open(path)
	if err != nil {
		return false, err
	}
	defer f.Close()
	var b [5]byte
	n, _ := io.ReadFull(f, b[:])
	return n == 0 || string(b[:n]) == "From ", nil
}

// mboxFolderName names the folder of a file at rel in an mbox directory.
func mboxFolderName(rel string) string {
	parts := strings.Split(filepath.ToSlash(rel), "/")
	// Apple Mail: Foo.mbox/mbox.
	if n := len(parts); n >= 2 && parts[n-1] == "mbox" && strings.HasSuffix(parts[n-2], ".mbox") {
		parts = parts[:n-1]
	}
	for i, p := range parts {
		p = strings.TrimSuffix(p, ".sbd")
		parts[i] = strings.TrimSuffix(p, ".mbox")
	}
	return MapName(strings.Join(parts, "/"), '/', "")
}

// List implements Source: one pass over the file, one message in memory
// at a time.
func (m *Mbox) List(f *Folder) ([]Item, error) {
	file, err := os.Open(f.Src)
	if err != nil {
		return nil, fmt.Errorf("mbox %s: %w", f.Src, err)
	}
	defer file.Close()
	var mtime time.Time
	if st, err := file.Stat(); err == nil {
		mtime = st.ModTime().UTC().Truncate(time.Second)
	}
	var items []Item
	err = ScanMbox(file, m.MaxSize, func(offset int64, span []byte, spanLen int64) error {
		it := Item{ID: fmt.Sprintf("%s at byte %d", filepath.Base(f.Src), offset), Path: f.Src, Offset: offset, Span: spanLen, Size: spanLen}
		if span != nil {
			raw, flags, date := ParseMboxMessage(span)
			if date.IsZero() {
				date = mtime
			}
			it.Key, it.Size, it.Flags, it.Date = KeyOf(raw), int64(len(raw)), flags, date
		}
		items = append(items, it)
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("mbox %s: %w", f.Src, err)
	}
	return items, nil
}

// Fetch implements Source.
func (m *Mbox) Fetch(f *Folder, items []Item, fn func(Item, []byte, error) error) error {
	file, err := os.Open(f.Src)
	if err != nil {
		return fmt.Errorf("mbox %s: %w", f.Src, err)
	}
	defer file.Close()
	for _, it := range items {
		var raw []byte
		var err error
		if m.MaxSize > 0 && it.Span > m.MaxSize {
			err = fmt.Errorf("%w: %d bytes, the limit is %d", ErrTooBig, it.Span, m.MaxSize)
		} else {
			span := make([]byte, it.Span)
			if _, err = file.ReadAt(span, it.Offset); err == nil {
				raw, _, _ = ParseMboxMessage(span)
			} else {
				err = fmt.Errorf("mbox %s at byte %d: %w", f.Src, it.Offset, err)
			}
		}
		if err := fn(it, raw, err); err != nil {
			return err
		}
	}
	return nil
}

// Close implements Source.
func (m *Mbox) Close() error { return nil }

// ErrTooBig is a message over the destination's size limit.
var ErrTooBig = errors.New("message too big")

// ScanMbox finds the messages of an mbox: each begins with a From_ line
// at the start of the file or after an empty line (mboxrd and mboxo quote
// "From " at the start of other lines). fn gets each message's offset,
// its bytes from the From_ line on (nil when they are more than max, 0:
// no limit) and their length. Lines of any length are read in pieces.
func ScanMbox(r io.Reader, max int64, fn func(offset int64, span []byte, spanLen int64) error) error {
	br := bufio.NewReaderSize(r, 64<<10)
	var (
		off, start int64 = 0, -1
		buf        []byte
		tooBig     bool
		lineStart  = true
		prevBlank  = true
	)
	emit := func() error {
		if start < 0 {
			return nil
		}
		span := buf
		if tooBig {
			span = nil
		}
		return fn(start, span, off-start)
	}
	for {
		line, err := br.ReadSlice('\n')
		if len(line) > 0 {
			if lineStart && prevBlank && bytes.HasPrefix(line, []byte("From ")) {
				if err := emit(); err != nil {
					return err
				}
				start, buf, tooBig = off, buf[:0], false
			}
			if start >= 0 && !tooBig {
				if max > 0 && int64(len(buf)+len(line)) > max {
					tooBig, buf = true, nil
				} else {
					buf = append(buf, line...)
				}
			}
			if err == nil {
				prevBlank = lineStart && (len(line) == 1 || (len(line) == 2 && line[0] == '\r'))
			}
			off += int64(len(line))
			lineStart = err == nil
		}
		switch {
		case err == nil, errors.Is(err, bufio.ErrBufferFull):
		case errors.Is(err, io.EOF):
			return emit()
		default:
			return err
		}
	}
}

// ParseMboxMessage turns one message of an mbox (from its From_ line to
// the next) into the message as sent: without the From_ line and the
// empty line that separates it from the next, ">From " lines unquoted
// (mboxrd: one '>' less), the mbox state fields (mboxPrivate) removed and
// read as flags, CRLF line ends. date is the From_ line's, else the Date
// field's, else zero.
func ParseMboxMessage(span []byte) (raw []byte, flags []string, date time.Time) {
	first, rest, _ := bytes.Cut(span, []byte("\n"))
	date = fromLineDate(string(bytes.TrimRight(first, "\r")))
	switch {
	case bytes.HasSuffix(rest, []byte("\r\n\r\n")):
		rest = rest[:len(rest)-2]
	case bytes.HasSuffix(rest, []byte("\n\n")):
		rest = rest[:len(rest)-1]
	}
	out := make([]byte, 0, len(rest)+len(rest)/40)
	inHeader, dropping := true, false
	var dateField string
	for len(rest) > 0 {
		var line []byte
		if i := bytes.IndexByte(rest, '\n'); i >= 0 {
			line, rest = rest[:i+1], rest[i+1:]
		} else {
			line, rest = rest, nil
		}
		if inHeader {
			trimmed := bytes.TrimRight(line, "\r\n")
			switch {
			case len(trimmed) == 0:
				inHeader, dropping = false, false
			case trimmed[0] == ' ' || trimmed[0] == '\t':
				if dropping {
					continue
				}
			default:
				name, value, _ := bytes.Cut(trimmed, []byte(":"))
				dropping = false
				for _, p := range mboxPrivate {
					if strings.EqualFold(string(bytes.TrimSpace(name)), p) {
						dropping = true
						flags = append(flags, mboxFlags(p, string(value))...)
					}
				}
				if dropping {
					continue
				}
				if strings.EqualFold(string(name), "Date") {
					dateField = string(value)
				}
			}
		}
		if unquote(line) {
			line = line[1:]
		}
		out = append(out, line...)
	}
	if date.IsZero() && dateField != "" {
		if d, err := mail.ParseDate(strings.TrimSpace(dateField)); err == nil {
			date = d.UTC()
		}
	}
	return ToCRLF(out), CleanFlags(flags), date
}

// unquote reports whether a line is an mboxrd-quoted From_ line: ">From ",
// ">>From " and so on.
func unquote(line []byte) bool {
	i := 0
	for i < len(line) && line[i] == '>' {
		i++
	}
	return i > 0 && bytes.HasPrefix(line[i:], []byte("From "))
}

// mboxFlags reads the flags of an mbox state field: Status R (read), and
// X-Status A (answered), F (flagged), T (draft), D (deleted) as mutt,
// Pine and Dovecot write them; X-Keywords lists keywords.
func mboxFlags(field, value string) []string {
	var out []string
	switch strings.ToLower(field) {
	case "status":
		if strings.ContainsRune(value, 'R') {
			out = append(out, `\Seen`)
		}
	case "x-status":
		for c, f := range map[rune]string{'A': `\Answered`, 'F': `\Flagged`, 'T': `\Draft`, 'D': `\Deleted`} {
			if strings.ContainsRune(value, c) {
				out = append(out, f)
			}
		}
	case "x-keywords":
		out = append(out, strings.FieldsFunc(value, func(r rune) bool { return r == ' ' || r == ',' || r == '\t' })...)
	}
	return out
}

// fromLineDates are the layouts of a From_ line's date (asctime, as
// written by most programs, some with a zone).
var fromLineDates = []string{
	"Mon Jan _2 15:04:05 2006",
	"Mon Jan _2 15:04:05 2006 -0700",
	"Mon Jan _2 15:04:05 MST 2006",
	"Mon Jan _2 15:04 2006",
}

// fromLineDate reads the date of a From_ line ("From sender date"); the
// sender may be missing or hold spaces in quotes, so the date is looked
// for in the line's last fields.
func fromLineDate(line string) time.Time {
	f := strings.Fields(strings.TrimPrefix(line, "From "))
	for _, n := range []int{5, 6} {
		if len(f) < n {
			continue
		}
		s := strings.Join(f[len(f)-n:], " ")
		for _, layout := range fromLineDates {
			if d, err := time.Parse(layout, s); err == nil {
				return d.UTC()
			}
		}
	}
	return time.Time{}
}

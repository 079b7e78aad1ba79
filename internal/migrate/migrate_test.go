package migrate

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"
	"time"
)

func TestDecide(t *testing.T) {
	it := func(key string, uid uint32, flags ...string) Item { return Item{Key: key, UID: uid, Flags: flags} }
	cases := []struct {
		name     string
		src, dst []Item
		want     Plan
	}{
		{"empty destination: everything", []Item{it("a", 1), it("b", 2)}, nil, Plan{Append: []int{0, 1}}},
		{"rerun: nothing", []Item{it("a", 1, `\Seen`), it("b", 2)}, []Item{it("a", 7, `\seen`), it("b", 8)}, Plan{Same: 2}},
		{"new mail at the source", []Item{it("a", 1), it("b", 2), it("c", 3)}, []Item{it("a", 7), it("b", 8)},
			Plan{Append: []int{2}, Same: 2}},
		{"a flag changed at the source", []Item{it("a", 1, `\Seen`, `\Flagged`), it("b", 2)}, []Item{it("a", 7, `\Seen`), it("b", 8)},
			Plan{Flags: []FlagChange{{UID: 7, Flags: []string{`\Flagged`, `\Seen`}}}, Same: 1}},
		{"a flag removed at the source", []Item{it("a", 1)}, []Item{it("a", 7, `\Seen`, `\Recent`)},
			Plan{Flags: []FlagChange{{UID: 7, Flags: []string{}}}}},
		{"duplicates at the source are kept as a multiset", []Item{it("a", 1), it("a", 2), it("a", 3)}, []Item{it("a", 7)},
			Plan{Append: []int{1, 2}, Same: 1}},
		{"destination-only messages are left alone", []Item{it("a", 1)}, []Item{it("z", 5), it("a", 7)}, Plan{Same: 1}},
		{"\\Recent never counts", []Item{it("a", 1, `\Recent`)}, []Item{it("a", 7)}, Plan{Same: 1}},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := Decide(c.src, c.dst)
			if fmt.Sprint(got) != fmt.Sprint(c.want) {
				t.Errorf("Decide = %+v, want %+v", got, c.want)
			}
		})
	}
}

func TestKeySameAcrossLineEnds(t *testing.T) {
	lf := []byte("Subject: x\nFrom: a@b\n\nbody\n")
	crlf := ToCRLF(lf)
	if string(crlf) != "Subject: x\r\nFrom: a@b\r\n\r\nbody\r\n" {
		t.Fatalf("ToCRLF = %q", crlf)
	}
	if string(ToLF(crlf)) != string(lf) {
		t.Fatalf("ToLF(ToCRLF) = %q", ToLF(crlf))
	}
	// IMAP's BODY[HEADER] holds the empty line; HeaderOf keeps it too: the
	// key is the same either way.
	if KeyOf(crlf) != Key([]byte("Subject: x\r\nFrom: a@b\r\n\r\n")) || KeyOf(crlf) != Key([]byte("Subject: x\r\nFrom: a@b")) {
		t.Error("key of the whole message differs from the key of its header section")
	}
	if KeyOf(crlf) == KeyOf([]byte("Subject: y\r\nFrom: a@b\r\n\r\nbody\r\n")) {
		t.Error("messages with other headers share a key")
	}
	if ToCRLF(crlf) == nil || &ToCRLF(crlf)[0] != &crlf[0] {
		t.Error("ToCRLF copied a message that had no bare LF")
	}
}

func TestCleanFlags(t *testing.T) {
	got := CleanFlags([]string{`\SEEN`, `\Recent`, `$Label1`, `\seen`, `$label1`, `bad flag`, `\Custom`, `Junk`})
	want := []string{`$Label1`, `\Seen`, `Junk`} // sorted by lower case: '\' < 'j'
	if !slices.Equal(got, want) {
		t.Errorf("CleanFlags = %q, want %q", got, want)
	}
}

func TestMapName(t *testing.T) {
	cases := []struct {
		name   string
		delim  rune
		prefix string
		want   string
	}{
		{"INBOX", '/', "", "INBOX"},
		{"inbox", '.', "INBOX.", "INBOX"},
		{"INBOX.Sent", '.', "INBOX.", "Sent"},
		{"INBOX.Foo.Bar", '.', "INBOX.", "Foo/Bar"},
		{"Foo.Bar", '.', "", "Foo/Bar"},
		{"a/b.c", '.', "", "a_b/c"},
		{"Foo/Bar", '/', "", "Foo/Bar"},
		{"Flat/Name", 0, "", "Flat_Name"},
		{"a..b", '.', "", "a/b"},
		{"Inbox/Sub", '/', "", "INBOX/Sub"},
	}
	for _, c := range cases {
		if got := MapName(c.name, c.delim, c.prefix); got != c.want {
			t.Errorf("MapName(%q, %q, %q) = %q, want %q", c.name, c.delim, c.prefix, got, c.want)
		}
	}
}

func TestMaildirNames(t *testing.T) {
	for dir, name := range map[string]string{
		".Sent":           "Sent",
		".Foo.Bar":        "Foo/Bar",
		".Caf&AOk-":       "Café",
		".a\\2eb.c":       "a.b/c",
		".&ZeVnLIqe-":     "日本語",
		".back\\5cslash":  `back\slash`,
		".Amp &- Sand.x":  "Amp & Sand/x",
		".INBOX.Children": "INBOX/Children",
	} {
		got, err := MaildirFolderName(dir)
		if err != nil || got != name {
			t.Errorf("MaildirFolderName(%q) = %q, %v; want %q", dir, got, err, name)
		}
		if back := MaildirDirName(name); back != dir {
			t.Errorf("MaildirDirName(%q) = %q, want %q", name, back, dir)
		}
	}
	for _, bad := range []string{".", "..", "Sent", ".a..b", ".x\\zz", ".x\\2"} {
		if got, err := MaildirFolderName(bad); err == nil {
			t.Errorf("MaildirFolderName(%q) = %q, want an error", bad, got)
		}
	}
	if MaildirDirName("inbox") != "" {
		t.Error("INBOX is not the root")
	}
}

func TestMapFolders(t *testing.T) {
	dst := []Mailbox{{Name: "INBOX"}, {Name: "Sent", SpecialUse: `\Sent`}, {Name: "Drafts", SpecialUse: `\Drafts`},
		{Name: "Trash", SpecialUse: `\Trash`}, {Name: "Junk", SpecialUse: `\Junk`}, {Name: "Archive", SpecialUse: `\Archive`}}
	src := []Folder{
		{Path: "INBOX"},
		{Path: "Sent Items"},                      // a well-known name: Sent
		{Path: "Gesendet", SpecialUse: `\Sent`},   // marked: wins over the name
		{Path: "Deleted Items"},                   // Trash by name
		{Path: "Spam"},                            // Junk by name
		{Path: "Entwürfe", SpecialUse: `\Drafts`}, // Drafts by attribute
		{Path: "Work/Drafts"},                     // not a top-level name: kept
	}
	got := MapFolders(src, dst)
	want := []string{"INBOX", "Sent Items", "Sent", "Trash", "Junk", "Drafts", "Work/Drafts"}
	if !slices.Equal(got, want) {
		t.Errorf("MapFolders = %q, want %q", got, want)
	}
	// A user who renamed Sent gets it by the attribute.
	dst[1].Name = "Sent Mail"
	if got := MapFolders([]Folder{{Path: "Sent"}}, dst); got[0] != "Sent Mail" {
		t.Errorf("MapFolders onto a renamed Sent = %q", got)
	}
}

func TestParseMaildirName(t *testing.T) {
	kw := ParseKeywords([]byte("0 Junk\n1 $Label1\nbad line\n27 tooFar\n3 $Forwarded\n"))
	cases := []struct {
		name, unique string
		flags        []string
	}{
		{"1795834138.M1P2.vm,S=18,W=21:2,Sab", "1795834138.M1P2.vm,S=18,W=21", []string{`$Label1`, `\Seen`, `Junk`}},
		{"1.M1.host:2,DFPRST", "1.M1.host", []string{`$Forwarded`, `\Answered`, `\Deleted`, `\Draft`, `\Flagged`, `\Seen`}},
		{"1.M1.host", "1.M1.host", nil},
		{"1.M1.host:2,", "1.M1.host", []string{}},
		{"1.M1.host!2,S", "1.M1.host", []string{`\Seen`}},
		{"1.M1.host:1,S", "1.M1.host:1,S", nil},
		{"1.M1.host:2,Sz", "1.M1.host", []string{`\Seen`}}, // z has no keyword
	}
	for _, c := range cases {
		u, f := ParseMaildirName(c.name, kw)
		if u != c.unique || fmt.Sprint(f) != fmt.Sprint(c.flags) {
			t.Errorf("ParseMaildirName(%q) = %q, %q; want %q, %q", c.name, u, f, c.unique, c.flags)
		}
	}
}

func TestMaildirInfoRoundTrip(t *testing.T) {
	var k Keywords
	flags := []string{`\Seen`, `\Answered`, `$Label1`, `Work`, `\Recent`, `$Forwarded`}
	info, dropped := MaildirInfo(flags, &k)
	if info != ":2,RSabc" || len(dropped) != 0 {
		t.Fatalf("MaildirInfo = %q, %q", info, dropped)
	}
	_, back := ParseMaildirName("x"+info, ParseKeywords(k.File()))
	if !SameFlags(back, flags) {
		t.Errorf("round trip: %q, want %q", back, flags)
	}
	for i := range 30 {
		MaildirInfo([]string{fmt.Sprintf("kw%d", i)}, &k)
	}
	if _, dropped := MaildirInfo([]string{"one-too-many"}, &k); len(dropped) != 1 {
		t.Errorf("the 27th keyword was not dropped: %q", dropped)
	}
}

func TestParseMboxMessage(t *testing.T) {
	span := "From bob@example.org Mon Jan  2 15:04:05 2006\n" +
		"Status: RO\n" +
		"X-Status: AF\n" +
		"X-Keywords: $Label1 Work\n" +
		"Subject: hi\n" +
		"Content-Length: 99\n" +
		" continued\n" +
		"\n" +
		">From the start of a line\n" +
		">>From twice\n" +
		"From me, not a separator here\n" +
		"Status: in the body stays\n" +
		"\n"
	raw, flags, date := ParseMboxMessage([]byte(span))
	want := "Subject: hi\r\n\r\nFrom the start of a line\r\n>From twice\r\nFrom me, not a separator here\r\nStatus: in the body stays\r\n"
	if string(raw) != want {
		t.Errorf("raw = %q\nwant  %q", raw, want)
	}
	if !SameFlags(flags, []string{`\Seen`, `\Answered`, `\Flagged`, `$Label1`, `Work`}) {
		t.Errorf("flags = %q", flags)
	}
	if !date.Equal(time.Date(2006, 1, 2, 15, 4, 5, 0, time.UTC)) {
		t.Errorf("date = %v", date)
	}
	// No date on the From_ line: the Date field's.
	_, _, date = ParseMboxMessage([]byte("From MAILER-DAEMON\nDate: Tue, 3 Feb 2015 10:00:00 +0100\n\nx\n"))
	if !date.Equal(time.Date(2015, 2, 3, 9, 0, 0, 0, time.UTC)) {
		t.Errorf("date from the Date field = %v", date)
	}
}

func TestScanMbox(t *testing.T) {
	long := strings.Repeat("x", 200<<10) // a line longer than the reader's buffer
	data := "From a Mon Jan  2 15:04:05 2006\nSubject: 1\n\nbody\nFrom here is no separator (no empty line before)\n\n" +
		"From b Mon Jan  2 15:04:06 2006\nSubject: 2\n\n" + long + "\n\n" +
		"From c Mon Jan  2 15:04:07 2006\r\nSubject: 3\r\n\r\nlast"
	type span struct {
		off  int64
		n    int64
		read bool
	}
	var got []span
	var subjects []string
	err := ScanMbox(strings.NewReader(data), 100<<10, func(off int64, b []byte, n int64) error {
		got = append(got, span{off, n, b != nil})
		if b != nil {
			raw, _, _ := ParseMboxMessage(b)
			subjects = append(subjects, string(HeaderOf(raw)))
		}
		return nil
	})
	if err != nil {
		t.Fatal(err)
	}
	if len(got) != 3 || got[0].off != 0 || !got[0].read || got[1].read || !got[2].read {
		t.Fatalf("spans = %+v", got)
	}
	if int(got[2].off+got[2].n) != len(data) || got[1].off != got[0].n || got[2].off != got[1].off+got[1].n {
		t.Errorf("spans do not tile the file: %+v (len %d)", got, len(data))
	}
	if !slices.Equal(subjects, []string{"Subject: 1\r\n\r\n", "Subject: 3\r\n\r\n"}) {
		t.Errorf("subjects = %q", subjects)
	}
}

// TestMaildirExportImport writes a Maildir the way `quill export` does and
// reads it back the way `quill import maildir` does.
func TestMaildirExportImport(t *testing.T) {
	root := t.TempDir()
	date := time.Date(2024, 5, 6, 7, 8, 9, 0, time.UTC)
	msgs := []struct {
		box   string
		uid   uint32
		raw   string
		flags []string
	}{
		{"INBOX", 1, "Subject: one\r\n\r\nbody\r\n", []string{`\Seen`, `$Label1`}},
		{"INBOX", 2, "Subject: two\r\n\r\n8-bit: \xe9t\xe9\r\n", nil},
		{"Foo/Bar", 5, "Subject: three\r\n\r\nx\r\n", []string{`\Flagged`, `\Draft`}},
		{"Café", 9, "Subject: four\r\n\r\ny\r\n", []string{`\Answered`}},
	}
	write := func(changeFlags bool) {
		w := &MaildirWriter{Root: root}
		folders := map[string]*MaildirFolder{}
		for _, m := range msgs {
			f := folders[m.box]
			if f == nil {
				var err error
				if f, err = w.Folder(m.box, 77, 1, m.box != "Café"); err != nil {
					t.Fatal(err)
				}
				folders[m.box] = f
			}
			flags := m.flags
			if changeFlags && m.uid == 1 {
				flags = []string{`\Deleted`}
			}
			raw := []byte(m.raw)
			if _, ok := f.Has(date, m.uid); ok {
				raw = nil
			}
			if err := f.Write(m.uid, raw, flags, date); err != nil {
				t.Fatal(err)
			}
		}
		for _, f := range folders {
			if err := f.Close(); err != nil {
				t.Fatal(err)
			}
		}
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	write(false)
	write(true) // a rerun: nothing doubled, one rename
	src := Maildir{Root: root}
	folders, err := src.Folders()
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	subscribed := map[string]bool{}
	for _, f := range folders {
		names = append(names, f.Path)
		subscribed[f.Path] = f.Subscribed
	}
	if !slices.Equal(names, []string{"INBOX", "Café", "Foo/Bar"}) {
		t.Fatalf("folders = %q", names)
	}
	if !subscribed["Foo/Bar"] || subscribed["Café"] {
		t.Errorf("subscriptions = %v", subscribed)
	}
	got := map[string]string{}
	for i := range folders {
		items, err := src.List(&folders[i])
		if err != nil {
			t.Fatal(err)
		}
		err = src.Fetch(&folders[i], items, func(it Item, raw []byte, err error) error {
			if err != nil {
				return err
			}
			if !it.Date.Equal(date) || it.Key != KeyOf(raw) || it.Size != int64(len(raw)) {
				t.Errorf("%s: date %v key %s size %d", it.Path, it.Date, it.Key, it.Size)
			}
			got[folders[i].Path+" "+string(raw)] = strings.Join(CleanFlags(it.Flags), " ")
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
	}
	for _, m := range msgs {
		flags := m.flags
		if m.uid == 1 {
			flags = []string{`\Deleted`}
		}
		key := m.box + " " + m.raw
		if f, ok := got[key]; !ok || f != strings.Join(CleanFlags(flags), " ") {
			t.Errorf("%s UID %d: read back with flags %q (found %v), want %q", m.box, m.uid, f, ok, CleanFlags(flags))
		}
	}
	if len(got) != len(msgs) {
		t.Errorf("read back %d messages, want %d", len(got), len(msgs))
	}
	uidlist, _ := os.ReadFile(filepath.Join(root, "dovecot-uidlist"))
	if !bytes.HasPrefix(uidlist, []byte("3 V77 N3\n1 :")) {
		t.Errorf("dovecot-uidlist = %q", uidlist)
	}
}

func TestParseSourceURL(t *testing.T) {
	u, err := ParseSourceURL("imaps://bob%40example.org@mail.example.org")
	if err != nil || !u.TLS || u.Addr != "mail.example.org:993" || u.Username != "bob@example.org" {
		t.Errorf("ParseSourceURL = %+v, %v", u, err)
	}
	u, err = ParseSourceURL("imap://bob@127.0.0.1:1143")
	if err != nil || u.TLS || u.Addr != "127.0.0.1:1143" || !loopback(u.Host) {
		t.Errorf("ParseSourceURL = %+v, %v", u, err)
	}
	for _, bad := range []string{"imap://bob:secret@host", "pop3://bob:secret@host", "imap://host", "imaps://bob:secret@host/INBOX", "imap://bob:secret@h\x00"} {
		_, err := ParseSourceURL(bad)
		if err == nil {
			t.Errorf("ParseSourceURL(%q) took it", bad)
		} else if strings.Contains(err.Error(), "secret") {
			t.Errorf("ParseSourceURL(%q): the error shows the password: %v", bad, err)
		}
	}
}

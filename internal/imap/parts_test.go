package imap

import (
	"bytes"
	"context"
	"encoding/base64"
	"errors"
	"fmt"
	"io"
	"net"
	"reflect"
	"strings"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/internal/mimepart"
	"github.com/quillmail/quill/internal/proxy"
	"github.com/quillmail/quill/third_party/imapserver"
)

// partsCorpus is messages whose parts are laid out the ways mail in the
// wild lays them out, and the ways it gets them wrong.
var partsCorpus = map[string]string{
	"nested": "From: a@x.org\r\nSubject: nested\r\nContent-Type: multipart/mixed; boundary=\"outer\"\r\n\r\n" +
		"preamble line\r\n--outer\r\nContent-Type: multipart/alternative; boundary=inner\r\n\r\n" +
		"--inner\r\nContent-Type: text/plain; charset=utf-8\r\n\r\nplain text\r\nsecond line\r\n--inner\r\n" +
		"Content-Type: text/html\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\n<p>caf=C3=A9 =\r\nsoft</p>\r\n--inner--\r\n" +
		"\r\n--outer\r\nContent-Type: application/octet-stream; name=a.bin\r\nContent-Disposition: attachment; filename=a.bin\r\n" +
		"Content-Transfer-Encoding: base64\r\n\r\nAAECAwQFBgcICQoLDA0ODxAREhMUFRYXGBkaGxwdHh8g\r\nISIjJCUmJygpKissLS4vMDEy \r\n--outer--\r\nepilogue\r\n",
	"lf": "Subject: lf\nContent-Type: multipart/mixed; boundary=b\n\n--b\nContent-Type: text/plain\n\none\ntwo\n--b\n\nno header\n--b--\n",
	"rfc822": "Subject: fwd\r\nContent-Type: multipart/mixed; boundary=m\r\n\r\n--m\r\nContent-Type: text/plain\r\n\r\nsee attached\r\n--m\r\n" +
		"Content-Type: message/rfc822\r\nContent-Description: the original\r\n\r\nFrom: b@y.org\r\nTo: c@z.org\r\nSubject: original\r\n" +
		"Content-Type: multipart/mixed; boundary=n\r\n\r\n--n\r\n\r\ninner one\r\n--n\r\nContent-Type: text/plain; charset=iso-8859-1\r\n" +
		"Content-Transfer-Encoding: quoted-printable\r\n\r\nd=E9j=E0\r\n--n--\r\n\r\n--m--\r\n",
	"no final boundary": "Subject: cut\r\nContent-Type: multipart/mixed; boundary=c\r\n\r\n--c\r\n\r\nfirst\r\n--c\r\nContent-Type: text/plain\r\n\r\nlast, never closed\r\n",
	"plain":             "Subject: plain\r\nFrom: x@y.org\r\n\r\nbody line\r\nanother\r\n",
	"no header end":     "Subject: all header\r\nFrom: x@y.org\r\n",
	"no content type":   "Subject: none\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\na=3Db=\r\nc\r\n",
	"digest": "Subject: digest\r\nContent-Type: multipart/digest; boundary=d\r\n\r\n--d\r\n\r\nSubject: one\r\n\r\nfirst\r\n--d\r\n\r\n" +
		"Subject: two\r\nContent-Type: multipart/mixed; boundary=e\r\n\r\n--e\r\n\r\ndeep\r\n--e--\r\n\r\n--d\r\nContent-Type: text/plain\r\n\r\nnot a message\r\n--d--\r\n",
	"unknown cte":             "Subject: uu\r\nContent-Type: multipart/mixed; boundary=u\r\n\r\n--u\r\nContent-Type: application/x\r\nContent-Transfer-Encoding: x-uuencode\r\n\r\nbegin 644 x\r\n--u--\r\n",
	"bad base64":              "Subject: b64\r\nContent-Type: multipart/mixed; boundary=u\r\n\r\n--u\r\nContent-Transfer-Encoding: base64\r\n\r\nAAEC!!!!\r\n--u\r\nContent-Transfer-Encoding: BASE64\r\n\r\naGVs\r\nbG8=\r\n--u--\r\n",
	"top rfc822":              "Subject: outer\r\nContent-Type: message/rfc822\r\n\r\nSubject: inner\r\nContent-Type: text/plain\r\n\r\ninner body\r\n",
	"boundary junk":           "Content-Type: multipart/mixed; boundary=j\r\n\r\n--j \t\r\n\r\none\r\n--j-x\r\n\r\ntwo\r\n--jj\r\nstill two\r\n--j\r\n\r\nthree\r\n--j--  \r\n",
	"bad part header":         "Content-Type: multipart/mixed; boundary=h\r\n\r\n--h\r\n\r\nok\r\n--h\r\nno colon here\r\n\r\nbody\r\n--h\r\n\r\nlater\r\n--h--\r\n",
	"empty multipart":         "Content-Type: multipart/mixed; boundary=z\r\n\r\n--z--\r\n",
	"no boundary":             "Content-Type: multipart/mixed\r\n\r\n--z\r\n\r\nx\r\n--z--\r\n",
	"bad content type":        "Content-Type: multipart/mixed; boundary=\r\n\r\n--z\r\n\r\nx\r\n--z--\r\n",
	"upper content type":      "Content-Type: Multipart/Mixed; Boundary=Q\r\n\r\n--Q\r\nContent-Type: Text/Plain\r\n\r\nx\r\n--Q--\r\n",
	"body starts at boundary": "Content-Type: multipart/mixed; boundary=s\r\n\r\n--s\r\n\r\n--s\r\nContent-Type: text/plain\r\n\r\nsecond\r\n--s--",
	"folded header": "Subject: a\r\n folded\r\nContent-Type: multipart/mixed;\r\n\tboundary=f\r\n\r\n--f\r\nContent-Type: text/plain;\r\n charset=us-ascii\r\nX-Long: " +
		strings.Repeat("w", 5000) + "\r\n\r\nbody\r\n--f--\r\n",
	"rfc822 bad header": "Content-Type: multipart/mixed; boundary=r\r\n\r\n--r\r\nContent-Type: message/rfc822\r\n\r\nSubject: x\r\nbroken line\r\nFrom: y\r\n\r\nbody\r\n--r--\r\n",
	"long preamble":     "Content-Type: multipart/mixed; boundary=p\r\n\r\n" + strings.Repeat("x", 5000) + "\r\n--p\r\n\r\nafter\r\n--p--\r\n",
}

// partsSections are the sections compared: every specifier on parts
// that exist and some that do not, with and without partial ranges.
func partsSections() []*imap.FetchItemBodySection {
	paths := [][]int{nil, {1}, {2}, {3}, {4}, {1, 1}, {1, 2}, {2, 1}, {2, 2}, {2, 1, 1}, {2, 2, 1}, {1, 1, 1}, {0}}
	specs := []imap.PartSpecifier{imap.PartSpecifierNone, imap.PartSpecifierHeader, imap.PartSpecifierText, imap.PartSpecifierMIME}
	partials := []*imap.SectionPartial{nil, {Offset: 0, Size: 5}, {Offset: 3, Size: 100}, {Offset: 1000, Size: 10}}
	var out []*imap.FetchItemBodySection
	for _, p := range paths {
		for _, s := range specs {
			for _, pp := range partials {
				out = append(out, &imap.FetchItemBodySection{Part: p, Specifier: s, Partial: pp})
			}
		}
		out = append(out, &imap.FetchItemBodySection{Part: p, Specifier: imap.PartSpecifierHeader, HeaderFields: []string{"Subject", "content-type"}},
			&imap.FetchItemBodySection{Part: p, Specifier: imap.PartSpecifierHeader, HeaderFieldsNot: []string{"Subject"}})
	}
	return out
}

func readSection(t testing.TB, s section) []byte {
	t.Helper()
	defer s.r.Close()
	b, err := io.ReadAll(s.r)
	if err != nil || int64(len(b)) != s.n {
		t.Fatalf("section read %d of %d bytes: %v", len(b), s.n, err)
	}
	return b
}

// compareParts answers every section, BINARY, BINARY.SIZE, BODYSTRUCTURE
// and ENVELOPE of raw from its part table and from its bytes, fails on any
// difference, and returns how many the table left to the bytes.
func compareParts(t testing.TB, raw []byte) (native, whole int) {
	t.Helper()
	tab, err := mimepart.Scan(bytes.NewReader(raw), int64(len(raw)))
	if err != nil {
		t.Fatalf("scan: %v", err)
	}
	checkTable(t, tab)
	back, err := mimepart.Unmarshal(tab.Marshal())
	if err != nil || !reflect.DeepEqual(back, tab) {
		t.Fatalf("table round trip: %v\n%+v\n%+v", err, back, tab)
	}
	pb := newPartsBody("test", bytes.NewReader(raw), tab)
	count := func(err error) bool {
		if errors.Is(err, errWhole) {
			whole++
			return false
		}
		native++
		return true
	}
	for _, sec := range partsSections() {
		want := bodySection(raw, sec)
		s, err := pb.bodySection(sec)
		if !count(err) {
			continue
		}
		if err != nil {
			t.Fatalf("BODY[%s %v %v]: %v", partString(sec.Part), sec.Specifier, sec.Partial, err)
		}
		if got := readSection(t, s); !bytes.Equal(got, want) {
			t.Fatalf("BODY[%s %v fields %v not %v]<%v>: from the table %q, from the bytes %q", partString(sec.Part), sec.Specifier, sec.HeaderFields, sec.HeaderFieldsNot, sec.Partial, got, want)
		}
	}
	for _, sec := range partsSections() {
		if sec.Specifier != imap.PartSpecifierNone || len(sec.HeaderFields) > 0 || len(sec.HeaderFieldsNot) > 0 {
			continue
		}
		want, werr := imapserver.ExtractBinarySection(bytes.NewReader(raw), &imap.FetchItemBinarySection{Part: sec.Part, Partial: sec.Partial})
		s, size, err := pb.binary(sec.Part, sec.Partial)
		if !count(err) {
			continue
		}
		if errors.Is(werr, imapserver.ErrUnknownCTE) != errors.Is(err, imapserver.ErrUnknownCTE) {
			t.Fatalf("BINARY[%s]: error %v from the table, %v from the bytes", partString(sec.Part), err, werr)
		}
		if err != nil {
			continue
		}
		if got := readSection(t, s); !bytes.Equal(got, want) {
			t.Fatalf("BINARY[%s]<%v>: from the table %q, from the bytes %q", partString(sec.Part), sec.Partial, got, want)
		}
		wsize, _ := imapserver.ExtractBinarySectionSize(bytes.NewReader(raw), &imap.FetchItemBinarySectionSize{Part: sec.Part})
		if uint32(size) != wsize {
			t.Fatalf("BINARY.SIZE[%s]: %d from the table, %d from the bytes", partString(sec.Part), size, wsize)
		}
	}
	if bs, err := pb.structure(&tab.Root, "", 0); count(err) {
		if want := bodyStructure(raw); err != nil || !reflect.DeepEqual(bs, want) {
			t.Fatalf("BODYSTRUCTURE: %v\nfrom the table %s\nfrom the bytes %s", err, dump(bs), dump(want))
		}
	}
	if top, err := pb.topHeader(); count(err) {
		if got, want := envelope(top), envelope(raw); err != nil || !reflect.DeepEqual(got, want) {
			t.Fatalf("ENVELOPE: %v\n%+v\n%+v", err, got, want)
		}
	}
	return native, whole
}

func dump(bs imap.BodyStructure) string {
	var b strings.Builder
	var walk func(imap.BodyStructure, string)
	walk = func(bs imap.BodyStructure, ind string) {
		switch x := bs.(type) {
		case *imap.BodyStructureMultiPart:
			fmt.Fprintf(&b, "%smultipart/%s %+v\n", ind, x.Subtype, *x.Extended)
			for _, c := range x.Children {
				walk(c, ind+"  ")
			}
		case *imap.BodyStructureSinglePart:
			fmt.Fprintf(&b, "%s%s/%s %v size %d enc %s text %+v\n", ind, x.Type, x.Subtype, x.Params, x.Size, x.Encoding, x.Text)
			if x.MessageRFC822 != nil {
				fmt.Fprintf(&b, "%s lines %d env %+v\n", ind, x.MessageRFC822.NumLines, x.MessageRFC822.Envelope)
				walk(x.MessageRFC822.BodyStructure, ind+"  ")
			}
		}
	}
	walk(bs, "")
	return b.String()
}

// checkTable fails on a part outside its parent or the message.
func checkTable(t testing.TB, tab *mimepart.Table) {
	t.Helper()
	if tab.HeaderLen < 0 || tab.HeaderLen > tab.Size {
		t.Fatalf("HeaderLen %d of %d bytes", tab.HeaderLen, tab.Size)
	}
	var walk func(p *mimepart.Part, lo, hi int64)
	walk = func(p *mimepart.Part, lo, hi int64) {
		if !(lo <= p.Hdr && p.Hdr <= p.Body && p.Body <= p.End && p.End <= hi) {
			t.Fatalf("part %d/%d/%d outside %d..%d", p.Hdr, p.Body, p.End, lo, hi)
		}
		last := p.Body
		for i := range p.Children {
			c := &p.Children[i]
			if c.Hdr < last {
				t.Fatalf("part at %d before its sibling's end %d", c.Hdr, last)
			}
			walk(c, p.Body, p.End)
			last = c.End
		}
		if p.Inner != nil {
			walk(p.Inner, p.Body, p.End)
		}
	}
	walk(&tab.Root, 0, tab.Size)
}

// The part table answers every section of every corpus message as the
// in-memory path does, and answers most of them itself.
func TestPartsMatchInMemory(t *testing.T) {
	for name, raw := range partsCorpus {
		t.Run(name, func(t *testing.T) {
			native, whole := compareParts(t, []byte(raw))
			t.Logf("%d answered from the table, %d from the bytes", native, whole)
			if native == 0 {
				t.Fatal("nothing answered from the table")
			}
		})
	}
}

func FuzzPartScan(f *testing.F) {
	for _, raw := range partsCorpus {
		f.Add([]byte(raw))
	}
	f.Fuzz(func(t *testing.T, raw []byte) {
		compareParts(t, raw)
	})
}

// wholeStore hides the store's range and part reads: a server on it
// answers every FETCH from the message's bytes, as for a small message.
type wholeStore struct{ Store }

// bigMultipart is a message of about size bytes: a quoted-printable text,
// a base64 attachment that makes up the size, an encapsulated message and
// a part in a transfer encoding nobody decodes.
func bigMultipart(size int) (string, []byte) {
	att := make([]byte, size*3/4-4096)
	for i := range att {
		att[i] = byte(i*7 + i/251)
	}
	enc := base64.StdEncoding.EncodeToString(att)
	var b strings.Builder
	b.WriteString("From: big@x.org\r\nTo: u@example.org\r\nSubject: big parts\r\nMIME-Version: 1.0\r\n" +
		"Content-Type: multipart/mixed; boundary=\"big-b\"\r\n\r\nThis is a multipart message.\r\n--big-b\r\n" +
		"Content-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: quoted-printable\r\n\r\ncaf=C3=A9 and a soft =\r\nbreak\r\n" +
		"--big-b\r\nContent-Type: application/octet-stream; name=\"att.bin\"\r\nContent-Disposition: attachment; filename=\"att.bin\"\r\n" +
		"Content-Transfer-Encoding: base64\r\n\r\n")
	for len(enc) > 76 {
		b.WriteString(enc[:76] + "\r\n")
		enc = enc[76:]
	}
	b.WriteString(enc + "\r\n--big-b\r\nContent-Type: message/rfc822\r\n\r\nFrom: inner@y.org\r\nSubject: inner\r\n" +
		"Content-Type: text/plain\r\n\r\ninner body\r\n--big-b\r\nContent-Type: application/x-thing\r\n" +
		"Content-Transfer-Encoding: x-uuencode\r\n\r\nbegin 644 x\r\nend\r\n--big-b--\r\n")
	return b.String(), att
}

// A FETCH of the parts of a 27 MB message kept as a file reads the
// headers on the way and the ranges it answers, and answers what a
// server reading the message whole answers.
func TestFetchPartsOfLargeBody(t *testing.T) {
	e := newEnv(t)
	msg, att := bigMultipart(25 << 20)
	e.deliver(msg)
	whole := New(wholeStore{e.store}, proxy.IMAPAuth{P: e.core.Proxy}, Config{AuthFailDelay: 10 * time.Millisecond, IdlePoll: time.Minute})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go whole.Serve(l)
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
		defer cancel()
		whole.Shutdown(ctx)
	})
	a, w := e.raw(true), rawAt(t, l.Addr().String(), true)
	a.ok("EXAMINE INBOX")
	w.ok("EXAMINE INBOX")
	for _, c := range []struct {
		items   string
		maxRead int64 // bytes of the file the table's answer may read
	}{
		{"ENVELOPE", 16 << 10}, // header only (headercache.go)
		{"BODY.PEEK[HEADER.FIELDS (From To)]", 16 << 10},
		{"BINARY.PEEK[2]<0.4096>", 32 << 10},
		{"BODY.PEEK[2]<1000000.4096>", 16 << 10},
		{"BODYSTRUCTURE ENVELOPE", 16 << 10},
		{"BINARY.SIZE[2] BINARY.SIZE[1] BINARY.PEEK[1] BODY.PEEK[1]", 16 << 10},
		{"BODY.PEEK[2.MIME] BODY.PEEK[3.HEADER] BODY.PEEK[3.TEXT] BODY.PEEK[3.1] BODY.PEEK[HEADER.FIELDS (Subject)]", 16 << 10},
		{"BODY.PEEK[HEADER] BODY.PEEK[TEXT]<0.100> BODY.PEEK[3]", 16 << 10},
		{"BINARY.PEEK[4]", 16 << 10},
		{"BINARY.PEEK[2]<10000000.100>", 14 << 20}, // decoded from the part's start
	} {
		before := e.core.Boxes.FileBytesRead()
		gu, gs := a.cmd("FETCH 1 (" + c.items + ")")
		read := e.core.Boxes.FileBytesRead() - before
		wu, ws := w.cmd("FETCH 1 (" + c.items + ")")
		if gs != ws || !reflect.DeepEqual(gu, wu) {
			t.Fatalf("FETCH %s: from the table %.300q %s, from the bytes %.300q %s", c.items, gu, gs, wu, ws)
		}
		if read > c.maxRead {
			t.Errorf("FETCH %s read %d bytes of the file, want at most %d", c.items, read, c.maxRead)
		}
		t.Logf("FETCH %s: %d bytes of the file read", c.items, read)
	}
	u := a.ok("FETCH 1 (BINARY.PEEK[2]<0.4096>)")
	if !strings.HasSuffix(u[0], string(att[:4096])+")") {
		t.Fatalf("BINARY[2]<0.4096> is not the attachment's first 4096 bytes")
	}
	// BINARY without .PEEK sets \Seen, as BODY does.
	a.ok("SELECT INBOX")
	if u := a.ok("FETCH 1 (BINARY[1]<0.4>)"); !has(u, `\Seen`) {
		t.Fatalf("BINARY[1] did not set \\Seen: %q", u)
	}
}

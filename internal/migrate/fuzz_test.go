package migrate

import (
	"bytes"
	"testing"
)

// FuzzParseMaildirName: any file name gives flags that survive a round
// trip through MaildirInfo.
func FuzzParseMaildirName(f *testing.F) {
	for _, s := range []string{"1.M1.host:2,S", "1.M1.host,S=1,W=2:2,DFPRSTab", "x!2,", "x;2,zz", ":2,", "", "a:2,\xff"} {
		f.Add(s)
	}
	kw := ParseKeywords([]byte("0 Junk\n1 $Label1\n"))
	f.Fuzz(func(t *testing.T, name string) {
		_, flags := ParseMaildirName(name, kw)
		for _, fl := range flags {
			if !ValidFlag(fl) {
				t.Fatalf("invalid flag %q from %q", fl, name)
			}
		}
		k := Keywords{Names: append([]string(nil), kw...)}
		info, dropped := MaildirInfo(flags, &k)
		if len(dropped) != 0 {
			t.Fatalf("dropped %q", dropped)
		}
		_, back := ParseMaildirName("u"+info, k.Names)
		if !SameFlags(back, flags) {
			t.Fatalf("%q: flags %q came back as %q (info %q)", name, flags, back, info)
		}
	})
}

// FuzzMaildirFolderName: names that parse come back from MaildirDirName
// as a directory that parses to them again.
func FuzzMaildirFolderName(f *testing.F) {
	for _, s := range []string{".Sent", ".Foo.Bar", ".Caf&AOk-", `.a\2eb`, ".&-", ".x\xff"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, dir string) {
		name, err := MaildirFolderName(dir)
		if err != nil {
			return
		}
		again, err := MaildirFolderName(MaildirDirName(name))
		if name == "INBOX" {
			return
		}
		if err != nil || again != name {
			t.Fatalf("%q -> %q -> %q -> %q, %v", dir, name, MaildirDirName(name), again, err)
		}
	})
}

// FuzzMbox: any file scans without error into spans that tile it, and each
// message parses into CRLF lines with valid flags.
func FuzzMbox(f *testing.F) {
	f.Add([]byte("From a Mon Jan  2 15:04:05 2006\nStatus: RO\nSubject: x\n\n>From y\n\nFrom b\n\n"))
	f.Add([]byte("From \r\n\r\nFrom \n"))
	f.Add([]byte("garbage\nFrom x\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		var end int64 = -1
		err := ScanMbox(bytes.NewReader(data), 1<<10, func(off int64, span []byte, n int64) error {
			if end >= 0 && off != end {
				t.Fatalf("span at %d after one ending at %d", off, end)
			}
			end = off + n
			if span == nil {
				return nil
			}
			if !bytes.Equal(span, data[off:off+n]) {
				t.Fatalf("span at %d is not the file's bytes", off)
			}
			raw, flags, _ := ParseMboxMessage(span)
			if !bytes.Equal(ToCRLF(raw), raw) {
				t.Fatalf("bare LF left in %q", raw)
			}
			for _, fl := range flags {
				if !ValidFlag(fl) {
					t.Fatalf("invalid flag %q", fl)
				}
			}
			return nil
		})
		if err != nil {
			t.Fatal(err)
		}
		if end >= 0 && end != int64(len(data)) {
			t.Fatalf("spans end at %d of %d", end, len(data))
		}
	})
}

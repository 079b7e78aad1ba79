package mimepart

import (
	"bytes"
	"errors"
	"reflect"
	"runtime"
	"testing"
)

const nested = "Subject: t\r\nContent-Type: multipart/mixed; boundary=o\r\n\r\n--o\r\n\r\none\r\n--o\r\n" +
	"Content-Type: message/rfc822\r\n\r\nSubject: in\r\nContent-Type: multipart/alternative; boundary=i\r\n\r\n" +
	"--i\r\nContent-Transfer-Encoding: base64\r\n\r\naGVsbG8=\r\n--i--\r\n\r\n--o--\r\n"

// A table reads back as it was written; one damaged, cut short or in
// another version does not read.
func TestTableEncoding(t *testing.T) {
	tab, err := Scan(bytes.NewReader([]byte(nested)), int64(len(nested)))
	if err != nil {
		t.Fatal(err)
	}
	if len(tab.Root.Children) != 2 || tab.Root.Children[1].Inner == nil || tab.Root.Children[1].Inner.Children[0].Decoded != 5 {
		t.Fatalf("table %+v", tab.Root)
	}
	b := tab.Marshal()
	back, err := Unmarshal(b)
	if err != nil || !reflect.DeepEqual(back, tab) {
		t.Fatalf("round trip: %v", err)
	}
	for i := range b {
		if _, err := Unmarshal(b[:i]); err == nil {
			t.Fatalf("a table cut to %d of %d bytes read", i, len(b))
		}
	}
	other := append([]byte{tableVersion + 1}, b[1:]...)
	if _, err := Unmarshal(other); err == nil {
		t.Fatal("a table of another version read")
	}
	// An offset past the message's end is not taken.
	tab.Root.Children[0].End = tab.Size + 10
	if _, err := Unmarshal(tab.Marshal()); err == nil {
		t.Fatal("a table with a part past the message read")
	}
}

// The scan's memory does not grow with a part's size: a 32 MiB part is
// read through the same few buffers.
func TestScanHoldsNoBody(t *testing.T) {
	body := bytes.Repeat([]byte("0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcde\r\n"), 1<<19)
	msg := append([]byte("Content-Type: multipart/mixed; boundary=x\r\n\r\n--x\r\n\r\n"), body...)
	msg = append(msg, "\r\n--x--\r\n"...)
	var before, after runtime.MemStats
	runtime.ReadMemStats(&before)
	if _, err := Scan(bytes.NewReader(msg), int64(len(msg))); err != nil {
		t.Fatal(err)
	}
	runtime.ReadMemStats(&after)
	if n := after.TotalAlloc - before.TotalAlloc; n > 256<<10 {
		t.Fatalf("scanning a %d-byte part allocated %d bytes", len(body), n)
	}
}

// A message of more parts than a table keeps gets none.
func TestTooManyParts(t *testing.T) {
	msg := []byte("Content-Type: multipart/digest; boundary=x\r\n\r\n")
	for range MaxParts {
		msg = append(msg, "--x\r\n\r\nSubject: a\r\nContent-Type: multipart/mixed; boundary=y\r\n\r\n--y\r\n\r\n--y--\r\n\r\n"...)
	}
	msg = append(msg, "--x--\r\n"...)
	if _, err := Scan(bytes.NewReader(msg), int64(len(msg))); !errors.Is(err, ErrTooManyParts) {
		t.Fatalf("scan of %d parts: %v, want ErrTooManyParts", 4*MaxParts, err)
	}
	if _, err := Unmarshal(NoTable); !errors.Is(err, ErrNoTable) {
		t.Fatalf("Unmarshal(NoTable): %v", err)
	}
}

// BenchmarkScan25MB is the part table's cost at delivery: a 25 MB message
// with a base64 attachment (decoded once more for its size).
func BenchmarkScan25MB(b *testing.B) {
	line := []byte("QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVphYmNkZWZnaGlqa2xtbm9wcXJzdHV2d3h5ejAx\r\n")
	msg := []byte("Subject: b\r\nContent-Type: multipart/mixed; boundary=x\r\n\r\n--x\r\n\r\ntext\r\n--x\r\nContent-Transfer-Encoding: base64\r\n\r\n")
	for len(msg) < 25_000_000 {
		msg = append(msg, line...)
	}
	msg = append(msg, "--x--\r\n"...)
	b.SetBytes(int64(len(msg)))
	for b.Loop() {
		if _, err := Scan(bytes.NewReader(msg), int64(len(msg))); err != nil {
			b.Fatal(err)
		}
	}
}

package mailbox

import (
	"os"
	"testing"
	"time"
)

// The store's hot path with mail text (bodies compress as mail does):
//
//	go test -run=^$ -bench='NewMessage|BodyRead|BodyCodec' -benchmem ./internal/mailbox/
//
// BenchmarkStoreNewMessage stores one new message at a time, each one
// fsync'd: the path of a delivery on its node (compression, no point read
// of what it replaces, one durable batch).
func BenchmarkStoreNewMessage(b *testing.B) {
	m, _ := newManager(b)
	body := mailText(4700)
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	for i := 0; i < b.N; i++ {
		p := Placed{User: "u@x.org", Mailbox: "INBOX", UIDValidity: 1, UID: uint32(i + 1), ModSeq: uint64(i + 1)}
		if err := m.StoreAt([]Placed{p}, m.NewMessageID(), body, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkBodyRead reads stored messages back (a POP3 RETR or IMAP FETCH
// BODY[]): the point read and the decompression.
func BenchmarkBodyRead(b *testing.B) {
	m, _ := newManager(b)
	const n = 1000
	body := mailText(4700)
	ids := make([]string, n)
	for i := range ids {
		ids[i] = m.NewMessageID()
		p := Placed{User: "u@x.org", Mailbox: "INBOX", UIDValidity: 1, UID: uint32(i + 1), ModSeq: uint64(i + 1)}
		if err := m.StoreAt([]Placed{p}, ids[i], body, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
	b.SetBytes(int64(len(body)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if got, err := m.Body("u@x.org", ids[i%n]); err != nil || len(got) != len(body) {
			b.Fatalf("body: %v, %d bytes", err, len(got))
		}
	}
}

// BenchmarkBodyCodec is what compression costs per message of prose (the
// repository's docs, cut into 4.7 KB messages with a header), and the
// ratio it gets (stored bytes per message byte).
func BenchmarkBodyCodec(b *testing.B) {
	var text []byte
	for _, f := range []string{"../../README.md", "../../docs/ARCHITECTURE.md", "../../docs/benchmarks.md"} {
		t, err := os.ReadFile(f)
		if err != nil {
			b.Skip(err)
		}
		text = append(text, t...)
	}
	const size, n = 4700, 64
	bodies := make([][]byte, n)
	stored := make([][]byte, n)
	var raw, kept int
	for i := range bodies {
		off := (len(text) - size) * i / n
		bodies[i] = append([]byte("From: a@example.org\r\nTo: b@example.org\r\nSubject: prose\r\n\r\n"), text[off:off+size-60]...)
		stored[i] = encodeBody(bodies[i])
		raw, kept = raw+len(bodies[i]), kept+len(stored[i])
	}
	b.Run("encode", func(b *testing.B) {
		b.SetBytes(int64(raw / n))
		for i := 0; i < b.N; i++ {
			encodeBody(bodies[i%n])
		}
		b.ReportMetric(float64(kept)/float64(raw), "stored/raw")
	})
	b.Run("decode", func(b *testing.B) {
		b.SetBytes(int64(raw / n))
		for i := 0; i < b.N; i++ {
			if _, err := decodeBody(stored[i%n]); err != nil {
				b.Fatal(err)
			}
		}
	})
}

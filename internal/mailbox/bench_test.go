package mailbox

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkStoreParallel measures durable stores (each one fsync'd) from
// many goroutines to many users: the figure group commit improves.
// Run: go test -run=^$ -bench=Store -benchtime=3s ./internal/mailbox/
func BenchmarkStoreParallel(b *testing.B) {
	m, _ := newManager(b)
	body := make([]byte, 4700)
	for i := range body {
		body[i] = 'a' + byte(i%26)
	}
	var n atomic.Int64
	b.SetParallelism(8) // 8 x GOMAXPROCS concurrent SMTP sessions
	b.SetBytes(int64(len(body)))
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			i := n.Add(1)
			p := Placed{User: fmt.Sprintf("u%d@x.org", i%1000), Mailbox: "INBOX", UIDValidity: 1, UID: uint32(i), ModSeq: uint64(i)}
			if err := m.StoreAt([]Placed{p}, m.NewMessageID(), body, time.Now()); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkStoreSerial is one store at a time: the fsync latency floor.
func BenchmarkStoreSerial(b *testing.B) {
	m, _ := newManager(b)
	body := make([]byte, 4700)
	b.SetBytes(int64(len(body)))
	for i := 0; i < b.N; i++ {
		p := Placed{User: "u@x.org", Mailbox: "INBOX", UIDValidity: 1, UID: uint32(i + 1), ModSeq: uint64(i + 1)}
		if err := m.StoreAt([]Placed{p}, m.NewMessageID(), body, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

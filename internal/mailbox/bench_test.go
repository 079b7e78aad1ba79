package mailbox

import (
	"fmt"
	"sync/atomic"
	"testing"
	"time"
)

// BenchmarkDeliverParallel measures durable deliveries (each one fsync'd)
// from many goroutines to many users: the figure group commit improves.
// Run: go test -run=^$ -bench=Deliver -benchtime=3s ./internal/mailbox/
func BenchmarkDeliverParallel(b *testing.B) {
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
			u := fmt.Sprintf("u%d@x.org", n.Add(1)%1000)
			if _, err := m.Deliver([]string{u}, body, time.Now()); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

// BenchmarkDeliverSerial is one delivery at a time: the fsync latency floor.
func BenchmarkDeliverSerial(b *testing.B) {
	m, _ := newManager(b)
	body := make([]byte, 4700)
	b.SetBytes(int64(len(body)))
	for i := 0; i < b.N; i++ {
		if _, err := m.Deliver([]string{"u@x.org"}, body, time.Now()); err != nil {
			b.Fatal(err)
		}
	}
}

package smtp_test

import (
	"bytes"
	"sync/atomic"
	"testing"

	gosmtp "github.com/emersion/go-smtp"
)

// benchMessage is a message of smtp-source's size in the issue 16 runs
// (4.8 KB: scripts/bench-smtp-sink.sh).
func benchMessage() []byte {
	var b bytes.Buffer
	b.WriteString("From: <sender@far.net>\r\nTo: <alice@example.org>\r\nSubject: bench\r\n\r\n")
	for b.Len() < 4800 {
		b.WriteString("The quick brown fox jumps over the lazy dog, again and again.\r\n")
	}
	return b.Bytes()
}

// BenchmarkDeliver is the SMTP delivery hot path end to end: a session
// delivers a 4.8 KB message (MAIL, RCPT, DATA) to a node's store in a temp
// directory, each fsync'd before its 250. allocs/op counts both ends (the
// client's share is small and fixed), so a regression in the session,
// the delivery or the store shows here.
// Run: go test -run=^$ -bench=Deliver -benchmem ./internal/smtp/
func BenchmarkDeliver(b *testing.B) {
	addr, _ := startCore(b, 1<<20, nil)
	msg := benchMessage()
	c, err := gosmtp.Dial(addr)
	if err != nil {
		b.Fatal(err)
	}
	defer c.Close()
	b.SetBytes(int64(len(msg)))
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		if err := c.SendMail("sender@far.net", []string{"alice@example.org"}, bytes.NewReader(msg)); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkDeliverParallel is BenchmarkDeliver from 8 x GOMAXPROCS sessions
// at once, each on its own connection, to two users: what group commit
// and the writer's locks see under smtp-source's load.
func BenchmarkDeliverParallel(b *testing.B) {
	addr, _ := startCore(b, 1<<20, nil)
	msg := benchMessage()
	users := []string{"alice@example.org", "bob@example.org"}
	var n atomic.Int64
	b.SetBytes(int64(len(msg)))
	b.SetParallelism(8)
	b.ReportAllocs()
	b.ResetTimer()
	b.RunParallel(func(pb *testing.PB) {
		c, err := gosmtp.Dial(addr)
		if err != nil {
			b.Error(err)
			return
		}
		defer c.Close()
		for pb.Next() {
			to := users[n.Add(1)%2]
			if err := c.SendMail("sender@far.net", []string{to}, bytes.NewReader(msg)); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

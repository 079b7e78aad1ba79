package cluster_test

import (
	"fmt"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gosmtp "github.com/emersion/go-smtp"
)

// TestRepairThroughput measures how fast repair brings a wiped node's
// objects back to two copies: QUILL_REPAIR_OBJECTS messages (about 5 KB)
// spread over 8 users on 3 nodes at R=2, one node wiped, and the time
// until every message has its two copies again. It is a benchmark, not a
// unit test: it runs only when the variable is set (make repair-bench),
// and its figures go in docs/benchmarks.md. It fails only if repair does
// not finish at all within its limit, or a message is lost.
func TestRepairThroughput(t *testing.T) {
	total, _ := strconv.Atoi(os.Getenv("QUILL_REPAIR_OBJECTS"))
	if total <= 0 {
		t.Skip("set QUILL_REPAIR_OBJECTS to run the repair benchmark")
	}
	nodes := startReplicated(t, 3, "--replace-after", "5s")
	const users = 8
	var addrs []string
	for i := 0; i < users; i++ {
		u := fmt.Sprintf("rb%02d@repair.example", i)
		addrs = append(addrs, u)
		nodes[i%3].addUser(t, u, "pw")
	}
	body := strings.Repeat("The quick brown fox jumps over the lazy dog. 0123456789\r\n", 90)
	start := time.Now()
	var sent atomic.Int64
	var wg sync.WaitGroup
	errs := make(chan error, 16)
	const workers = 12
	for w := 0; w < workers; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			n := nodes[w%3]
			for sent.Load() < int64(total) {
				if err := sendMany(n, addrs, w, &sent, int64(total), body); err != nil {
					errs <- err
					return
				}
			}
		}(w)
	}
	done := make(chan struct{})
	go func() {
		for {
			select {
			case <-done:
				return
			case <-time.After(5 * time.Second):
				t.Logf("loading: %d of %d messages, %.0f/s", sent.Load(), total, float64(sent.Load())/time.Since(start).Seconds())
			}
		}
	}()
	wg.Wait()
	close(done)
	close(errs)
	for err := range errs {
		fatalf(t, "loading: %v", err)
	}
	t.Logf("loaded %d messages in %v", sent.Load(), time.Since(start).Round(time.Second))
	waitReplicated(t, nodes, 10*time.Minute)

	victim := nodes[1]
	r, err := victim.Replication()
	if err != nil {
		fatalf(t, "%v", err)
	}
	held := r.Objects
	t.Logf("wiping %s, which holds %d objects", victim.ID, held)
	wiped := time.Now()
	wipe(t, victim)
	waitFor(t, "the cluster with the new node", 60*time.Second, func() bool { return ready(nodes) })
	rejoined := time.Since(wiped)
	since := time.Now()
	last := time.Now()
	var maxShort int64
	for {
		ok, st, all := replicatedSince(nodes, since)
		for _, r := range all {
			maxShort = max(maxShort, r.UnderReplicated)
		}
		if ok && maxShort > 0 {
			break
		}
		if time.Since(wiped) > 30*time.Minute {
			fatalf(t, "not every message back at 2 copies 30 min after the wipe: %s", st)
		}
		if time.Since(last) > 10*time.Second {
			t.Logf("%v after the wipe: %s", time.Since(wiped).Round(time.Second), st)
			last = time.Now()
		}
		time.Sleep(500 * time.Millisecond)
	}
	took := time.Since(wiped)
	t.Logf("RESULT: %d objects held by the wiped node (at most %d seen short on one node); every message back at 2 copies %v after the wipe (node back after %v, --replace-after 5s): %.0f objects/s after the node came back",
		held, maxShort, took.Round(time.Second), rejoined.Round(time.Second), float64(held)/(took-rejoined).Seconds())
}

// sendMany delivers messages through one SMTP session until the total is
// reached or 200 have gone through it.
func sendMany(n *Node, addrs []string, w int, sent *atomic.Int64, total int64, body string) error {
	conn, err := net.DialTimeout("tcp", n.Addrs["smtp"], ioTimeout)
	if err != nil {
		return err
	}
	c := gosmtp.NewClient(conn)
	defer c.Close()
	if err := c.Hello("bench.example"); err != nil {
		return err
	}
	for i := 0; i < 200; i++ {
		k := sent.Add(1)
		if k > total {
			return c.Quit()
		}
		conn.SetDeadline(time.Now().Add(ioTimeout))
		rcpt := addrs[int(k)%len(addrs)]
		msg := fmt.Sprintf("From: t@test.example\r\nTo: %s\r\nSubject: msg %d\r\n\r\n%s", rcpt, k, body)
		if err := c.SendMail("t@test.example", []string{rcpt}, strings.NewReader(msg)); err != nil {
			return fmt.Errorf("message %d through %s: %w", k, n.ID, err)
		}
	}
	return c.Quit()
}

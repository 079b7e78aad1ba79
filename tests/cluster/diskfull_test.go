package cluster_test

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	gosmtp "github.com/emersion/go-smtp"
)

// FillAll takes every free byte of the node's tmpfs with a filler beside
// its data directory: the worst a runaway process on the same disk can do.
func (c *netCluster) FillAll(n *Node) error {
	mnt := c.mounts[n]
	f, err := os.OpenFile(filepath.Join(mnt, "filler"), os.O_CREATE|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	defer f.Close()
	var off int64
	for step := int64(64 << 20); step >= 4<<10; {
		err := syscall.Fallocate(int(f.Fd()), 0, off, step)
		switch {
		case err == nil:
			off += step
		case errors.Is(err, syscall.ENOSPC):
			step /= 2
		default:
			return err
		}
	}
	return nil
}

// sendSized delivers a message of about size bytes through the node.
func (n *Node) sendSized(rcpt, subject string, size int) error {
	line := strings.Repeat("x", 76) + "\r\n"
	return n.sendBody(rcpt, subject, strings.Repeat(line, size/len(line)+1))
}

// A node whose disk fills to the last byte while it takes mail and replica
// copies stays up: it refuses new mail with a 4xx, serves what it holds,
// and takes mail again once the space is freed, with every acknowledged
// message readable through both nodes. Before the store kept a reserve,
// Pebble's write-ahead log hit ENOSPC and the process exited (the
// 1,000-fault run of session 7, fault 245).
func TestFullDiskNodeStaysUp(t *testing.T) {
	const minFree = 48 << 20
	c := startNetCluster(t, 2, netOptions{tmpfs: true, diskSize: 2 << 30,
		extra: []string{"--replicas", "2", "--min-free", fmt.Sprint(minFree)}})
	nodes := c.Nodes
	waitFor(t, "soft state on every node", 30*time.Second, func() bool { return ready(nodes) })
	users := []string{"full1@cluster.example", "full2@cluster.example"}
	for _, u := range users {
		nodes[0].createUser(t, u, "pw")
	}
	victim := nodes[1]

	// Four senders deliver 256 KiB messages through both nodes, each about
	// ten a second (the disk must fill from the filler, not from the
	// test's own mail), until told to stop; each acknowledged subject is
	// noted.
	var (
		mu        sync.Mutex
		acked     = map[string][]string{}
		replies   = map[string]int{} // the deferrals, by reply
		refused   atomic.Int64
		permanent atomic.Int64
		stop      = make(chan struct{})
		wg        sync.WaitGroup
		seq       atomic.Int64
	)
	for w := 0; w < 4; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				i := seq.Add(1)
				u := users[i%int64(len(users))]
				subj := fmt.Sprintf("full %d", i)
				switch err := nodes[w%2].sendSized(u, subj, 256<<10); {
				case err == nil:
					mu.Lock()
					acked[u] = append(acked[u], subj)
					mu.Unlock()
					time.Sleep(100 * time.Millisecond)
				default:
					var se *gosmtp.SMTPError
					if errors.As(err, &se) && se.Code >= 500 {
						permanent.Add(1)
						t.Logf("refused for good: %v", err)
					}
					reply := "no reply (" + err.Error() + ")"
					if se != nil {
						reply = fmt.Sprintf("%d %d.%d.%d", se.Code, se.EnhancedCode[0], se.EnhancedCode[1], se.EnhancedCode[2])
					}
					mu.Lock()
					replies[reply]++
					mu.Unlock()
					refused.Add(1)
					time.Sleep(50 * time.Millisecond)
				}
			}
		}(w)
	}
	time.Sleep(3 * time.Second)

	// A node just started writes its log in small segments at first (the
	// store's memtables grow from small to full size), each a new file
	// that needs room of its own: the fill comes right after a restart,
	// as in the run that found this.
	victim.Kill9()
	victim.Restart()
	waitFor(t, victim.ID+" back in the user map", 30*time.Second, func() bool { return agree(nodes, nodes) })
	t.Logf("before the fill: %d MiB free on %s, %d MiB on %s", c.FreeBytes(victim)>>20, victim.ID, c.FreeBytes(nodes[0])>>20, nodes[0].ID)
	// The ballast (--min-free/4) is what lets the store finish what Pebble
	// has under way once the floor is reached: laid at start, removed on
	// the full disk, laid again when there is room.
	ballast := filepath.Join(victim.Data, "ballast")
	if st, err := os.Stat(ballast); err != nil || st.Size() != minFree/4 {
		fatalf(t, "%s laid no ballast of %d bytes before the fill: %v", victim.ID, minFree/4, err)
	}
	if err := c.FillAll(victim); err != nil {
		fatalf(t, "fill the disk of %s: %v", victim.ID, err)
	}
	t.Logf("filled %s's disk: %d bytes free", victim.ID, c.FreeBytes(victim))
	ballastGone := time.Duration(0)
	filled := time.Now()
	for end := time.Now().Add(30 * time.Second); time.Now().Before(end); {
		if victim.Exited() {
			close(stop)
			wg.Wait()
			fatalf(t, "%s exited on a full disk:\n%s", victim.ID, tail(victim.Stderr(), 20))
		}
		if _, err := os.Stat(ballast); os.IsNotExist(err) && ballastGone == 0 {
			ballastGone = time.Since(filled)
		}
		time.Sleep(200 * time.Millisecond)
	}
	if ballastGone == 0 {
		errorf(t, "%s kept its ballast through 30 s on a full disk", victim.ID)
	} else {
		t.Logf("ballast removed %v after the fill", ballastGone.Round(100*time.Millisecond))
	}
	if _, _, _, err := victim.imapView(users[0], "pw"); err != nil {
		errorf(t, "IMAP through %s on a full disk: %v", victim.ID, err)
	}
	if err := victim.sendSized(users[0], "while full", 1<<10); err != nil {
		t.Logf("delivery through %s on a full disk: %v", victim.ID, err)
	} else {
		acked[users[0]] = append(acked[users[0]], "while full")
	}

	if err := c.Unfill(victim); err != nil {
		fatalf(t, "free the disk of %s: %v", victim.ID, err)
	}
	waitFor(t, victim.ID+" to take mail again", 30*time.Second, func() bool {
		return victim.sendSized(users[1], "after", 1<<10) == nil
	})
	waitFor(t, victim.ID+" to lay its ballast again", 30*time.Second, func() bool {
		st, err := os.Stat(ballast)
		return err == nil && st.Size() == minFree/4
	})
	close(stop)
	wg.Wait()
	mu.Lock()
	acked[users[1]] = append(acked[users[1]], "after")
	mu.Unlock()
	if victim.Exited() {
		fatalf(t, "%s exited:\n%s", victim.ID, tail(victim.Stderr(), 20))
	}
	if permanent.Load() > 0 {
		errorf(t, "%d deliveries refused for good (a full disk is a temporary failure)", permanent.Load())
	}
	waitReplicated(t, nodes, 120*time.Second)
	for _, u := range users {
		for _, n := range nodes {
			_, subj, _, err := n.imapView(u, "pw")
			if err != nil {
				fatalf(t, "IMAP %s through %s: %v", u, n.ID, err)
			}
			seen := map[string]bool{}
			for _, s := range subj {
				seen[s] = true
			}
			for _, s := range acked[u] {
				if !seen[s] {
					errorf(t, "%s through %s: acknowledged %q missing", u, n.ID, s)
				}
			}
		}
		t.Logf("%s: %d acknowledged, all readable through both nodes", u, len(acked[u]))
	}
	t.Logf("%d deliveries deferred while the disk was full, by reply: %v", refused.Load(), replies)
	if strings.Contains(victim.Stderr(), "pebble: fatal") {
		errorf(t, "Pebble reported a fatal error:\n%s", tail(victim.Stderr(), 20))
	}
}

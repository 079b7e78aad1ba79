package cassandra_test

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
	"github.com/quillmail/quill/internal/cassandra"
	"github.com/quillmail/quill/internal/cassandra/cassandratest"
	"github.com/quillmail/quill/internal/mailbox"
)

const (
	// faultSeed is the default seed of TestCassandraFaults (the issue's
	// number); QUILL_CASSANDRA_FAULTS_SEED sets another.
	faultSeed = 15
	// faultWriters write at once, each delivering to users drawn from
	// faultUsers, as delivery sessions would.
	faultWriters = 8
	faultUsers   = 16
	// beforeKill is how long the writers run with three nodes up;
	// whileDown how long they go on after one was killed.
	beforeKill = 10 * time.Second
	whileDown  = 15 * time.Second
	// writeTimeout bounds one delivery's two writes (the store's own
	// client timeout is 12 s per request).
	writeTimeout = 30 * time.Second
	// checkers read the acknowledged messages back at once.
	checkers = 16
	// hintsWait is how long the test waits after the first check of the
	// returned node before checking again, without repair: the other
	// nodes keep hints of the writes it missed (hinted handoff, on by
	// default for three hours of absence) and replay them once they see it
	// up; their dispatcher runs every 10 s.
	hintsWait = 30 * time.Second
	// progressEvery is how often the writers' counts are logged.
	progressEvery = 5 * time.Second
)

// faultLevel is one run: the store's read and write consistency levels,
// and whether the test must find every acknowledged message at every
// check (W + R > RF: a read quorum meets every write quorum).
type faultLevel struct {
	name         string
	read, write  gocql.Consistency
	mustFindEach bool
}

var faultLevels = []faultLevel{
	{"QUORUM-QUORUM", gocql.Quorum, gocql.Quorum, true},
	{"ONE-ONE", gocql.One, gocql.One, false},
	{"ONE-write-QUORUM-read", gocql.Quorum, gocql.One, false},
}

// TestCassandraFaults kills one Cassandra node of three (replication
// factor 3) with kill -9 while writers store messages, starts it again and
// runs nodetool repair; after each step it reads back every message whose
// writes Cassandra acknowledged. At QUORUM/QUORUM nothing may be missing
// at any step; at every level nothing may be missing after the repair and
// no message may come back with other bytes.
func TestCassandraFaults(t *testing.T) {
	if os.Getenv("QUILL_CASSANDRA_FAULTS") == "" {
		t.Skip("set QUILL_CASSANDRA_FAULTS=1 (make cassandra-faults): three Cassandra nodes, several minutes")
	}
	seed := uint64(envInt(t, "QUILL_CASSANDRA_FAULTS_SEED", faultSeed))
	t.Logf("seed %d (QUILL_CASSANDRA_FAULTS_SEED=%d repeats the run's messages and kills)", seed, seed)
	began := time.Now()
	c, err := cassandratest.StartCluster(cassandratest.ClusterOptions{Nodes: 3, ShortLived: true})
	if errors.Is(err, cassandratest.ErrNoJava) {
		t.Skip(err)
	}
	if err != nil {
		t.Fatal(err)
	}
	defer c.Stop()
	for i, n := range c.Nodes {
		t.Logf("node %d: %s:%d pid %d", i+1, n.Addr, n.Port, n.PID)
	}
	t.Logf("three nodes up in %s; load average %s", time.Since(began).Round(time.Second), loadavg())
	rng := rand.New(rand.NewPCG(seed, 0))
	var reports []string
	for li, lv := range faultLevels {
		victim := rng.IntN(len(c.Nodes))
		t.Run(lv.name, func(t *testing.T) {
			r := runFault(t, c, lv, seed+uint64(li)*1000, victim)
			reports = append(reports, r)
		})
	}
	t.Logf("seed %d, load average at the end %s\n%s", seed, loadavg(), strings.Join(reports, "\n"))
}

// faultTally counts one level's deliveries.
type faultTally struct {
	mu        sync.Mutex
	attempted int
	acked     []delivered
	failed    map[string]int // by write and error kind
	ackedDown int            // acknowledged while the victim was down
}

// checkResult counts what reading the acknowledged messages back found.
type checkResult struct {
	missingIndex, missingBody, wrong, readErrors int
	errKinds                                     map[string]int
	took                                         time.Duration
}

func (r checkResult) missing() int { return r.missingIndex + r.missingBody }

func (r checkResult) String() string {
	s := fmt.Sprintf("%d missing (%d index records, %d bodies), %d with other content, %d unreadable",
		r.missing(), r.missingIndex, r.missingBody, r.wrong, r.readErrors)
	if len(r.errKinds) > 0 {
		s += " " + fmt.Sprint(r.errKinds)
	}
	return s + fmt.Sprintf(" (read in %s)", r.took.Round(100*time.Millisecond))
}

func runFault(t *testing.T, c *cassandratest.Cluster, lv faultLevel, seed uint64, victim int) string {
	keyspace := "faults_" + strings.ToLower(strings.NewReplacer("-", "_").Replace(lv.name))
	st := openStore(t, c.Hosts(), keyspace, 3, lv.read, lv.write)
	defer st.Close()
	v := c.Nodes[victim]
	t.Logf("%s: keyspace %s RF 3, write %s, read %s; node %d (%s, pid %d) will be killed",
		lv.name, keyspace, lv.write, lv.read, victim+1, v.Addr, v.PID)

	var (
		tally   = faultTally{failed: map[string]int{}}
		uids    [faultUsers]atomic.Uint32
		down    atomic.Bool
		stop    = make(chan struct{})
		wg      sync.WaitGroup
		users   [faultUsers]string
		userRng = rand.New(rand.NewPCG(seed, 1<<32))
	)
	for i := range users {
		users[i] = fmt.Sprintf("user%02d-%d@example.org", i, userRng.Uint32())
	}
	for n := range faultWriters {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := newWriter(st, seed, n, smallMessages)
			for {
				select {
				case <-stop:
					return
				default:
				}
				u := w.rng.IntN(faultUsers)
				ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
				d, at, err := w.deliver(ctx, users[u], uids[u].Add(1))
				cancel()
				wasDown := down.Load()
				tally.mu.Lock()
				tally.attempted++
				if err != nil {
					tally.failed[at+": "+errorKind(err)]++
				} else {
					tally.acked = append(tally.acked, d)
					if wasDown {
						tally.ackedDown++
					}
				}
				tally.mu.Unlock()
			}
		}()
	}
	progress := func(what string, d time.Duration) {
		end := time.Now().Add(d)
		for time.Now().Before(end) {
			time.Sleep(min(progressEvery, time.Until(end)))
			tally.mu.Lock()
			t.Logf("%s: %d attempted, %d acknowledged, %d failed", what, tally.attempted, len(tally.acked), tally.attempted-len(tally.acked))
			tally.mu.Unlock()
		}
	}
	progress("three nodes up", beforeKill)
	killedAt := time.Now()
	v.Kill()
	down.Store(true)
	t.Logf("kill -9 node %d (pid %d)", victim+1, v.PID)
	progress("one node down", whileDown)
	close(stop)
	wg.Wait()
	t.Logf("writers stopped %s after the kill", time.Since(killedAt).Round(100*time.Millisecond))

	afterKill := checkAll(t, st, tally.acked)
	t.Logf("node down: %s", afterKill)
	restartBegan := time.Now()
	if err := v.Restart(); err != nil {
		t.Fatalf("restart node %d: %v", victim+1, err)
	}
	t.Logf("node %d back (pid %d), CQL answered after %s", victim+1, v.PID, time.Since(restartBegan).Round(100*time.Millisecond))
	afterReturn := checkAll(t, st, tally.acked)
	t.Logf("right after its return: %s", afterReturn)
	time.Sleep(hintsWait)
	afterHints := checkAll(t, st, tally.acked)
	t.Logf("%s later, no repair: %s", hintsWait, afterHints)
	repairBegan := time.Now()
	afterRepair := checkResult{readErrors: -1}
	repaired := "not run"
	if out, err := v.Nodetool("repair", "-full", keyspace); err != nil {
		t.Errorf("repair: %v", err)
	} else {
		repaired = "took " + time.Since(repairBegan).Round(100*time.Millisecond).String()
		t.Logf("nodetool repair -full %s on node %d: %s\n%s", keyspace, victim+1, repaired, lastLine(out))
		afterRepair = checkAll(t, st, tally.acked)
		t.Logf("after the repair: %s", afterRepair)
	}

	kinds := make([]string, 0, len(tally.failed))
	for k, n := range tally.failed {
		kinds = append(kinds, fmt.Sprintf("%d %s", n, k))
	}
	sort.Strings(kinds)
	report := fmt.Sprintf("%s (write %s, read %s; node %d killed): %d deliveries attempted, %d acknowledged (%d while the node was down), %d failed [%s]\n"+
		"  node down: %s\n  right after its return: %s\n  %s later, no repair: %s\n  after nodetool repair -full (%s): %s",
		lv.name, lv.write, lv.read, victim+1, tally.attempted, len(tally.acked), tally.ackedDown, tally.attempted-len(tally.acked),
		strings.Join(kinds, "; "), afterKill, afterReturn, hintsWait, afterHints, repaired, afterRepair)
	t.Log(report)

	for what, r := range map[string]checkResult{"node down": afterKill, "after its return": afterReturn, "before repair": afterHints, "after repair": afterRepair} {
		if r.wrong > 0 {
			t.Errorf("%s: %d acknowledged messages read back with other content", what, r.wrong)
		}
		if lv.mustFindEach && r.missing() > 0 {
			t.Errorf("%s at %s: %d acknowledged messages missing", what, lv.name, r.missing())
		}
	}
	if afterRepair.readErrors == 0 && afterRepair.missing() > 0 {
		t.Errorf("after repair at %s: %d acknowledged messages missing", lv.name, afterRepair.missing())
	}
	if len(tally.acked) == 0 || tally.ackedDown == 0 {
		t.Errorf("%d messages acknowledged, %d while the node was down: the run wrote too little to say anything", len(tally.acked), tally.ackedDown)
	}
	return report
}

// checkAll reads every acknowledged message back through the store at its
// read level: the index record (message id and size) and the body (its
// SHA-256).
func checkAll(t *testing.T, st *cassandra.Store, acked []delivered) checkResult {
	began := time.Now()
	var (
		mu   sync.Mutex
		res  = checkResult{errKinds: map[string]int{}}
		wg   sync.WaitGroup
		next atomic.Int64
	)
	for range checkers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= len(acked) {
					return
				}
				d := acked[i]
				ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
				outcome, err := checkOne(ctx, st, d)
				cancel()
				mu.Lock()
				switch outcome {
				case "index":
					res.missingIndex++
				case "body":
					res.missingBody++
				case "wrong":
					res.wrong++
				case "error":
					res.readErrors++
					res.errKinds[errorKind(err)]++
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.took = time.Since(began)
	return res
}

// checkOne reads one message: "" if it is there as written, "index" or
// "body" if that part is missing, "wrong" if it has other content, "error"
// if it could not be read.
func checkOne(ctx context.Context, st *cassandra.Store, d delivered) (string, error) {
	m, err := st.Message(ctx, d.user, inbox, d.uid)
	if errors.Is(err, mailbox.ErrNoMessage) {
		return "index", nil
	}
	if err != nil {
		return "error", err
	}
	if m.ID != d.id || m.Size != d.size {
		return "wrong", nil
	}
	body, err := st.Body(ctx, d.user, d.id)
	if errors.Is(err, mailbox.ErrNoMessage) {
		return "body", nil
	}
	if err != nil {
		return "error", err
	}
	if sha256.Sum256(body) != d.sum {
		return "wrong", nil
	}
	return "", nil
}

func lastLine(b []byte) string {
	lines := strings.Split(strings.TrimSpace(string(b)), "\n")
	return lines[len(lines)-1]
}

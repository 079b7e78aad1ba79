package cassandra_test

import (
	"context"
	"errors"
	"fmt"
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
)

const (
	// benchSeed seeds the writers' sizes and bytes; printed with the
	// figures.
	benchSeed = 15
	// benchWriters is how many writers store at once (CassMail drove its
	// servers with many concurrent SMTP clients);
	// QUILL_CASSANDRA_BENCH_WRITERS sets another.
	benchWriters = 16
	// benchSeconds is how long each row writes;
	// QUILL_CASSANDRA_BENCH_SECONDS sets another.
	benchSeconds = 15
	// benchWarmup is written, unmeasured, when a cluster is new, so the
	// JIT has compiled the write path before the first row.
	benchWarmup = 10 * time.Second
	// benchUsers are the recipients the writers spread over.
	benchUsers = 64
)

// benchRow is one configuration: replication factor and write level.
type benchRow struct {
	rf    int
	write gocql.Consistency
}

func (r benchRow) name() string { return fmt.Sprintf("RF%d-%s", r.rf, r.write) }

// benchClusters are CassMail's two set-ups: one node, and three nodes at
// every replication factor and write level (RF 1 has one level: every one
// of them waits for the only replica; at RF 2 QUORUM is ALL, run anyway to
// show it).
var benchClusters = []struct {
	nodes int
	rows  []benchRow
}{
	{1, []benchRow{{1, gocql.One}}},
	{3, []benchRow{{1, gocql.One}, {2, gocql.One}, {2, gocql.Quorum}, {2, gocql.All},
		{3, gocql.One}, {3, gocql.Quorum}, {3, gocql.All}}},
}

// TestStoreThroughput writes messages through the store (PutBody, then
// PutMessage) with concurrent writers for a fixed time per row, and logs
// messages/s and MB/s per cluster, replication factor, write consistency
// level and size range. Each row writes into a keyspace of its own, made
// before and dropped after it, so no row pays for the compactions of the
// one before. A row is a subtest:
//
//	go test -run 'TestStoreThroughput/nodes3/RF3-ALL/200KB-2MB$' ./tests/cassandra/
func TestStoreThroughput(t *testing.T) {
	if os.Getenv("QUILL_CASSANDRA_BENCH") == "" {
		t.Skip("set QUILL_CASSANDRA_BENCH=1 (make cassandra-bench): Cassandra clusters of one and three nodes, several minutes")
	}
	writers := envInt(t, "QUILL_CASSANDRA_BENCH_WRITERS", benchWriters)
	secs := envInt(t, "QUILL_CASSANDRA_BENCH_SECONDS", benchSeconds)
	t.Logf("seed %d, %d writers, %d s a row, load average %s", benchSeed, writers, secs, loadavg())
	var (
		mu    sync.Mutex
		lines []string
	)
	for _, bc := range benchClusters {
		t.Run(fmt.Sprintf("nodes%d", bc.nodes), func(t *testing.T) {
			began := time.Now()
			c, err := cassandratest.StartCluster(cassandratest.ClusterOptions{Nodes: bc.nodes})
			if errors.Is(err, cassandratest.ErrNoJava) {
				t.Skip(err)
			}
			if err != nil {
				t.Fatal(err)
			}
			defer c.Stop()
			t.Logf("%d nodes up in %s (pids %s)", bc.nodes, time.Since(began).Round(time.Second), pids(c))
			warm := false
			for _, row := range bc.rows {
				t.Run(row.name(), func(t *testing.T) {
					for _, sizes := range []sizeRange{smallMessages, largeMessages} {
						t.Run(sizes.name, func(t *testing.T) {
							if !warm {
								ks := "bench_warmup"
								st := openStore(t, c.Hosts(), ks, 1, gocql.One, gocql.One)
								benchWrite(t, st, writers, benchWarmup, smallMessages)
								st.Close()
								dropKeyspace(t, c, ks)
								warm = true
							}
							ks := strings.ToLower(fmt.Sprintf("bench_%d_%s_%d", bc.nodes, row.name(), sizes.min))
							ks = strings.ReplaceAll(ks, "-", "_")
							st := openStore(t, c.Hosts(), ks, row.rf, gocql.One, row.write)
							load := loadavg()
							r := benchWrite(t, st, writers, time.Duration(secs)*time.Second, sizes)
							st.Close()
							dropKeyspace(t, c, ks)
							line := fmt.Sprintf("| %d | %d | %s | %s | %.0f | %.1f | %s | %s | %d | %s→%s |", bc.nodes, row.rf, row.write, sizes.name,
								r.perSecond(), r.mbPerSecond(), r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond), r.failed, load, loadavg())
							t.Logf("%d messages (%.1f MB) in %s: %s", r.messages, float64(r.bytes)/1e6, r.took.Round(100*time.Millisecond), line)
							if len(r.errKinds) > 0 {
								t.Logf("failures: %v", r.errKinds)
							}
							mu.Lock()
							lines = append(lines, line)
							mu.Unlock()
						})
					}
				})
			}
		})
	}
	t.Logf("| nodes | RF | write | sizes | messages/s | MB/s | p50 | p99 | failed | load |\n%s", strings.Join(lines, "\n"))
}

func pids(c *cassandratest.Cluster) string {
	var p []string
	for _, n := range c.Nodes {
		p = append(p, fmt.Sprint(n.PID))
	}
	return strings.Join(p, ",")
}

// benchResult is one row's figures.
type benchResult struct {
	messages, bytes, failed int64
	took, p50, p99          time.Duration
	errKinds                map[string]int
}

func (r benchResult) perSecond() float64   { return float64(r.messages) / r.took.Seconds() }
func (r benchResult) mbPerSecond() float64 { return float64(r.bytes) / 1e6 / r.took.Seconds() }

// benchWrite runs writers for d, each delivering messages of the given
// sizes to users in turn, and returns what was acknowledged.
func benchWrite(t *testing.T, st *cassandra.Store, writers int, d time.Duration, sizes sizeRange) benchResult {
	t.Helper()
	var (
		res       = benchResult{errKinds: map[string]int{}}
		mu        sync.Mutex
		latencies []time.Duration
		uids      [benchUsers]atomic.Uint32
		wg        sync.WaitGroup
	)
	began := time.Now()
	deadline := began.Add(d)
	for n := range writers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			w := newWriter(st, benchSeed, n, sizes)
			for u := n; time.Now().Before(deadline); u++ {
				ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
				start := time.Now()
				dl, _, err := w.deliver(ctx, fmt.Sprintf("bench%02d@example.org", u%benchUsers), uids[u%benchUsers].Add(1))
				cancel()
				took := time.Since(start)
				mu.Lock()
				if err != nil {
					res.failed++
					res.errKinds[errorKind(err)]++
				} else {
					res.messages++
					res.bytes += dl.size
					latencies = append(latencies, took)
				}
				mu.Unlock()
			}
		}()
	}
	wg.Wait()
	res.took = time.Since(began)
	sort.Slice(latencies, func(i, j int) bool { return latencies[i] < latencies[j] })
	if n := len(latencies); n > 0 {
		res.p50, res.p99 = latencies[n/2], latencies[n*99/100]
	}
	return res
}

// dropKeyspace removes a row's keyspace (Cassandra keeps a snapshot of
// it, hard links in the node's directory, gone with the cluster).
func dropKeyspace(t *testing.T, c *cassandratest.Cluster, ks string) {
	t.Helper()
	cl := gocql.NewCluster(c.Hosts()...)
	cl.Timeout = time.Minute
	s, err := cl.CreateSession()
	if err != nil {
		t.Fatalf("drop keyspace %s: %v", ks, err)
	}
	defer s.Close()
	if err := s.Query("DROP KEYSPACE IF EXISTS " + ks).Exec(); err != nil {
		t.Fatalf("drop keyspace %s: %v", ks, err)
	}
}

package cassandra_test

import (
	"context"
	"errors"
	"fmt"
	"os"
	"slices"
	"sort"
	"strconv"
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
	benchSeconds = 10
	// benchWarmup is written, unmeasured, when a cluster is new, so the
	// JIT has compiled the write path before the first row.
	benchWarmup = 10 * time.Second
	// benchRounds is how many times each row runs (the median is
	// reported); QUILL_CASSANDRA_BENCH_ROUNDS sets another.
	benchRounds = 3
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
// one before; the rows run in rounds (every row once, then again), and the
// summary gives each row's median, so a burst of other work on the
// machine moves one figure of a row rather than all. A row is a subtest:
//
//	go test -run 'TestStoreThroughput/nodes3/RF3-ALL/200KB-2MB$' ./tests/cassandra/
func TestStoreThroughput(t *testing.T) {
	if os.Getenv("QUILL_CASSANDRA_BENCH") == "" {
		t.Skip("set QUILL_CASSANDRA_BENCH=1 (make cassandra-bench): Cassandra clusters of one and three nodes, several minutes")
	}
	writers := envInt(t, "QUILL_CASSANDRA_BENCH_WRITERS", benchWriters)
	secs := envInt(t, "QUILL_CASSANDRA_BENCH_SECONDS", benchSeconds)
	rounds := envInt(t, "QUILL_CASSANDRA_BENCH_ROUNDS", benchRounds)
	t.Logf("seed %d, %d writers, %d s a row, %d rounds, load average %s", benchSeed, writers, secs, rounds, loadavg())
	var (
		mu      sync.Mutex
		results = map[string][]benchResult{}
	)
	sizeRanges := []sizeRange{smallMessages, largeMessages}
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
			st := openStore(t, c.Hosts(), "bench_warmup", 1, gocql.One, gocql.One)
			benchWrite(t, st, c, writers, benchWarmup, smallMessages)
			st.Close()
			dropKeyspace(t, c, "bench_warmup")
			for round := range rounds {
				for _, row := range bc.rows {
					t.Run(row.name(), func(t *testing.T) {
						for _, sizes := range sizeRanges {
							t.Run(sizes.name, func(t *testing.T) {
								ks := strings.ToLower(fmt.Sprintf("bench_%d_%s_%d", bc.nodes, row.name(), sizes.min))
								ks = strings.ReplaceAll(ks, "-", "_")
								st := openStore(t, c.Hosts(), ks, row.rf, gocql.One, row.write)
								r := benchWrite(t, st, c, writers, time.Duration(secs)*time.Second, sizes)
								st.Close()
								dropKeyspace(t, c, ks)
								t.Logf("round %d: %d messages (%.1f MB) in %s: %.0f messages/s, %.1f MB/s, p50 %s, p99 %s, %d failed, load %s→%s, cores %.0f%% busy, %.0f%% of it ours",
									round+1, r.messages, float64(r.bytes)/1e6, r.took.Round(100*time.Millisecond), r.perSecond(), r.mbPerSecond(),
									r.p50.Round(time.Millisecond), r.p99.Round(time.Millisecond), r.failed, r.loadBefore, r.loadAfter, 100*r.busy, 100*r.share)
								if len(r.errKinds) > 0 {
									t.Logf("failures: %v", r.errKinds)
								}
								mu.Lock()
								k := benchKey(bc.nodes, row, sizes)
								results[k] = append(results[k], r)
								mu.Unlock()
							})
						}
					})
				}
			}
		})
	}
	t.Log(benchSummary(results, sizeRanges))
}

func benchKey(nodes int, row benchRow, sizes sizeRange) string {
	return fmt.Sprintf("%d/%s/%s", nodes, row.name(), sizes.name)
}

// benchSummary is the table of docs/benchmarks.md: each row's median
// round, the range over the rounds, and ALL against ONE per replication
// factor and size range.
func benchSummary(results map[string][]benchResult, sizeRanges []sizeRange) string {
	var b strings.Builder
	b.WriteString("| nodes | RF | write | sizes | messages/s (median; range) | MB/s (median) | p50 | p99 | failed | load | ours |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	median := map[string]benchResult{}
	for _, bc := range benchClusters {
		for _, row := range bc.rows {
			for _, sizes := range sizeRanges {
				rs := slices.Clone(results[benchKey(bc.nodes, row, sizes)])
				if len(rs) == 0 {
					continue
				}
				sort.Slice(rs, func(i, j int) bool { return rs[i].perSecond() < rs[j].perSecond() })
				m := rs[len(rs)/2]
				median[benchKey(bc.nodes, row, sizes)] = m
				var failed int64
				for _, r := range rs {
					failed += r.failed
				}
				fmt.Fprintf(&b, "| %d | %d | %s | %s | %.0f (%.0f–%.0f) | %.1f | %s | %s | %d | %s–%s | %.0f%% |\n", bc.nodes, row.rf, row.write, sizes.name,
					m.perSecond(), rs[0].perSecond(), rs[len(rs)-1].perSecond(), m.mbPerSecond(),
					m.p50.Round(time.Millisecond), m.p99.Round(time.Millisecond), failed, m.loadBefore, m.loadAfter, 100*m.share)
			}
		}
	}
	for _, bc := range benchClusters {
		for _, rf := range []int{2, 3} {
			for _, sizes := range sizeRanges {
				one, ok1 := median[benchKey(bc.nodes, benchRow{rf, gocql.One}, sizes)]
				all, ok2 := median[benchKey(bc.nodes, benchRow{rf, gocql.All}, sizes)]
				if ok1 && ok2 {
					fmt.Fprintf(&b, "%d nodes, RF %d, %s: ALL/ONE %.2f (ALL costs %.0f%%)\n", bc.nodes, rf, sizes.name,
						all.perSecond()/one.perSecond(), 100*(1-all.perSecond()/one.perSecond()))
				}
			}
		}
	}
	return b.String()
}

func pids(c *cassandratest.Cluster) string {
	var p []string
	for _, pid := range nodePIDs(c) {
		p = append(p, fmt.Sprint(pid))
	}
	return strings.Join(p, ",")
}

func nodePIDs(c *cassandratest.Cluster) []int {
	var p []int
	for _, n := range c.Nodes {
		p = append(p, n.PID)
	}
	return p
}

// cpuTicks reads the CPU time (user + system, clock ticks) the processes
// pids have used, and the machine's busy and total CPU time (/proc/stat's
// first line: busy is all but idle and iowait).
func cpuTicks(pids []int) (ours, busy, total uint64) {
	for _, pid := range pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue
		}
		// Fields after the command (which is in parentheses and may hold
		// spaces): state is field 3, utime 14, stime 15.
		f := strings.Fields(string(b[strings.LastIndexByte(string(b), ')')+1:]))
		if len(f) > 12 {
			u, _ := strconv.ParseUint(f[11], 10, 64)
			s, _ := strconv.ParseUint(f[12], 10, 64)
			ours += u + s
		}
	}
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return ours, 0, 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	for i, v := range strings.Fields(line)[1:] {
		n, _ := strconv.ParseUint(v, 10, 64)
		total += n
		if i != 3 && i != 4 { // idle, iowait
			busy += n
		}
	}
	return ours, busy, total
}

// benchResult is one row's figures.
type benchResult struct {
	messages, bytes, failed int64
	took, p50, p99          time.Duration
	errKinds                map[string]int
	loadBefore, loadAfter   string // the machine's load average around the row
	// share is the part of the machine's busy CPU time during the row
	// that went to this test and its Cassandra nodes (the rest was other
	// work on the machine), and busy how busy its cores were.
	share, busy float64
}

func (r benchResult) perSecond() float64   { return float64(r.messages) / r.took.Seconds() }
func (r benchResult) mbPerSecond() float64 { return float64(r.bytes) / 1e6 / r.took.Seconds() }

// benchWrite runs writers for d, each delivering messages of the given
// sizes to users in turn, and returns what was acknowledged.
func benchWrite(t *testing.T, st *cassandra.Store, c *cassandratest.Cluster, writers int, d time.Duration, sizes sizeRange) benchResult {
	t.Helper()
	ours := append([]int{os.Getpid()}, nodePIDs(c)...)
	cpu0, busy0, total0 := cpuTicks(ours)
	var (
		res       = benchResult{errKinds: map[string]int{}, loadBefore: loadavg()}
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
	res.loadAfter = loadavg()
	cpu1, busy1, total1 := cpuTicks(ours)
	if busy1 > busy0 && total1 > total0 {
		// min: the two counts are read a moment apart.
		res.share = min(1, float64(cpu1-cpu0)/float64(busy1-busy0))
		res.busy = float64(busy1-busy0) / float64(total1-total0)
	}
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

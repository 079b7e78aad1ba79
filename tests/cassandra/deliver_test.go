// Package cassandra_test measures what Apache Cassandra guarantees to
// Quill's Cassandra store (internal/cassandra) on a real cluster of
// several nodes, each its own JVM on its own loopback address, started by
// the tests (cassandratest.StartCluster) and stopped by their PIDs:
//
//   - TestCassandraFaults (make cassandra-faults): several writers store
//     messages as delivery would while one node of three is killed with
//     kill -9 and started again; every message Cassandra acknowledged is
//     read back (index record and body SHA-256) with the node down, right
//     after it returns, and after nodetool repair, per consistency level.
//   - TestStoreThroughput (make cassandra-bench): the CassMail experiments
//     (Koromilas and Magoutis, DAIS 2011, §5) at the store level: messages
//     of 2-20 KB and of 200 KB-2 MB written by concurrent writers on one
//     node and on three, at replication factors 1-3 and consistency levels
//     ONE, QUORUM and ALL.
//
// Both are long and need the machine: they run only when asked
// (QUILL_CASSANDRA_FAULTS, QUILL_CASSANDRA_BENCH), never in CI. They
// measure the store's writes, not SMTP delivery: that waits for quill serve
// --store cassandra (issue 15).
package cassandra_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"strings"
	"testing"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
	"github.com/quillmail/quill/internal/cassandra"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
)

// inbox is the UIDVALIDITY of the one mailbox each test user receives in.
const inbox = 1

// sizeRange is a range of message sizes, drawn uniformly (CassMail §5
// uses two: 2-20 KB and 200 KB-2 MB).
type sizeRange struct {
	name     string
	min, max int
}

var (
	smallMessages = sizeRange{"2-20KB", 2_000, 20_000}
	largeMessages = sizeRange{"200KB-2MB", 200_000, 2_000_000}
)

func (s sizeRange) draw(rng *rand.Rand) int { return s.min + rng.IntN(s.max-s.min+1) }

// writer stores messages the way delivery would: the body first, then the
// index record under the next UID of the user's mailbox, stamped by the
// writer's HLC. Each writer has its own random source, seeded from the
// run's seed, so a run's messages are the same each time.
type writer struct {
	st    *cassandra.Store
	rng   *rand.Rand
	clock *hlc.Clock
	node  cluster.NodeID
	sizes sizeRange
	buf   []byte
}

func newWriter(st *cassandra.Store, seed uint64, n int, sizes sizeRange) *writer {
	return &writer{st: st, rng: rand.New(rand.NewPCG(seed, uint64(n))), clock: hlc.New(),
		node: cluster.NodeID(fmt.Sprintf("w%d", n)), sizes: sizes, buf: make([]byte, sizes.max)}
}

// delivered is a message whose two writes Cassandra acknowledged.
type delivered struct {
	user string
	uid  uint32
	id   string
	size int64
	sum  [sha256.Size]byte
}

// deliver writes one message for user under uid. On an error, failedAt
// names the write that failed (body or index).
func (w *writer) deliver(ctx context.Context, user string, uid uint32) (d delivered, failedAt string, err error) {
	n := w.sizes.draw(w.rng)
	body := w.buf[:n]
	for i := 0; i < n; i += 8 {
		v := w.rng.Uint64()
		for j := 0; j < 8 && i+j < n; j++ {
			body[i+j] = byte(v >> (8 * j))
		}
	}
	d = delivered{user: user, uid: uid, id: fmt.Sprintf("%016x%016x", w.rng.Uint64(), w.rng.Uint64()),
		size: int64(n), sum: sha256.Sum256(body)}
	if _, err := w.st.PutBody(ctx, user, d.id, bytes.NewReader(body)); err != nil {
		return d, "body", err
	}
	m := &mailbox.Message{UID: uid, ID: d.id, Size: d.size, Date: time.Now(), ModSeq: uint64(uid),
		Version: replica.Stamp{Clock: w.clock.Now(), Node: w.node}}
	if err := w.st.PutMessage(ctx, user, inbox, m); err != nil {
		return d, "index", err
	}
	return d, "", nil
}

// errorKind names an error for the report: its Cassandra error class (or
// the driver's), and whether cassandra.Retryable says a later try may pass.
func errorKind(err error) string {
	var (
		wt *gocql.RequestErrWriteTimeout
		rt *gocql.RequestErrReadTimeout
		un *gocql.RequestErrUnavailable
		ov *gocql.RequestErrOverloaded
		wf *gocql.RequestErrWriteFailure
		rf *gocql.RequestErrReadFailure
	)
	kind := ""
	switch {
	case errors.As(err, &wt):
		kind = "write timeout (" + wt.WriteType + ")"
	case errors.As(err, &rt):
		kind = "read timeout"
	case errors.As(err, &un):
		kind = "unavailable"
	case errors.As(err, &ov):
		kind = "overloaded"
	case errors.As(err, &wf):
		kind = "write failure"
	case errors.As(err, &rf):
		kind = "read failure"
	case errors.Is(err, gocql.ErrTimeoutNoResponse):
		kind = "client timeout"
	case errors.Is(err, gocql.ErrNoConnections):
		kind = "no connections"
	case errors.Is(err, gocql.ErrConnectionClosed):
		kind = "connection closed"
	case errors.Is(err, context.DeadlineExceeded):
		kind = "deadline"
	default:
		// The driver's own words, without the store's context (which
		// names the message): "gocql: failed to read ...: EOF".
		s := err.Error()
		if i := strings.Index(s, "gocql: "); i >= 0 {
			s = s[i:]
		} else {
			for u := errors.Unwrap(err); u != nil; u = errors.Unwrap(u) {
				s = u.Error()
			}
		}
		kind = fmt.Sprintf("%.90s", s)
	}
	if cassandra.Retryable(err) {
		return kind + ", retryable"
	}
	return kind + ", not retryable"
}

// openStore opens the store on a keyspace of its own at the given
// replication factor and consistency levels.
func openStore(t *testing.T, hosts []string, keyspace string, rf int, read, write gocql.Consistency) *cassandra.Store {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	st, err := cassandra.Open(ctx, cassandra.Config{Hosts: hosts, Keyspace: keyspace,
		Replication: cassandra.Replication{Factor: rf}, Read: read, Write: write})
	if err != nil {
		t.Fatalf("open keyspace %s: %v", keyspace, err)
	}
	return st
}

// envInt reads a positive integer setting, or def.
func envInt(t *testing.T, name string, def int) int {
	s := os.Getenv(name)
	if s == "" {
		return def
	}
	n, err := strconv.Atoi(s)
	if err != nil || n < 1 {
		t.Fatalf("%s=%q: want a positive integer", name, s)
	}
	return n
}

// loadavg is the machine's load over the last minute, for the report:
// the nodes, the test and other work share its cores.
func loadavg() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "?"
	}
	return strings.Fields(string(b))[0]
}

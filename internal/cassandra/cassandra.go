// Package cassandra keeps Quill's hard state in Apache Cassandra (issue
// 15, after CassMail: Koromilas and Magoutis, DAIS 2011, shared/seeds/002):
// profiles, mailbox records, the message index, bodies, the outbound queue,
// the clusterwide objects and the UID/MODSEQ reservations of each
// mailbox's writer, in one keyspace whose replication factor and read and
// write consistency levels are chosen per deployment.
//
// CassMail's schema (its Fig. 1) is two column families in a keyspace Mail:
// Users keyed by user, and Mailboxes keyed by user+mailbox holding the
// messages as blocks ordered by time UUIDs. IMAP needs more: UIDs that only
// grow, flags and MODSEQs per message, a mailbox renamed without moving its
// messages, bodies too large for one cell. The tables (schema.go, and
// docs/cassandra.md) keep Fig. 1's keys where they fit and bound every
// partition: the message index is clustered by UID in partitions of 65,536
// UIDs, bodies above 1 MiB are cut into chunks of their own partitions,
// users are spread over 16 partitions per user-map bucket.
//
// Writes of the objects that carry an HLC stamp (profiles, index records,
// queue entries, clusterwide objects) are made USING TIMESTAMP the stamp,
// so Cassandra's last-write-wins is Quill's newest-stamp-wins (Porcupine
// §4.1) without a read before each write: a late update with an older
// stamp loses, as a replica of the native store refuses it.
//
// What is written here by hand and why: the driver is the Apache
// cassandra-gocql-driver (v2); what no library does is map Quill's types to
// tables, order the schema migrations across nodes that start at once, and
// fence the mailbox writers' UID reservations with lightweight
// transactions (fence.go).
package cassandra

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
	"github.com/quillmail/quill/internal/retry"
)

const (
	// DefaultKeyspace is CassMail's keyspace name, lower-cased (CQL
	// folds unquoted names).
	DefaultKeyspace = "mail"
	// DefaultPort is Cassandra's native protocol port.
	DefaultPort = 9042

	// connectTimeout bounds opening a connection to one Cassandra node.
	connectTimeout = 5 * time.Second
	// queryTimeout bounds one request on the client side. Cassandra's own
	// timeouts are shorter (write_request_timeout 2 s, read 5 s, CAS
	// contention 1 s), so the server's answer, a timeout included, comes
	// before this one fires; it only catches a node that stopped answering.
	queryTimeout = 12 * time.Second
	// schemaAgreementWait bounds the wait after a schema change until
	// every live node has the new schema.
	schemaAgreementWait = time.Minute
	// pageSize is how many rows one page of a scan brings.
	pageSize = 1000
	// lostCoordinatorRetries is how many more times a read or a plain
	// write is sent, each to the next node, when the connection to the
	// node coordinating it broke under it (the node died: kill -9 in
	// make cassandra-serve-faults gave IMAP commands "connection reset"
	// otherwise). One: a second node dying in the same request is not
	// worth a third try, and timeouts are not retried here at all (the
	// callers decide, and a retried timeout would double the wait).
	lostCoordinatorRetries = 1
)

// Replication says how many copies Cassandra keeps of each row: Factor
// copies with SimpleStrategy, or per data centre with
// NetworkTopologyStrategy when DataCenters is set.
type Replication struct {
	Factor      int
	DataCenters map[string]int
}

// ParseReplication reads a replication setting: "3" (SimpleStrategy, 3
// copies) or "dc1:3,dc2:2" (NetworkTopologyStrategy, per data centre).
func ParseReplication(s string) (Replication, error) {
	s = strings.TrimSpace(s)
	if n, err := strconv.Atoi(s); err == nil {
		if n < 1 {
			return Replication{}, fmt.Errorf("replication %q: the factor must be at least 1", s)
		}
		return Replication{Factor: n}, nil
	}
	r := Replication{DataCenters: map[string]int{}}
	for _, part := range strings.Split(s, ",") {
		dc, f, ok := strings.Cut(strings.TrimSpace(part), ":")
		n, err := strconv.Atoi(f)
		if !ok || err != nil || n < 0 || !dcName.MatchString(dc) {
			return Replication{}, fmt.Errorf("replication %q: want a factor (3) or data centres with factors (dc1:3,dc2:2)", s)
		}
		r.DataCenters[dc] = n
	}
	return r, nil
}

// dcName is what a data centre name may be inside the CQL map literal.
var dcName = regexp.MustCompile(`^[A-Za-z0-9_.-]{1,64}$`)

// String is the form ParseReplication reads.
func (r Replication) String() string {
	if len(r.DataCenters) == 0 {
		return strconv.Itoa(r.Factor)
	}
	var parts []string
	for dc, n := range r.DataCenters {
		parts = append(parts, fmt.Sprintf("%s:%d", dc, n))
	}
	sort.Strings(parts)
	return strings.Join(parts, ",")
}

// cql is the replication map of CREATE KEYSPACE.
func (r Replication) cql() string {
	if len(r.DataCenters) == 0 {
		return fmt.Sprintf("{'class': 'SimpleStrategy', 'replication_factor': %d}", max(r.Factor, 1))
	}
	dcs := make([]string, 0, len(r.DataCenters))
	for dc := range r.DataCenters {
		dcs = append(dcs, dc)
	}
	sort.Strings(dcs)
	s := "{'class': 'NetworkTopologyStrategy'"
	for _, dc := range dcs {
		s += fmt.Sprintf(", '%s': %d", dc, r.DataCenters[dc])
	}
	return s + "}"
}

// Consistency levels Quill accepts for reads and writes (CassMail §4
// evaluated ONE and ALL; QUORUM is the default: a read at QUORUM sees
// every write acknowledged at QUORUM).
var consistencies = map[string]gocql.Consistency{
	"ONE":          gocql.One,
	"QUORUM":       gocql.Quorum,
	"ALL":          gocql.All,
	"LOCAL_QUORUM": gocql.LocalQuorum,
}

// ParseConsistency reads a consistency level name (case-insensitive).
func ParseConsistency(s string) (gocql.Consistency, error) {
	if c, ok := consistencies[strings.ToUpper(strings.TrimSpace(s))]; ok {
		return c, nil
	}
	names := make([]string, 0, len(consistencies))
	for n := range consistencies {
		names = append(names, n)
	}
	sort.Strings(names)
	return 0, fmt.Errorf("consistency %q: want one of %s", s, strings.Join(names, ", "))
}

// Config says which cluster, keyspace, replication and consistency levels.
type Config struct {
	// Hosts are some of the cluster's nodes, host or host:port (port
	// DefaultPort); the driver finds the others.
	Hosts []string
	// Keyspace holds Quill's tables (DefaultKeyspace when empty); made
	// with Replication if it does not exist.
	Keyspace    string
	Replication Replication
	// Read and Write are the consistency levels of reads and writes
	// (QUORUM when zero). A conditional update (fence.go, schema.go)
	// commits at Write and decides at SERIAL, or LOCAL_SERIAL when Write
	// is LOCAL_QUORUM.
	Read, Write gocql.Consistency
	// Log hears of what an operator should know (nil: discarded).
	Log *slog.Logger
}

var keyspaceName = regexp.MustCompile(`^[a-z][a-z0-9_]{0,47}$`)

func (c *Config) defaults() error {
	if len(c.Hosts) == 0 {
		return errors.New("cassandra: no hosts given")
	}
	if c.Keyspace == "" {
		c.Keyspace = DefaultKeyspace
	}
	if !keyspaceName.MatchString(c.Keyspace) {
		return fmt.Errorf("cassandra: keyspace %q: want a lower-case letter then letters, digits or _, at most 48", c.Keyspace)
	}
	if c.Replication.Factor == 0 && len(c.Replication.DataCenters) == 0 {
		c.Replication.Factor = 1
	}
	if c.Read == 0 {
		c.Read = gocql.Quorum
	}
	if c.Write == 0 {
		c.Write = gocql.Quorum
	}
	if c.Log == nil {
		c.Log = slog.New(slog.DiscardHandler)
	}
	return nil
}

// Store is Quill's hard state in one Cassandra keyspace.
type Store struct {
	cfg    Config
	s      *gocql.Session
	serial gocql.Consistency
}

// Open connects, makes the keyspace if it is missing and brings its schema
// to this build's version (schema.go).
func Open(ctx context.Context, cfg Config) (*Store, error) {
	if err := cfg.defaults(); err != nil {
		return nil, err
	}
	boot, err := session(cfg, "")
	if err != nil {
		return nil, err
	}
	err = ensureKeyspace(ctx, boot, cfg)
	boot.Close()
	if err != nil {
		return nil, err
	}
	// A keyspace another node made a moment ago may be in a node's
	// system_schema before the node can use it, and the session's
	// connections, which USE it, then fail: a few tries more.
	var s *gocql.Session
	err = retry.Do(ctx, migrationRetry, nil, func(context.Context) error {
		s, err = session(cfg, cfg.Keyspace)
		return err
	})
	if err != nil {
		return nil, err
	}
	st := &Store{cfg: cfg, s: s, serial: gocql.Serial}
	if cfg.Write == gocql.LocalQuorum {
		st.serial = gocql.LocalSerial
	}
	if err := st.migrate(ctx); err != nil {
		s.Close()
		return nil, err
	}
	return st, nil
}

func session(cfg Config, keyspace string) (*gocql.Session, error) {
	c := gocql.NewCluster(cfg.Hosts...)
	c.Port = DefaultPort
	c.Keyspace = keyspace
	c.Consistency = cfg.Read
	c.Timeout = queryTimeout
	c.ConnectTimeout = connectTimeout
	c.MaxWaitSchemaAgreement = schemaAgreementWait
	c.PageSize = pageSize
	c.RetryPolicy = lostCoordinator{}
	s, err := c.CreateSession()
	if err != nil {
		return nil, fmt.Errorf("cassandra %s: connect: %w", strings.Join(cfg.Hosts, ","), err)
	}
	return s, nil
}

// replicationOf reads system_schema.keyspaces' replication map.
func replicationOf(m map[string]string) Replication {
	var r Replication
	for k, v := range m {
		n, _ := strconv.Atoi(v)
		switch {
		case k == "class":
		case k == "replication_factor":
			r.Factor = n
		default:
			if r.DataCenters == nil {
				r.DataCenters = map[string]int{}
			}
			r.DataCenters[k] = n
		}
	}
	if strings.HasSuffix(m["class"], "NetworkTopologyStrategy") {
		r.Factor = 0
	}
	return r
}

// Close ends the session.
func (st *Store) Close() { st.s.Close() }

// Keyspace is the keyspace in use.
func (st *Store) Keyspace() string { return st.cfg.Keyspace }

// read and write start a query at the configured consistency levels. Both
// are idempotent (a write is at its stamp, or of immutable bytes under
// their id: see Retryable), so the driver sends them to another node when
// their coordinator is lost (lostCoordinator).
func (st *Store) read(ctx context.Context, stmt string, args ...any) *gocql.Query {
	return st.s.Query(stmt, args...).Consistency(st.cfg.Read).Idempotent(true).WithContext(ctx)
}

func (st *Store) write(ctx context.Context, stmt string, args ...any) *gocql.Query {
	return st.s.Query(stmt, args...).Consistency(st.cfg.Write).Idempotent(true).WithContext(ctx)
}

// lostCoordinator is the driver's retry policy (used for idempotent
// queries only; conditional updates are not marked so, and fence.go
// decides about those): a request whose connection to its coordinator
// broke is sent to the next node, lostCoordinatorRetries times; any other
// error is the caller's.
type lostCoordinator struct{}

func (lostCoordinator) Attempt(q gocql.RetryableQuery) bool {
	return q.Attempts() <= lostCoordinatorRetries
}

func (lostCoordinator) GetRetryType(err error) gocql.RetryType {
	if connectionLost(err) {
		return gocql.RetryNextHost
	}
	return gocql.Rethrow
}

// cas starts a conditional update (a lightweight transaction): decided by
// Paxos among the replicas at SERIAL, committed at the write level.
func (st *Store) cas(ctx context.Context, stmt string, args ...any) *gocql.Query {
	return st.s.Query(stmt, args...).Consistency(st.cfg.Write).SerialConsistency(st.serial).WithContext(ctx)
}

// serialRead reads what conditional updates decided, in-flight ones
// included (a read at SERIAL finishes any Paxos round it finds).
func (st *Store) serialRead(ctx context.Context, stmt string, args ...any) *gocql.Query {
	return st.s.Query(stmt, args...).Consistency(st.serial).Idempotent(true).WithContext(ctx)
}

// stamped checks an HLC stamp used as a write timestamp: zero would lose
// to every write, and a value past int64 would wrap.
func stamped(what string, clock uint64) (int64, error) {
	if clock == 0 || clock > 1<<62 {
		return 0, fmt.Errorf("%s: stamp %d is not an HLC timestamp", what, clock)
	}
	return int64(clock), nil
}

// Retryable reports whether an error may pass if the request is made again
// a little later: a timeout, a conditional update whose outcome is unknown,
// too few replicas alive for the consistency level, an overloaded node, a
// replica that failed the request (one that has not yet applied a schema
// change, say), or the connection to the coordinator lost while the
// request was in flight (the node died: kill -9 in tests/cassandra gives
// "gocql: failed to read ...: EOF" and connection resets). Like a timeout,
// a lost connection leaves the outcome unknown; the store's writes are
// idempotent (a body is the same bytes under its id, a record is written
// at its stamp), so trying again is safe.
func Retryable(err error) bool {
	var (
		wt *gocql.RequestErrWriteTimeout
		rt *gocql.RequestErrReadTimeout
		cu *gocql.RequestErrCASWriteUnknown
		un *gocql.RequestErrUnavailable
		ov *gocql.RequestErrOverloaded
		wf *gocql.RequestErrWriteFailure
		rf *gocql.RequestErrReadFailure
	)
	return errors.As(err, &wt) || errors.As(err, &rt) || errors.As(err, &cu) || errors.As(err, &un) || errors.As(err, &ov) ||
		errors.As(err, &wf) || errors.As(err, &rf) ||
		errors.Is(err, gocql.ErrTimeoutNoResponse) || errors.Is(err, gocql.ErrNoConnections) || connectionLost(err)
}

// connectionLost reports whether err is a connection to a node that broke
// under a request: closed while waiting, ended (EOF) or reset by the peer.
func connectionLost(err error) bool {
	var src sourceError
	if errors.As(err, &src) {
		return false
	}
	return errors.Is(err, gocql.ErrConnectionClosed) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, syscall.ECONNRESET) || errors.Is(err, syscall.EPIPE)
}

// notFound reports whether a read found no row.
func notFound(err error) bool { return errors.Is(err, gocql.ErrNotFound) }

// cloneStrings keeps nil and empty apart no more than Quill's types do.
func cloneStrings(s []string) []string {
	if len(s) == 0 {
		return nil
	}
	return slices.Clone(s)
}

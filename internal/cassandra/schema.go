package cassandra

// The schema and its migrations. Every Quill node that opens the keyspace
// brings it to the newest version this build knows, and several nodes may
// start at once, so:
//
//   - every statement is idempotent (CREATE ... IF NOT EXISTS, ALTER ...
//     ADD IF NOT EXISTS), so running one twice does no harm;
//   - every schema change goes through one coordinator, the live node with
//     the lowest host id, so two of them never run at once on two nodes:
//     two CREATE KEYSPACE on two coordinators both apply, and the later
//     one's schema mutation shadows the tables made in between (seen here
//     on a 3-node cluster: "table schema_version does not exist");
//   - every table is created WITH ID, a UUID derived from the keyspace and
//     table names: two nodes creating the same table at once through
//     different coordinators would otherwise give it two ids, a schema
//     disagreement Cassandra does not mend by itself;
//   - a migration is claimed with a lightweight transaction on its row of
//     schema_version (INSERT ... IF NOT EXISTS), so one node runs it while
//     the others wait until it is marked done; a claim older than
//     migrationStale (its node died) is taken over.

import (
	"cmp"
	"context"
	"crypto/sha1"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
	"github.com/quillmail/quill/internal/retry"
)

const (
	// migrationStale is how old a claim on a migration may be before
	// another node takes it over: the claimant died while running it
	// (a run takes a few seconds: one schema change per table).
	migrationStale = 2 * time.Minute
	// migrationPoll is how often a node waiting for another's migration
	// looks whether it is done.
	migrationPoll = 500 * time.Millisecond
)

// migrationRetry paces the tries of a migration step that timed out.
var migrationRetry = retry.Policy{Attempts: 20, Base: 100 * time.Millisecond, Max: 2 * time.Second, Factor: 2}

// migration is one step of the schema: statements with {{.ks}} for the
// keyspace, and table names that get fixed ids.
type migration struct {
	name  string
	stmts []string
}

// migrations are applied in order, once; version n is migrations[n-1].
// Append, never edit one that has shipped.
var migrations = []migration{
	{name: "tables of CassMail Fig. 1 extended for IMAP", stmts: []string{
		// users: CassMail's Users, keyed by user; the partition is the
		// address's user-map bucket and one of 16 shards of it, so the user
		// manager's rebuild of a bucket (Porcupine §3.3) reads 16
		// partitions instead of scanning the table, and no partition holds
		// more than 1/4096 of the users. The profile is userdb's protobuf
		// record (nodepb.Profile), as the native store keeps it.
		`CREATE TABLE IF NOT EXISTS users (
			bucket smallint, shard smallint, address text,
			version bigint, deleted boolean, profile blob,
			PRIMARY KEY ((bucket, shard), address))`,
		// mailboxes: the user's mailbox records (mailbox.Mailbox),
		// clustered by UIDVALIDITY, the name the writer uses below it; a
		// rename changes one column.
		`CREATE TABLE IF NOT EXISTS mailboxes (
			user text, uidvalidity bigint, id bigint, name text,
			uidnext bigint, highestmodseq bigint, subscribed boolean,
			special_use text, created timestamp,
			PRIMARY KEY ((user), uidvalidity))`,
		// messages: CassMail's Mailboxes row (user+mailbox) ordered by UID
		// instead of a time UUID, cut into partitions of 65,536 UIDs
		// (uid_block = uid >> 16), so a partition holds at most 65,536
		// records of a few hundred bytes however large the mailbox grows.
		`CREATE TABLE IF NOT EXISTS messages (
			user text, uidvalidity bigint, uid_block bigint, uid bigint,
			id text, size bigint, internal_date timestamp,
			flags frozen<list<text>>, modseq bigint,
			stamp bigint, stamp_node text,
			PRIMARY KEY ((user, uidvalidity, uid_block), uid))`,
		// bodies: a message's bytes by user and message id, inline up to
		// 1 MiB, else in chunks of 1 MiB, each its own partition.
		`CREATE TABLE IF NOT EXISTS bodies (
			user text, id text, size bigint, chunks int, data blob,
			PRIMARY KEY ((user, id)))`,
		`CREATE TABLE IF NOT EXISTS body_chunks (
			user text, id text, chunk int, data blob,
			PRIMARY KEY ((user, id, chunk)))`,
		// queue: outbound entries (queue.Entry as nodepb.QueueEntry) over
		// 16 shards, and their messages chunked as bodies are.
		`CREATE TABLE IF NOT EXISTS queue (
			shard smallint, id text, version bigint, deleted boolean, entry blob,
			PRIMARY KEY ((shard), id))`,
		`CREATE TABLE IF NOT EXISTS queue_messages (
			id text, size bigint, chunks int, data blob,
			PRIMARY KEY ((id)))`,
		`CREATE TABLE IF NOT EXISTS queue_message_chunks (
			id text, chunk int, data blob,
			PRIMARY KEY ((id, chunk)))`,
		// clusterwide: kind/name -> bytes with their stamp (certificates,
		// DKIM keys, domains, aliases, policies), a partition per kind.
		`CREATE TABLE IF NOT EXISTS clusterwide (
			kind text, name text, version bigint, origin text,
			deleted boolean, data blob,
			PRIMARY KEY ((kind), name))`,
		// reservations: the ends of the UID and MODSEQ blocks a mailbox's
		// writer reserved, and which writer holds them (owner, epoch);
		// changed only by lightweight transactions (fence.go).
		`CREATE TABLE IF NOT EXISTS reservations (
			user text, uidvalidity bigint, owner text, epoch bigint,
			uid_reserved bigint, modseq_reserved bigint, claimed timestamp,
			PRIMARY KEY ((user, uidvalidity)))`,
	}},
}

// schemaVersionTable records each migration: who claimed it, when, and
// whether it is done. Made before any claim, like every table here.
const schemaVersionTable = `CREATE TABLE IF NOT EXISTS schema_version (
	version int PRIMARY KEY, name text, claimed_by text, claimed_at timestamp, done boolean)`

// tableID is the fixed id of a table: a name-based (version 5 style) UUID
// of the keyspace and table names.
func tableID(keyspace, table string) string {
	h := sha1.Sum([]byte("quill/cassandra/" + keyspace + "." + table))
	h[6] = h[6]&0x0f | 0x50
	h[8] = h[8]&0x3f | 0x80
	return fmt.Sprintf("%x-%x-%x-%x-%x", h[0:4], h[4:6], h[6:8], h[8:10], h[10:16])
}

// createdTable returns the table a CREATE TABLE statement makes, or "".
func createdTable(stmt string) string {
	f := strings.Fields(stmt)
	if len(f) < 6 || !strings.EqualFold(f[0], "CREATE") || !strings.EqualFold(f[1], "TABLE") {
		return ""
	}
	return f[5]
}

// withID adds the fixed id to a CREATE TABLE statement.
func withID(keyspace, stmt string) string {
	if t := createdTable(stmt); t != "" {
		return stmt + " WITH ID = " + tableID(keyspace, t)
	}
	return stmt
}

// SchemaVersion is the newest migration this build applies.
func SchemaVersion() int { return len(migrations) }

// ensureKeyspace makes the keyspace unless it exists, and says so when an
// existing one is replicated otherwise than configured: Quill does not
// change it, since the change needs a repair (nodetool repair) that an
// operator runs.
func ensureKeyspace(ctx context.Context, s *gocql.Session, cfg Config) error {
	repl, err := keyspaceReplication(ctx, s, cfg.Keyspace)
	if err != nil {
		return err
	}
	if repl == nil {
		stmt := fmt.Sprintf("CREATE KEYSPACE IF NOT EXISTS %s WITH replication = %s", cfg.Keyspace, cfg.Replication.cql())
		if err := ddl(ctx, s, stmt); err != nil {
			return fmt.Errorf("cassandra: keyspace %s: create: %w", cfg.Keyspace, err)
		}
		if repl, err = keyspaceReplication(ctx, s, cfg.Keyspace); err != nil {
			return err
		}
	}
	// Made by this node or by another a moment ago: every node must know
	// it before a session uses it.
	if err := awaitSchema(ctx, s, cfg.Keyspace, nil); err != nil {
		return err
	}
	if have := replicationOf(repl); have.String() != cfg.Replication.String() {
		cfg.Log.Warn("keyspace replicated otherwise than configured; change it with ALTER KEYSPACE and nodetool repair",
			"keyspace", cfg.Keyspace, "have", have.String(), "configured", cfg.Replication.String())
	}
	return nil
}

// keyspaceReplication reads a keyspace's replication map from the schema of
// the node that makes schema changes; nil if it has no such keyspace.
func keyspaceReplication(ctx context.Context, s *gocql.Session, keyspace string) (map[string]string, error) {
	var repl map[string]string
	err := s.Query("SELECT replication FROM system_schema.keyspaces WHERE keyspace_name = ?", keyspace).
		SetHostID(ddlHost(s)).ScanContext(ctx, &repl)
	if notFound(err) {
		return nil, nil
	}
	if err != nil {
		return nil, fmt.Errorf("cassandra: keyspace %s: read replication: %w", keyspace, err)
	}
	return repl, nil
}

// ddlHost is the node that makes every schema change: the live node with
// the lowest host id, the same for every Quill node that sees the same
// live nodes.
func ddlHost(s *gocql.Session) string {
	best := ""
	for _, h := range s.GetHosts() {
		if h.IsUp() && (best == "" || h.HostID() < best) {
			best = h.HostID()
		}
	}
	return best
}

// ddl runs a schema change on the ddl host.
func ddl(ctx context.Context, s *gocql.Session, stmt string) error {
	if err := s.Query(stmt).SetHostID(ddlHost(s)).WithContext(ctx).Exec(); err != nil {
		return fmt.Errorf("%s: %w", firstLine(stmt), err)
	}
	return nil
}

// migrate applies the migrations this keyspace lacks.
func (st *Store) migrate(ctx context.Context) error {
	if err := st.ddl(ctx, schemaVersionTable); err != nil {
		return err
	}
	if err := awaitSchema(ctx, st.s, st.cfg.Keyspace, []string{"schema_version"}); err != nil {
		return err
	}
	me := claimant()
	for i, m := range migrations {
		if err := st.applyMigration(ctx, i+1, m, me); err != nil {
			return fmt.Errorf("cassandra: keyspace %s: migration %d (%s): %w", st.cfg.Keyspace, i+1, m.name, err)
		}
	}
	// The tables another node made must be known to every coordinator
	// before this node uses them.
	var tables []string
	for _, m := range migrations {
		for _, stmt := range m.stmts {
			if t := createdTable(stmt); t != "" {
				tables = append(tables, t)
			}
		}
	}
	return awaitSchema(ctx, st.s, st.cfg.Keyspace, tables)
}

// awaitSchema waits until every node the driver knows as up has the
// keyspace and serves the tables, asking each node as coordinator. The
// driver's schema agreement compares the versions the nodes gossip, and a
// node writes a table into system_schema before it can serve it: a request
// right after either could still meet a node that answers "table ... does
// not exist" or fails it as an unknown table (seen on a 3-node cluster).
func awaitSchema(ctx context.Context, s *gocql.Session, keyspace string, tables []string) error {
	deadline := time.Now().Add(schemaAgreementWait)
	for _, h := range s.GetHosts() {
		if !h.IsUp() {
			continue
		}
		for {
			missing, err := lacks(ctx, s, h.HostID(), keyspace, tables)
			if err == nil {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("cassandra: keyspace %s: node %s does not serve %s after %s: %w",
					keyspace, h.ConnectAddress(), missing, schemaAgreementWait, err)
			}
			if !retry.Sleep(ctx, migrationPoll) {
				return ctx.Err()
			}
		}
	}
	return nil
}

// errMissing says a node has no such keyspace.
var errMissing = errors.New("not in its schema")

// lacks asks one node for the keyspace and reads each table through it (at
// ONE: the node or a replica it picks must serve it); it names what failed.
func lacks(ctx context.Context, s *gocql.Session, host, keyspace string, tables []string) (string, error) {
	var n int
	if err := s.Query(`SELECT COUNT(*) FROM system_schema.keyspaces WHERE keyspace_name = ?`, keyspace).
		SetHostID(host).ScanContext(ctx, &n); err != nil || n == 0 {
		return "the keyspace", cmp.Or(err, errMissing)
	}
	for _, t := range tables {
		it := s.Query(`SELECT * FROM ` + keyspace + `.` + t + ` LIMIT 1`).Consistency(gocql.One).SetHostID(host).WithContext(ctx).Iter()
		if err := it.Close(); err != nil {
			return "table " + t, err
		}
	}
	return "", nil
}

func (st *Store) ddl(ctx context.Context, stmt string) error {
	return ddl(ctx, st.s, withID(st.cfg.Keyspace, stmt))
}

func firstLine(s string) string {
	s, _, _ = strings.Cut(s, "\n")
	return s
}

// claimant names this process in schema_version.
func claimant() string {
	h, _ := os.Hostname()
	return fmt.Sprintf("%s pid %d at %s", h, os.Getpid(), time.Now().UTC().Format(time.RFC3339Nano))
}

// applyMigration runs migration v unless it is done: claims it, or waits for
// the node that did, or takes over a stale claim.
func (st *Store) applyMigration(ctx context.Context, v int, m migration, me string) error {
	for n := 0; ; n++ {
		err := st.tryMigration(ctx, v, m, me)
		if err == nil || !Retryable(err) || n+1 >= migrationRetry.Attempts {
			return err
		}
		// Claims of two nodes at once contend in Paxos, and the loser may
		// time out while the replicas are busy with the winner's schema
		// changes: it tries again.
		if !retry.Sleep(ctx, migrationRetry.Wait(n)) {
			return ctx.Err()
		}
	}
}

// tryMigration is one try of applyMigration.
func (st *Store) tryMigration(ctx context.Context, v int, m migration, me string) error {
	for {
		cur := map[string]any{}
		applied, err := st.cas(ctx, `INSERT INTO schema_version (version, name, claimed_by, claimed_at, done)
			VALUES (?, ?, ?, ?, false) IF NOT EXISTS`, v, m.name, me, time.Now()).MapScanCASContext(ctx, cur)
		if err != nil {
			return fmt.Errorf("claim: %w", err)
		}
		claimedBy, _ := cur["claimed_by"].(string)
		claimedAt, _ := cur["claimed_at"].(time.Time)
		done, _ := cur["done"].(bool)
		switch {
		case applied:
		case done:
			return nil
		case claimedBy == me:
			// Our own claim, from an earlier try of this process that
			// timed out (a busy cluster): the statements are idempotent,
			// run them again. Waiting would wait for ourselves, and
			// after migrationStale we would take our own claim over.
		case time.Since(claimedAt) > migrationStale:
			took, err := st.cas(ctx, `UPDATE schema_version SET claimed_by = ?, claimed_at = ? WHERE version = ?
				IF claimed_by = ? AND done = false`, me, time.Now(), v, claimedBy).MapScanCASContext(ctx, map[string]any{})
			if err != nil {
				return fmt.Errorf("take over the claim of %s: %w", claimedBy, err)
			}
			if !took {
				continue
			}
			st.cfg.Log.Warn("took over a stale schema migration", "version", v, "claimed_by", claimedBy)
		default:
			if !retry.Sleep(ctx, migrationPoll) {
				return fmt.Errorf("waiting for %s to apply it: %w", claimedBy, ctx.Err())
			}
			continue
		}
		for _, stmt := range m.stmts {
			if err := st.ddl(ctx, stmt); err != nil {
				return err
			}
		}
		ok, err := st.cas(ctx, `UPDATE schema_version SET done = true WHERE version = ? IF claimed_by = ?`, v, me).
			MapScanCASContext(ctx, map[string]any{})
		if err != nil {
			return fmt.Errorf("mark done: %w", err)
		}
		if !ok {
			// Our claim was taken over while we ran: the statements are
			// idempotent, so the other node's run finishes it; wait for it.
			continue
		}
		st.cfg.Log.Info("applied schema migration", "keyspace", st.cfg.Keyspace, "version", v, "name", m.name)
		return nil
	}
}

// Migration is one row of schema_version.
type Migration struct {
	Version   int
	Name      string
	ClaimedBy string
	ClaimedAt time.Time
	Done      bool
}

// Migrations lists schema_version, oldest first.
func (st *Store) Migrations(ctx context.Context) ([]Migration, error) {
	it := st.read(ctx, `SELECT version, name, claimed_by, claimed_at, done FROM schema_version`).Iter()
	var out []Migration
	var m Migration
	for it.Scan(&m.Version, &m.Name, &m.ClaimedBy, &m.ClaimedAt, &m.Done) {
		out = append(out, m)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("cassandra: keyspace %s: read schema_version: %w", st.cfg.Keyspace, err)
	}
	slices.SortFunc(out, func(a, b Migration) int { return a.Version - b.Version })
	return out, nil
}

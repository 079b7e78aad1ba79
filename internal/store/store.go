// Package store is the node's stable storage: one Pebble database per node
// holding every piece of hard state the node keeps (Porcupine §2: mailbox
// fragments and user profiles). One database means one write-ahead log, so
// concurrent deliveries for different users share fsyncs: Pebble's commit
// pipeline coalesces the WAL syncs of batches committed at the same time
// (group commit).
//
// Keys are grouped by user-map bucket so that one range scan yields every
// fragment and profile of a bucket (Porcupine §6.1 groups fragment files in
// per-bucket directories for the same reason).
//
// Every operation passes a gate (gate.go): once Close has begun, new
// operations fail with ErrClosed instead of reaching a closed Pebble, which
// panics, and Close waits for the operations already inside. No shutdown
// ordering elsewhere has to be perfect for a late RPC or session to be
// safe.
//
// Every write also passes the reserve (reserve.go): a write that would
// leave the disk under its floor fails with a DiskFullError instead of
// reaching Pebble, whose write-ahead log treats a full disk as fatal.
package store

import (
	"bytes"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/cockroachdb/pebble"
	"github.com/cockroachdb/pebble/bloom"
	"github.com/cockroachdb/pebble/vfs"
	"github.com/quillmail/quill/internal/cluster"
)

// Key kinds: the first byte of every key. Each manager owns its kinds.
const (
	KindProfile  byte = 'P' // userdb: P bucket user -> profile
	KindMailbox  byte = 'B' // mailbox: B bucket user 0 name -> mailbox record
	KindMessage  byte = 'M' // mailbox: M bucket user 0 mboxid(8) uid(4) -> message record
	KindBody     byte = 'D' // mailbox: D bucket user 0 msgid -> message bytes
	KindUserMeta byte = 'S' // mailbox: S bucket user -> per-user counters
	KindNode     byte = 'N' // node: N name -> node-wide values
	KindObject   byte = 'O' // mailbox: O bucket user 0 msgid -> where the message object is, its stamp, or its tombstone
	KindLog      byte = 'L' // replica: L object 0 stamp -> update log entry
	KindWide     byte = 'W' // clusterwide: W kind/name -> object every node keeps (certificates)
	KindQueue    byte = 'Q' // queue: Q id -> outbound queue entry (state per recipient)
	KindQueued   byte = 'R' // queue: R id -> the queued message's bytes
	KindExpunged byte = 'X' // mailbox: X bucket user 0 msgid -> when an expunged message's body goes
	KindText     byte = 'T' // mailbox: T bucket user 0 ... -> the text index of the messages held here (textindex.go)
	KindToIndex  byte = 'I' // mailbox: I bucket user 0 msgid -> a message held here that the text index has not read yet
	KindRedo     byte = 'E' // writer: E bucket term(8) seq(8) node -> the writer's REDO log entry (writer/redolog.go)
	KindBodyFile byte = 'F' // mailbox: F bucket user 0 msgid -> the hash and size of a large body kept as a file (bodyfile.go)
)

// Sync is the write option for every commit that acknowledges something to a
// client: the WAL is fsync'd before Commit returns.
var Sync = pebble.Sync

// NoSync is the write option for what may be lost in a crash (an
// acknowledgement recorded in the update log, which only makes an update go
// out once more).
var NoSync = pebble.NoSync

// ErrNotFound is returned by Get for a key that is not there.
var ErrNotFound = pebble.ErrNotFound

// IterOptions are Pebble's.
type IterOptions = pebble.IterOptions

// DB is the node's database.
type DB struct {
	p   *pebble.DB
	dir string
	gate
	res atomic.Pointer[reserve] // room kept back on the disk (reserve.go)
	// reads counts point reads (Get), so a test can hold a write path to
	// the reads it needs.
	reads atomic.Int64
}

// PointReads returns how many point reads (Get, on the database or a
// batch) this database has served since it opened.
func (d *DB) PointReads() int64 { return d.reads.Load() }

// ErrInUse says another process (or another Open in this one) holds the
// database's lock: a running node.
var ErrInUse = errors.New("in use by a running quill (stop it first)")

// Open opens (creating if needed) the database under dir/store.
func Open(dir string) (*DB, error) { return OpenWith(dir, Options{}) }

// Options are the settings of a store that are not Quill's fixed choices.
type Options struct {
	// SyncDelay delays every sync of the write-ahead log, and so every
	// durable write: a slow disk on demand, for the heterogeneity
	// experiment of Porcupine §6.3.3 (`quill serve --disk-delay`,
	// docs/benchmarks.md). 0 in any real deployment.
	SyncDelay time.Duration
}

// OpenWith is Open with options.
func OpenWith(dir string, o Options) (*DB, error) {
	path := filepath.Join(dir, "store")
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	return open(path, false, o)
}

// OpenReadOnly opens an existing database under dir/store without writing
// to it (Pebble's read-only mode: the log is replayed in memory): what
// `quill migrate` reads a stopped node with. The lock is still taken, so a
// running node's directory fails with ErrInUse.
func OpenReadOnly(dir string) (*DB, error) {
	path := filepath.Join(dir, "store")
	if _, err := os.Stat(path); err != nil {
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	return open(path, true, Options{})
}

// Pebble's memory and disk sizes, chosen for a node that must stay within
// about 150 MB of RSS with 1,000 users and 100,000 messages, and whose idle
// disk footprint should be a fraction of Maildir's for the same mail.
const (
	// memTableSize bounds one memtable. Pebble allocates each WAL file
	// 1.1x this size ahead and would keep up to
	// MemTableStopWritesThreshold+1 flushed WAL files for reuse: at the
	// former 64 MiB an idle store held about 280 MB of WAL before a single
	// message (walCleaner and walFS now keep it near what was written).
	// Smaller is not free: a store's keys
	// are spread over every user's bucket, so each flushed memtable
	// overlaps the whole of the bottom level and its compaction rewrites
	// it. Measured under the Porcupine workload (docs/benchmarks.md, "Issue
	// 16: the memtable's size"): 4 MiB spent 44% of the CPU compacting and
	// delivered 0.64 of 64 MiB's rate, 16 MiB 0.86.
	memTableSize = 16 << 20
	// memTableStopWrites is how many memtables (the one written and those
	// waiting for their flush) may exist before writes wait: Pebble's
	// default, named here because memory is memTableSize times it.
	memTableStopWrites = 2
	// blockCacheSize is Pebble's block cache: every table's index and bloom
	// filter blocks (a point read of a key that is not there then needs no
	// disk read) and the recently read records and mailbox rows. The data
	// of 100,000 messages has about a megabyte of index and filter blocks;
	// the rest keeps recent reads (a POP3 RETR or IMAP FETCH soon after
	// delivery) off the disk. Pebble's default is 8 MiB.
	blockCacheSize = 32 << 20
	// walBytesPerSync flushes the WAL in 512 KiB chunks while a batch is
	// being written, so a multi-megabyte message does not stall the group
	// commit of small ones behind a single huge write.
	walBytesPerSync = 512 << 10
)

func open(path string, readOnly bool, o Options) (*DB, error) {
	cache := pebble.NewCache(blockCacheSize)
	defer cache.Unref() // the database holds its own reference
	opts := &pebble.Options{
		MemTableSize:                memTableSize,
		MemTableStopWritesThreshold: memTableStopWrites,
		Cache:                       cache,
		WALBytesPerSync:             walBytesPerSync,
		Logger:                      quietLogger{},
		Cleaner:                     walCleaner{},
		FS:                          walFS{FS: vfs.Default, syncDelay: o.SyncDelay},
		ReadOnly:                    readOnly,
	}
	// Bloom filters let a point read of a key that is not there (a UID
	// checked before it is stored, a missing body) skip the table instead
	// of reading and decompressing its blocks.
	opts.Levels = make([]pebble.LevelOptions, 7)
	for i := range opts.Levels {
		opts.Levels[i].FilterPolicy = bloom.FilterPolicy(10)
		opts.Levels[i].FilterType = pebble.TableFilter
	}
	opts.EnsureDefaults()
	db, err := pebble.Open(path, opts)
	if lockHeld(err) {
		return nil, fmt.Errorf("store %s: %w", path, ErrInUse)
	}
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	d := &DB{p: db, dir: path}
	d.gate.init(path)
	return d, nil
}

// walCleaner deletes obsolete files (Pebble's DeleteCleaner) and turns off
// Pebble's recycling of flushed WAL files. Pebble v1 has no option for
// that: it recycles unless its cleaner says it needs the files' contents,
// which only ArchiveCleaner says (an unexported marker method). Embedding
// ArchiveCleaner one level deeper than DeleteCleaner takes the marker
// from the first and Clean from the second. Recycling saves creating and
// preallocating a WAL file at each memtable switch (every 16 MiB of
// writes), but kept three spare 17.6 MB files on disk for good: 53 MB of
// a 10,000-message store of 119 MB (docs/benchmarks.md, "Issue 16: WAL
// recycling"). TestWALNotRecycled fails if a Pebble upgrade changes this.
type walCleaner struct {
	pebble.DeleteCleaner
	noRecycle
}

// noRecycle carries ArchiveCleaner's marker (and a Clean shadowed by
// DeleteCleaner's).
type noRecycle struct{ pebble.ArchiveCleaner }

// lockHeld reports whether Pebble refused to open because its lock file is
// held: by another process (fcntl's EAGAIN or EACCES), or by this one
// (Pebble's own message, it has no error value for it).
func lockHeld(err error) bool {
	return err != nil && (errors.Is(err, syscall.EAGAIN) || errors.Is(err, syscall.EACCES) ||
		strings.Contains(err.Error(), "lock held by current process"))
}

// Close waits for the operations in progress (at most closeWait), refuses
// new ones, and closes the database. Later calls return the first call's
// result, so shutdown paths need not coordinate.
func (d *DB) Close() error {
	return d.gate.close(d.p.Close)
}

// Checkpoint writes a consistent copy of the database into dest, which
// must not exist and should be on the same file system (Pebble then
// hard-links the tables and copies only the manifest and the WAL, so the
// reserve is not asked). The WAL is flushed first: every write committed
// before the call is in the copy. It backs `quill backup`.
func (d *DB) Checkpoint(dest string) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	if err := d.p.Checkpoint(dest, pebble.WithFlushedWAL()); err != nil {
		return fmt.Errorf("store checkpoint %s: %w", dest, err)
	}
	return nil
}

// Dir is the directory of the database files.
func (d *DB) Dir() string { return d.dir }

// Get returns the value of key (ErrNotFound if missing); it is valid until
// closer.Close, which must be called.
func (d *DB) Get(key []byte) ([]byte, io.Closer, error) {
	if err := d.enter(); err != nil {
		return nil, nil, err
	}
	d.reads.Add(1)
	v, c, err := d.p.Get(key)
	if err != nil {
		d.exit()
		return nil, nil, err
	}
	return v, &exitCloser{c: c, g: &d.gate}, nil
}

// Set writes one key.
func (d *DB) Set(key, value []byte, o *pebble.WriteOptions) error {
	if err := d.enter(); err != nil {
		return err
	}
	defer d.exit()
	if err := d.take(len(key) + len(value)); err != nil {
		return err
	}
	return d.p.Set(key, value, o)
}

// DeleteAll deletes keys in one batch.
func (d *DB) DeleteAll(keys [][]byte, o *pebble.WriteOptions) error {
	b := d.NewBatch()
	defer b.Close()
	for _, k := range keys {
		if err := b.Delete(k); err != nil {
			return err
		}
	}
	return b.Commit(o)
}

// NewBatch returns a write-only batch.
func (d *DB) NewBatch() *Batch { return &Batch{b: d.p.NewBatch(), db: d} }

// NewIndexedBatch returns a batch whose reads see its own writes.
func (d *DB) NewIndexedBatch() *Batch { return &Batch{b: d.p.NewIndexedBatch(), db: d} }

// NewIter returns an iterator over the database; Close must be called.
func (d *DB) NewIter(o *IterOptions) (*Iter, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	it, err := d.p.NewIter(o)
	if err != nil {
		d.exit()
		return nil, err
	}
	return &Iter{Iterator: it, g: &d.gate}, nil
}

// Metrics returns Pebble's figures.
func (d *DB) Metrics() (*pebble.Metrics, error) {
	if err := d.enter(); err != nil {
		return nil, err
	}
	defer d.exit()
	return d.p.Metrics(), nil
}

// Reader is what reads go through: the database or an indexed batch.
type Reader interface {
	Get(key []byte) ([]byte, io.Closer, error)
	NewIter(o *IterOptions) (*Iter, error)
}

// Batch is a Pebble batch whose commit and reads pass the gate.
type Batch struct {
	b  *pebble.Batch
	db *DB
}

// Set, Delete and DeleteRange add to the batch (no I/O).
func (b *Batch) Set(key, value []byte) error { return b.b.Set(key, value, nil) }
func (b *Batch) Delete(key []byte) error     { return b.b.Delete(key, nil) }
func (b *Batch) DeleteRange(start, end []byte) error {
	return b.b.DeleteRange(start, end, nil)
}

// Merge appends value to the key's value (Pebble's default merger
// concatenates), without reading it.
func (b *Batch) Merge(key, value []byte) error { return b.b.Merge(key, value, nil) }

// Empty reports whether the batch holds no writes.
func (b *Batch) Empty() bool { return b.b.Empty() }

// Commit applies the batch to the database.
func (b *Batch) Commit(o *pebble.WriteOptions) error {
	if err := b.db.enter(); err != nil {
		return err
	}
	defer b.db.exit()
	if err := b.db.take(b.b.Len()); err != nil {
		return err
	}
	return b.b.Commit(o)
}

// Close releases the batch (after Commit, or instead of it).
func (b *Batch) Close() error { return b.b.Close() }

// Get reads through an indexed batch: its own writes, then the database.
func (b *Batch) Get(key []byte) ([]byte, io.Closer, error) {
	if err := b.db.enter(); err != nil {
		return nil, nil, err
	}
	b.db.reads.Add(1)
	v, c, err := b.b.Get(key)
	if err != nil {
		b.db.exit()
		return nil, nil, err
	}
	return v, &exitCloser{c: c, g: &b.db.gate}, nil
}

// NewIter iterates an indexed batch over the database.
func (b *Batch) NewIter(o *IterOptions) (*Iter, error) {
	if err := b.db.enter(); err != nil {
		return nil, err
	}
	it, err := b.b.NewIter(o)
	if err != nil {
		b.db.exit()
		return nil, err
	}
	return &Iter{Iterator: it, g: &b.db.gate}, nil
}

// Iter is a Pebble iterator that holds the gate until Close.
type Iter struct {
	*pebble.Iterator
	g    *gate
	done bool
}

// Close closes the iterator and lets the store close.
func (it *Iter) Close() error {
	if it.done {
		return nil
	}
	it.done = true
	err := it.Iterator.Close()
	it.g.exit()
	return err
}

// UserPrefix returns kind, bucket, lower-cased user and a 0 separator: the
// prefix of every key of that kind belonging to the user.
func UserPrefix(kind byte, user string) []byte {
	k := make([]byte, 0, 3+len(user)+16)
	k = append(k, kind, cluster.Bucket(user))
	k = append(k, user...)
	return append(k, 0)
}

// BucketPrefix returns the prefix of every key of a kind in one bucket.
func BucketPrefix(kind byte, bucket uint8) []byte { return []byte{kind, bucket} }

// KindPrefix returns the prefix of every key of a kind.
func KindPrefix(kind byte) []byte { return []byte{kind} }

// UpperBound returns the smallest key greater than every key with prefix p.
func UpperBound(p []byte) []byte {
	u := bytes.Clone(p)
	for i := len(u) - 1; i >= 0; i-- {
		if u[i] != 0xff {
			u[i]++
			return u[:i+1]
		}
	}
	return nil
}

// PrefixIter returns an iterator over the keys with prefix p, read through
// r (the database when nil).
func (d *DB) PrefixIter(r Reader, p []byte) (*Iter, error) {
	if r == nil {
		r = d
	}
	return r.NewIter(&IterOptions{LowerBound: p, UpperBound: UpperBound(p)})
}

// quietLogger keeps Pebble's routine compaction chatter out of the node log
// but still reports errors.
type quietLogger struct{}

func (quietLogger) Infof(string, ...interface{}) {}
func (quietLogger) Errorf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "pebble: "+format+"\n", args...)
}
func (quietLogger) Fatalf(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "pebble: fatal: "+format+"\n", args...)
	os.Exit(1)
}

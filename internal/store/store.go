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
package store

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"sync"

	"github.com/cockroachdb/pebble"
	"github.com/cockroachdb/pebble/bloom"
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
)

// Sync is the write option for every commit that acknowledges something to a
// client: the WAL is fsync'd before Commit returns.
var Sync = pebble.Sync

// DB is the node's database.
type DB struct {
	*pebble.DB
	dir       string
	closeOnce sync.Once
	closeErr  error
}

// Close closes the database; later calls return the first call's result, so
// shutdown paths need not coordinate.
func (d *DB) Close() error {
	d.closeOnce.Do(func() { d.closeErr = d.DB.Close() })
	return d.closeErr
}

// Open opens (creating if needed) the database under dir/store.
func Open(dir string) (*DB, error) {
	path := filepath.Join(dir, "store")
	if err := os.MkdirAll(path, 0o700); err != nil {
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	opts := &pebble.Options{
		// Bodies are written once and read a few times; a larger memtable
		// keeps more of a burst of deliveries out of L0.
		MemTableSize: 64 << 20,
		// Flush the WAL in 512 KiB chunks while a batch is being written,
		// so a multi-megabyte message does not stall the group commit of
		// small ones behind a single huge write.
		WALBytesPerSync: 512 << 10,
		Logger:          quietLogger{},
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
	if err != nil {
		return nil, fmt.Errorf("store %s: %w", path, err)
	}
	return &DB{DB: db, dir: path}, nil
}

// Dir is the directory of the database files.
func (d *DB) Dir() string { return d.dir }

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

// PrefixIter returns an iterator over the keys with prefix p.
func (d *DB) PrefixIter(r pebble.Reader, p []byte) (*pebble.Iterator, error) {
	if r == nil {
		r = d.DB
	}
	return r.NewIter(&pebble.IterOptions{LowerBound: p, UpperBound: UpperBound(p)})
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

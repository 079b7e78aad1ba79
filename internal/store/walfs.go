package store

import (
	"strings"
	"time"

	"github.com/cockroachdb/pebble/vfs"
)

// walPreallocChunk is how much of a WAL file is allocated ahead of its
// writes. Pebble allocates a WAL file 1.1× the memtable (17.6 MB) ahead at
// its first write, so an idle store kept a mostly empty 17.6 MB file on
// disk for good: 30% of a 10,000-message store (docs/benchmarks.md,
// "Issue 16: WAL recycling and preallocation"). Allocating ahead still
// matters: each group commit's fdatasync then writes no block allocation
// of its own. 4 MiB is about 160 deliveries of WAL, so the allocation is
// a few calls a second at full load.
const walPreallocChunk = 4 << 20

// walFS is the store's file system: Pebble's, with WAL files allocated
// ahead in walPreallocChunk steps instead of Pebble's, and each WAL sync
// delayed by syncDelay (Options.SyncDelay; 0 but in experiments).
type walFS struct {
	vfs.FS
	syncDelay time.Duration
}

// Create wraps a new WAL file (Pebble names them NNNNNN.log).
func (fs walFS) Create(name string) (vfs.File, error) {
	f, err := fs.FS.Create(name)
	if err != nil || !strings.HasSuffix(name, ".log") {
		return f, err
	}
	return &walFile{File: f, syncDelay: fs.syncDelay}, nil
}

// walFile is a WAL file being written: Pebble writes it from one
// goroutine, in order.
type walFile struct {
	vfs.File
	size, allocated int64
	syncDelay       time.Duration
}

// Sync makes the written log durable, after syncDelay: every durable
// write of the store waits on one of these (Pebble's group commit).
func (f *walFile) Sync() error {
	if f.syncDelay > 0 {
		time.Sleep(f.syncDelay)
	}
	return f.File.Sync()
}

// SyncData is Sync without the file's metadata, delayed the same.
func (f *walFile) SyncData() error {
	if f.syncDelay > 0 {
		time.Sleep(f.syncDelay)
	}
	return f.File.SyncData()
}

// Preallocate ignores Pebble's allocation of 1.1× the memtable: Write
// allocates in smaller steps.
func (f *walFile) Preallocate(offset, length int64) error { return nil }

// Write allocates the next chunk when the write would pass the allocated
// end, then writes. An allocation that fails (a file system without
// fallocate, a full disk) is ignored as Pebble ignores its own: the write
// then allocates as it goes, and reports a full disk itself.
func (f *walFile) Write(p []byte) (int, error) {
	if end := f.size + int64(len(p)); end > f.allocated {
		next := (end + walPreallocChunk - 1) / walPreallocChunk * walPreallocChunk
		_ = f.File.Preallocate(f.allocated, next-f.allocated)
		f.allocated = next
	}
	n, err := f.File.Write(p)
	f.size += int64(n)
	return n, err
}

package store

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sync"
	"syscall"
	"testing"

	"github.com/cockroachdb/pebble"
	"time"
)

// After Close, every operation fails with ErrClosed instead of reaching a
// closed Pebble (which panics): the SIGTERM panic of issue 9 was an RPC
// writing a profile after shutdown had closed the store.
func TestOperationsAfterCloseFail(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	b := d.NewIndexedBatch()
	b.Set([]byte("k"), []byte("v"))
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	if err := b.Commit(Sync); !errors.Is(err, ErrClosed) {
		t.Fatalf("commit after close: %v", err)
	}
	if _, _, err := b.Get([]byte("k")); !errors.Is(err, ErrClosed) {
		t.Fatalf("batch read after close: %v", err)
	}
	if _, _, err := d.Get([]byte("k")); !errors.Is(err, ErrClosed) {
		t.Fatalf("get after close: %v", err)
	}
	if err := d.Set([]byte("k"), []byte("v"), Sync); !errors.Is(err, ErrClosed) {
		t.Fatalf("set after close: %v", err)
	}
	if _, err := d.PrefixIter(nil, []byte("k")); !errors.Is(err, ErrClosed) {
		t.Fatalf("iterator after close: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("second close: %v", err)
	}
}

// Close waits for an open iterator (an operation in progress), and an
// operation nested inside it still runs until Close has begun.
func TestCloseWaitsForOperationsInside(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Set([]byte("a"), []byte("1"), Sync); err != nil {
		t.Fatal(err)
	}
	it, err := d.PrefixIter(nil, []byte("a"))
	if err != nil {
		t.Fatal(err)
	}
	closed := make(chan error, 1)
	go func() { closed <- d.Close() }()
	select {
	case err := <-closed:
		t.Fatalf("Close returned (%v) while an iterator was open", err)
	case <-time.After(100 * time.Millisecond):
	}
	// The iterator still reads; a new operation is refused.
	if !it.First() || string(it.Value()) != "1" {
		t.Fatal("iterator stopped working while Close waited")
	}
	if _, _, err := d.Get([]byte("a")); !errors.Is(err, ErrClosed) {
		t.Fatalf("new read while closing: %v", err)
	}
	it.Close()
	if err := <-closed; err != nil {
		t.Fatal(err)
	}
}

// Many writers racing Close: none panics, each either commits or gets
// ErrClosed.
func TestWritersRacingClose(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for w := 0; w < 8; w++ {
		wg.Add(1)
		go func(w int) {
			defer wg.Done()
			for i := 0; i < 200; i++ {
				b := d.NewBatch()
				b.Set([]byte{byte(w), byte(i)}, []byte("x"))
				err := b.Commit(NoSync)
				b.Close()
				if err != nil && !errors.Is(err, ErrClosed) {
					t.Errorf("commit: %v", err)
				}
			}
		}(w)
	}
	time.Sleep(time.Millisecond)
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	wg.Wait()
}

// A database open in a node cannot be opened again (quill migrate reads a
// stopped node's store): the error says it is in use; once closed, the
// read-only open sees what was written and refuses writes.
func TestOpenInUse(t *testing.T) {
	dir := t.TempDir()
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if err := d.Set([]byte("k"), []byte("v"), Sync); err != nil {
		t.Fatal(err)
	}
	if _, err := OpenReadOnly(dir); !errors.Is(err, ErrInUse) {
		t.Fatalf("read-only open of a database in use: %v, want ErrInUse", err)
	}
	if _, err := Open(dir); !errors.Is(err, ErrInUse) {
		t.Fatalf("second open: %v, want ErrInUse", err)
	}
	d.Close()
	r, err := OpenReadOnly(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	v, c, err := r.Get([]byte("k"))
	if err != nil || string(v) != "v" {
		t.Fatalf("read-only get: %q, %v", v, err)
	}
	c.Close()
	if err := r.Set([]byte("k"), []byte("w"), Sync); err == nil {
		t.Fatal("a read-only store took a write")
	}
	if _, err := OpenReadOnly(t.TempDir()); err == nil {
		t.Fatal("read-only open of an empty directory made a store")
	}
}

// TestWALNotRecycled checks that flushed WAL files are deleted rather than
// kept for reuse (walCleaner): an idle store holds its live WAL file and
// no spares. With Pebble's recycling on, this store kept four .log files.
func TestWALNotRecycled(t *testing.T) {
	dir := t.TempDir()
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	val := make([]byte, 4096)
	for round := 0; round < 6; round++ {
		for i := 0; i < 50; i++ {
			if err := d.Set([]byte(fmt.Sprintf("k%d-%d", round, i)), val, pebble.Sync); err != nil {
				t.Fatal(err)
			}
		}
		// A flush switches the memtable and with it the WAL file.
		if err := d.p.Flush(); err != nil {
			t.Fatal(err)
		}
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "store", "*.log"))
	if len(logs) > 2 {
		t.Fatalf("%d WAL files after 6 flushes (%v), want the live one (and at most one not yet deleted)", len(logs), logs)
	}
	if _, err := os.Stat(filepath.Join(dir, "store", "archive")); err == nil {
		t.Fatal("obsolete files were archived, not deleted")
	}
	m, err := d.Metrics()
	if err != nil {
		t.Fatal(err)
	}
	if m.WAL.ObsoleteFiles != 0 {
		t.Fatalf("%d WAL files kept for reuse, want 0", m.WAL.ObsoleteFiles)
	}
}

// TestWALAllocatedInSteps checks that an idle store's WAL file holds about
// what was written, not the 17.6 MB Pebble allocates ahead (walFS).
func TestWALAllocatedInSteps(t *testing.T) {
	dir := t.TempDir()
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	val := make([]byte, 4096)
	for i := 0; i < 100; i++ {
		if err := d.Set([]byte(fmt.Sprintf("k%d", i)), val, pebble.Sync); err != nil {
			t.Fatal(err)
		}
	}
	logs, _ := filepath.Glob(filepath.Join(dir, "store", "*.log"))
	var blocks int64
	for _, l := range logs {
		var st syscall.Stat_t
		if err := syscall.Stat(l, &st); err != nil {
			t.Fatal(err)
		}
		blocks += st.Blocks * 512
	}
	if len(logs) == 0 || blocks > 2*walPreallocChunk {
		t.Fatalf("%d WAL files take %d bytes on disk after 400 KB written, want at most %d", len(logs), blocks, 2*walPreallocChunk)
	}
	if blocks < 400<<10 {
		t.Fatalf("WAL files take %d bytes on disk, less than the 400 KB written", blocks)
	}
}

// Options.SyncDelay holds every durable write for at least the delay (the
// slow disk of the heterogeneity experiment), and the data still lands.
func TestSyncDelay(t *testing.T) {
	const delay, writes = 40 * time.Millisecond, 5
	d, err := OpenWith(t.TempDir(), Options{SyncDelay: delay})
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	start := time.Now()
	for i := range writes {
		if err := d.Set([]byte{'k', byte(i)}, []byte("v"), Sync); err != nil {
			t.Fatal(err)
		}
	}
	if took := time.Since(start); took < writes*delay {
		t.Fatalf("%d synced writes took %v, want at least %v", writes, took, writes*delay)
	}
	v, c, err := d.Get([]byte{'k', writes - 1})
	if err != nil || string(v) != "v" {
		t.Fatalf("read back: %q, %v", v, err)
	}
	c.Close()
}

package store

import (
	"fmt"
	"os"
	"sync"
	"syscall"
	"time"

	"github.com/quillmail/quill/internal/rpc"
)

// A full disk must never stop a node. Pebble treats a failed write to its
// write-ahead log as fatal (the process exits: it cannot know what the
// failed write left behind), so the node must not let a commit reach a
// disk without room for it. The node's own thresholds (core: no new mail
// under --min-free, no replica copies under half of it) are read every two
// seconds, and repair can push megabytes of copies in that time; so the
// store checks the room itself, before every write, against a floor, and
// keeps a ballast file it gives back the moment the floor is reached: the
// room that Pebble's own writes already under way (flushes, compactions,
// the write-ahead log's next segment, the manifest) and commits racing the
// check may still need. Below the floor every write fails with a
// DiskFullError; reads go on, and writes resume by themselves once space is
// freed. CockroachDB keeps an emergency ballast for the same reason.

// Reserve is the room a store keeps back on its disk.
type Reserve struct {
	// Floor is the free space a write may not go under.
	Floor int64
	// Ballast is the size of the file held at BallastPath while there is
	// room for it, removed when the floor is reached. While it is gone
	// the floor counts it: its room is for what is already under way,
	// not for new writes.
	Ballast     int64
	BallastPath string
	// Free reads the free bytes of the disk (nil: statfs of the store's
	// directory).
	Free func() (int64, error)
}

// DiskFullError is the error of a write refused for want of room.
type DiskFullError struct {
	Dir        string
	Free, Need int64
}

func (e *DiskFullError) Error() string {
	return fmt.Sprintf("store %s: disk full: %d bytes free, the write and the room kept back need %d: refused so the store never fills its disk", e.Dir, e.Free, e.Need)
}

// Is makes a refused write an rpc.ErrNoSpace, a meaning that crosses the
// wire to the node the client reached.
func (e *DiskFullError) Is(target error) bool { return target == rpc.ErrNoSpace }

// reserveReadEvery is how long a reading of free space is trusted, less
// what the store wrote since: a statfs costs about a microsecond, but
// nothing is gained by one per commit when the disk is far from full.
const reserveReadEvery = 20 * time.Millisecond

// reserveNear: within this many floors of the floor, every write reads the
// free space afresh (other processes write to the same disk).
const reserveNear = 4

type reserve struct {
	r   Reserve
	dir string

	mu      sync.Mutex
	free    int64 // at read, less what was written since
	read    time.Time
	ballast bool // the ballast file is in place
}

// SetReserve makes the store keep r back on its disk, and lays the ballast
// if there is room for it beside the floor and keep bytes more (the
// caller's own threshold, so laying it never pushes the disk into what the
// caller counts as full). Without a reserve the store writes until the
// disk refuses.
func (d *DB) SetReserve(r Reserve, keep int64) {
	if r.Free == nil {
		dir := d.dir
		r.Free = func() (int64, error) { return FreeBytes(dir) }
	}
	res := &reserve{r: r, dir: d.dir}
	if st, err := os.Stat(r.BallastPath); err == nil && r.Ballast > 0 && st.Size() >= r.Ballast {
		res.ballast = true
	}
	d.res.Store(res)
	d.RestoreBallast(keep)
}

// FreeBytes is the space an unprivileged writer may still use on the file
// system holding path.
func FreeBytes(path string) (int64, error) {
	free, _, err := DiskSpace(path)
	return free, err
}

// DiskSpace returns the free bytes (for an unprivileged writer) and the
// size of the file system holding path.
func DiskSpace(path string) (free, size int64, err error) {
	var st syscall.Statfs_t
	if err := syscall.Statfs(path, &st); err != nil {
		return 0, 0, fmt.Errorf("free space of %s: %w", path, err)
	}
	return int64(st.Bavail) * int64(st.Bsize), int64(st.Blocks) * int64(st.Bsize), nil
}

// take admits a write of n bytes, or refuses it with a DiskFullError and
// gives back the ballast.
func (d *DB) take(n int) error {
	res := d.res.Load()
	if res == nil || res.r.Floor <= 0 {
		return nil
	}
	return res.take(int64(n))
}

func (res *reserve) need(n int64) int64 {
	need := res.r.Floor + n
	if !res.ballast {
		need += res.r.Ballast
	}
	return need
}

func (res *reserve) take(n int64) error {
	res.mu.Lock()
	defer res.mu.Unlock()
	// Pebble writes a little more than the batch (record headers).
	n += n/16 + 512
	if time.Since(res.read) > reserveReadEvery || res.free-n < reserveNear*res.need(0) {
		free, err := res.r.Free()
		if err != nil {
			// Unknown room: let the write go, as a store without a
			// reserve would.
			return nil
		}
		res.free, res.read = free, time.Now()
	}
	if need := res.need(n); res.free < need {
		if res.ballast {
			// The ballast's room is for writes already under way; the
			// floor now counts it, so this write stays refused.
			if err := os.Remove(res.r.BallastPath); err == nil || os.IsNotExist(err) {
				res.ballast = false
				res.read = time.Time{}
			}
		}
		return &DiskFullError{Dir: res.dir, Free: res.free, Need: res.need(n)}
	}
	res.free -= n
	return nil
}

// ballastChunk is the size of the zero writes that lay a ballast where the
// file system cannot allocate without writing.
const ballastChunk = 1 << 20

// RestoreBallast lays the ballast again when the disk has room for it with
// keep bytes to spare; the node calls it as it reads its free space. It
// reports whether the ballast is in place.
func (d *DB) RestoreBallast(keep int64) bool {
	res := d.res.Load()
	if res == nil || res.r.Ballast <= 0 || res.r.BallastPath == "" {
		return false
	}
	res.mu.Lock()
	defer res.mu.Unlock()
	if res.ballast {
		return true
	}
	free, err := res.r.Free()
	if err != nil || free < res.r.Ballast+res.r.Floor+keep {
		return false
	}
	if err := layBallast(res.r.BallastPath, res.r.Ballast); err != nil {
		os.Remove(res.r.BallastPath)
		return false
	}
	res.ballast, res.read = true, time.Time{}
	return true
}

// layBallast writes a file of size bytes that holds its blocks (allocated,
// not sparse), synced so the room is taken on disk, not only in the page
// cache's reckoning.
func layBallast(path string, size int64) error {
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("ballast %s: %w", path, err)
	}
	defer f.Close()
	if err := allocate(f, size); err != nil {
		return fmt.Errorf("ballast %s: %w", path, err)
	}
	if err := f.Sync(); err != nil {
		return fmt.Errorf("ballast %s: %w", path, err)
	}
	return nil
}

// writeZeros allocates by writing, for file systems without fallocate.
func writeZeros(f *os.File, size int64) error {
	buf := make([]byte, ballastChunk)
	for left := size; left > 0; {
		n := min(left, int64(len(buf)))
		if _, err := f.Write(buf[:n]); err != nil {
			return err
		}
		left -= n
	}
	return nil
}

package store

import (
	"bytes"
	"errors"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/rpc"
)

// The reserve refuses a write that would leave the disk under its floor,
// gives back the ballast at once, keeps refusing while the freed room is
// only the ballast's, lets writes through again once space is freed, and
// lays the ballast again when there is room.
func TestReserveRefusesUnderTheFloor(t *testing.T) {
	dir := t.TempDir()
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	var free atomic.Int64
	free.Store(100 << 20)
	const floor, ballast = 4 << 20, 8 << 20
	path := filepath.Join(dir, "ballast")
	d.SetReserve(Reserve{Floor: floor, Ballast: ballast, BallastPath: path,
		Free: func() (int64, error) { return free.Load(), nil }}, 16<<20)
	if st, err := os.Stat(path); err != nil || st.Size() != ballast {
		t.Fatalf("ballast not laid: %v", err)
	}
	free.Add(-ballast) // what laying it took
	if err := d.Set([]byte("a"), bytes.Repeat([]byte("x"), 1<<20), Sync); err != nil {
		t.Fatalf("write with room: %v", err)
	}

	// Another process fills the disk to 3 MiB, under the floor.
	free.Store(3 << 20)
	time.Sleep(2 * reserveReadEvery) // the store's last reading goes stale
	err = d.Set([]byte("b"), bytes.Repeat([]byte("x"), 2<<20), Sync)
	if !isDiskFull(err) {
		t.Fatalf("write under the floor: got %v, want a disk-full refusal", err)
	}
	t.Logf("refused: %v", err)
	if _, err := os.Stat(path); !os.IsNotExist(err) {
		t.Fatalf("ballast still in place after the floor was reached: %v", err)
	}
	// The ballast's room came back; it is not for new writes.
	free.Add(ballast)
	b := d.NewBatch()
	b.Set([]byte("c"), []byte("small"))
	if err := b.Commit(Sync); !isDiskFull(err) {
		t.Fatalf("small write in the ballast's room: got %v, want a refusal", err)
	}
	b.Close()
	if _, c, err := d.Get([]byte("a")); err != nil {
		t.Fatalf("read on a full disk: %v", err)
	} else {
		c.Close()
	}
	if d.RestoreBallast(16 << 20) {
		t.Fatal("ballast laid again with no room for it")
	}

	// Space is freed: writes go on, the ballast comes back.
	free.Store(100 << 20)
	time.Sleep(2 * reserveReadEvery)
	if err := d.Set([]byte("d"), []byte("v"), Sync); err != nil {
		t.Fatalf("write after space came back: %v", err)
	}
	if !d.RestoreBallast(16 << 20) {
		t.Fatal("ballast not laid again with room for it")
	}
	if st, err := os.Stat(path); err != nil || st.Size() != ballast {
		t.Fatalf("ballast not back: %v", err)
	}
}

// A store with no reserve writes as before.
func TestNoReserveWrites(t *testing.T) {
	d, err := Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer d.Close()
	if err := d.Set([]byte("k"), []byte("v"), Sync); err != nil {
		t.Fatal(err)
	}
}

// isDiskFull: err is a refusal of the reserve, and says so across RPC.
func isDiskFull(err error) bool {
	var d *DiskFullError
	return errors.As(err, &d) && errors.Is(err, rpc.ErrNoSpace)
}

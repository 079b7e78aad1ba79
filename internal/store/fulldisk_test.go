package store

import (
	"bytes"
	"context"
	"crypto/rand"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"
)

// A store that fills its disk, here a 100 MiB tmpfs written with 256 KiB
// synced random values, dies without the reserve: Pebble's write-ahead log hits
// ENOSPC and Pebble ends the process ("fatal commit error"), as a node did
// in the 1,000-fault run of session 7. With the reserve the same writes are
// refused with a DiskFullError, reads go on, and the store closes cleanly.
// With small memtables the disk can also fill during a flush rather than
// a WAL write: Pebble then retries the flush for ever and every write
// waits, which counts as the same failure (the child is stopped after
// fullDiskStall). Each run is a child process (the fatal error exits it);
// mounting the tmpfs needs root.
func TestFullDiskKillsTheStoreOnlyWithoutTheReserve(t *testing.T) {
	// fullDiskStall is how long a child may take: its 1,000 writes take a
	// few seconds, so a child still running then has stalled.
	const fullDiskStall = 10 * time.Second
	if os.Getenv("QUILL_FULLDISK_DIR") != "" {
		fillTheDisk(t, os.Getenv("QUILL_FULLDISK_DIR"), os.Getenv("QUILL_FULLDISK_RESERVE") == "1")
		return
	}
	if os.Geteuid() != 0 {
		t.Skip("mounting a tmpfs needs root")
	}
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	for _, withReserve := range []bool{false, true} {
		mnt := t.TempDir()
		if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=100m,mode=0700", "quill-store-test", mnt).CombinedOutput(); err != nil {
			t.Skipf("mount a tmpfs: %v: %s", err, bytes.TrimSpace(out))
		}
		ctx, cancel := context.WithTimeout(context.Background(), fullDiskStall)
		cmd := exec.CommandContext(ctx, exe, "-test.run=^TestFullDiskKillsTheStoreOnlyWithoutTheReserve$", "-test.v")
		cmd.Env = append(os.Environ(), "QUILL_FULLDISK_DIR="+mnt, fmt.Sprintf("QUILL_FULLDISK_RESERVE=%d", map[bool]int{false: 0, true: 1}[withReserve]))
		out, err := cmd.CombinedOutput()
		stalled := ctx.Err() != nil
		cancel()
		syscall.Unmount(mnt, syscall.MNT_DETACH)
		last := lastLines(string(out), 4)
		switch {
		case !withReserve && stalled:
			t.Logf("without the reserve: writes stalled for good (a flush failing on the full disk)")
		case !withReserve && (err == nil || !strings.Contains(string(out), "no space left on device")):
			t.Errorf("without the reserve the store survived a full disk (err %v), so this test shows nothing:\n%s", err, last)
		case stalled:
			t.Errorf("with the reserve the store stalled on a full disk:\n%s", last)
		case !withReserve:
			t.Logf("without the reserve: %v\n%s", err, last)
		case err != nil:
			t.Errorf("with the reserve the store died on a full disk: %v\n%s", err, last)
		default:
			t.Logf("with the reserve:\n%s", last)
		}
	}
}

// fillTheDisk writes 256 KiB values with Sync until the disk is full and
// past it; with the reserve it checks that the refusals are DiskFullError
// and that reads and Close still work.
func fillTheDisk(t *testing.T, dir string, withReserve bool) {
	d, err := Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	if withReserve {
		const minFree = 16 << 20 // as core: floor MinFree/8, ballast MinFree/4
		d.SetReserve(Reserve{Floor: minFree / 8, Ballast: minFree / 4, BallastPath: filepath.Join(dir, "ballast")}, minFree)
	}
	// Random bytes: the tables compress nothing away, so the disk fills
	// (a repeated byte would shrink to nothing once flushed from the WAL).
	v := make([]byte, 256<<10)
	rand.Read(v)
	refused := 0
	for i := 0; i < 1000; i++ { // 250 MiB into 100 MiB
		err := d.Set([]byte(fmt.Sprintf("k%06d", i)), v, Sync)
		switch {
		case err == nil:
		case isDiskFull(err):
			refused++
		default:
			t.Fatalf("write %d: %v, want a DiskFullError", i, err)
		}
	}
	if refused == 0 {
		t.Fatal("no write refused: the disk never filled")
	}
	if _, c, err := d.Get([]byte("k000000")); err != nil {
		t.Fatalf("read on the full disk: %v", err)
	} else {
		c.Close()
	}
	if err := d.Close(); err != nil {
		t.Fatalf("close on the full disk: %v", err)
	}
	t.Logf("%d of 1000 writes refused as disk full; reads and close worked", refused)
}

func lastLines(s string, n int) string {
	l := strings.Split(strings.TrimRight(s, "\n"), "\n")
	if len(l) > n {
		l = l[len(l)-n:]
	}
	return strings.Join(l, "\n")
}

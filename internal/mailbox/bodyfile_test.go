package mailbox

import (
	"bytes"
	"crypto/sha256"
	"errors"
	"os"
	"path/filepath"
	"reflect"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
)

// bigBody is a message over LargeBody: a header and n bytes of text.
func bigBody(n int, seed byte) []byte {
	b := []byte("Subject: big\r\n\r\n")
	for len(b) < n {
		b = append(b, 'a'+seed+byte(len(b)%20), '\r', '\n')
	}
	return b
}

func bodyFilesIn(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	filepath.WalkDir(filepath.Join(dir, bodyDir), func(p string, d os.DirEntry, err error) error {
		if err == nil && !d.IsDir() {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// A large body is kept as one file outside Pebble, shared by messages
// with the same bytes; a partial read reads its range only; the file goes
// at the sweep after its last reference, once its grace has passed.
func TestLargeBodyAsFile(t *testing.T) {
	m, dir := newManager(t)
	u := "u@x.org"
	raw := bigBody(1<<20, 0)
	if err := m.StoreAt([]Placed{place(u, "INBOX", v1, 1, 1), place("v@x.org", "INBOX", v1+1, 1, 1)}, "big1", raw, time.Now()); err != nil {
		t.Fatal(err)
	}
	small := []byte("Subject: small\r\n\r\nhi\r\n")
	if err := m.StoreAt([]Placed{place(u, "INBOX", v1, 2, 2)}, "small1", small, time.Now()); err != nil {
		t.Fatal(err)
	}
	if files := bodyFilesIn(t, dir); len(files) != 1 {
		t.Fatalf("body files %v, want one shared by both users", files)
	}
	if _, closer, err := m.db.Get(bodyKey(u, "big1")); err == nil {
		closer.Close()
		t.Fatal("a large body is in Pebble too")
	}
	got, err := m.Body(u, "big1")
	if err != nil || !bytes.Equal(got, raw) {
		t.Fatalf("large body read back: %d bytes, %v", len(got), err)
	}
	if got, err := m.Body(u, "small1"); err != nil || !bytes.Equal(got, small) {
		t.Fatalf("small body: %q %v", got, err)
	}

	// A partial read reads what it asks for, not the body.
	r, err := m.OpenBody(u, "big1")
	if err != nil {
		t.Fatal(err)
	}
	before := m.FileBytesRead()
	part := make([]byte, 4096)
	if _, err := r.ReadAt(part, 500000); err != nil {
		t.Fatal(err)
	}
	r.Close()
	if !bytes.Equal(part, raw[500000:504096]) || r.Size() != int64(len(raw)) {
		t.Fatalf("partial read: wrong bytes or size %d", r.Size())
	}
	if n := m.FileBytesRead() - before; n != 4096 {
		t.Fatalf("a 4 KiB partial read read %d bytes of the file", n)
	}

	// The body survives a restart.
	m = reopen(t, m, dir)
	if got, err := m.Body("v@x.org", "big1"); err != nil || !bytes.Equal(got, raw) {
		t.Fatalf("after reopen: %d bytes, %v", len(got), err)
	}

	// One user's copy goes (this replica left the message's replica
	// set): the file stays for the other.
	clock := hlc.Timestamp(time.Now().UnixMilli()) << 16
	drop := func(user string) {
		t.Helper()
		clock++
		o := &Object{User: user, ID: "big1", Mailbox: "INBOX", UIDValidity: v1, UID: 1, Replicas: []cluster.NodeID{"elsewhere"}}
		if user == "v@x.org" {
			o.UIDValidity = v1 + 1
		}
		up, err := o.Update(replica.Stamp{Clock: clock, Node: m.Self}, o.Replicas, nil)
		if err != nil {
			t.Fatal(err)
		}
		if outs, err := m.Apply([]*replica.Update{up}, nil); err != nil || outs[0] != replica.Applied {
			t.Fatalf("drop %s: %v %v", user, outs, err)
		}
	}
	drop(u)
	late := time.Now().Add(bodyFileGrace + time.Minute)
	if n, err := m.SweepFiles(late); err != nil || n != 0 {
		t.Fatalf("sweep with a reference left: removed %d, %v", n, err)
	}
	if _, err := m.Body("v@x.org", "big1"); err != nil {
		t.Fatal(err)
	}
	drop("v@x.org")
	if _, err := m.Body("v@x.org", "big1"); !errors.Is(err, ErrNoMessage) {
		t.Fatalf("dropped body still read: %v", err)
	}
	// Within its grace the file stays (a write may be about to name it).
	if n, err := m.SweepFiles(time.Now()); err != nil || n != 0 {
		t.Fatalf("sweep within the grace: removed %d, %v", n, err)
	}
	if n, err := m.SweepFiles(late); err != nil || n != 1 {
		t.Fatalf("sweep after the last reference: removed %d, %v", n, err)
	}
	if files := bodyFilesIn(t, dir); len(files) != 0 {
		t.Fatalf("files left: %v", files)
	}
}

// A file a crash left without a reference (written, the commit never
// made) is removed by the sweep after its grace; a temporary file too.
func TestBodyFileOrphans(t *testing.T) {
	m, dir := newManager(t)
	if _, err := m.files.put(bigBody(LargeBody, 3)); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, bodyTmpDir, "cut-short"), []byte("x"), 0o600); err != nil {
		t.Fatal(err)
	}
	if n, err := m.SweepFiles(time.Now()); err != nil || n != 0 {
		t.Fatalf("sweep within the grace: removed %d, %v", n, err)
	}
	if n, err := m.SweepFiles(time.Now().Add(bodyFileGrace + time.Minute)); err != nil || n != 2 {
		t.Fatalf("sweep of an orphan and a temporary file: removed %d, %v", n, err)
	}
}

// A user's deletion takes the references of their large bodies.
func TestDeleteUserTakesBodyFiles(t *testing.T) {
	m, dir := newManager(t)
	if err := m.StoreAt([]Placed{place("u@x.org", "INBOX", v1, 1, 1)}, "big", bigBody(LargeBody+1, 1), time.Now()); err != nil {
		t.Fatal(err)
	}
	if err := m.DeleteUser("u@x.org"); err != nil {
		t.Fatal(err)
	}
	if n, err := m.SweepFiles(time.Now().Add(bodyFileGrace + time.Minute)); err != nil || n != 1 {
		t.Fatalf("sweep after the user's deletion: removed %d, %v", n, err)
	}
	if files := bodyFilesIn(t, dir); len(files) != 0 {
		t.Fatalf("files left: %v", files)
	}
}

// A reference whose file is gone (a crash, a damaged disk) counts as no
// body: reads say ErrNoMessage and the census reports it missing, so the
// next update asks for the content again; a store of the same bytes heals
// it. A hold keeps the sweep from removing files a backup may copy.
func TestMissingBodyFileIsNoBody(t *testing.T) {
	m, dir := newManager(t)
	u := "u@x.org"
	raw := bigBody(200<<10, 1)
	if err := m.StoreAt([]Placed{place(u, "INBOX", v1, 1, 1)}, "big1", raw, time.Now()); err != nil {
		t.Fatal(err)
	}
	files := bodyFilesIn(t, dir)
	if len(files) != 1 {
		t.Fatalf("body files %v", files)
	}
	if ok, err := m.hasBody(m.db, u, "big1"); !ok || err != nil {
		t.Fatalf("hasBody before: %v %v", ok, err)
	}
	os.Remove(files[0])
	if ok, err := m.hasBody(m.db, u, "big1"); ok || err != nil {
		t.Fatalf("hasBody with the file gone: %v %v, want false", ok, err)
	}
	if _, err := m.Body(u, "big1"); !errors.Is(err, ErrNoMessage) {
		t.Fatalf("Body with the file gone: %v, want ErrNoMessage", err)
	}
	if _, err := m.OpenBody(u, "big1"); !errors.Is(err, ErrNoMessage) {
		t.Fatalf("OpenBody with the file gone: %v, want ErrNoMessage", err)
	}
	if err := m.StoreAt([]Placed{place(u, "INBOX", v1, 2, 2)}, "big2", raw, time.Now()); err != nil {
		t.Fatal(err)
	}
	if got, err := m.Body(u, "big1"); err != nil || !bytes.Equal(got, raw) {
		t.Fatalf("after the same bytes were stored again: %d bytes, %v", len(got), err)
	}

	// Held, the sweep removes nothing, even an old orphan.
	orphan := m.files.path(bodyHash(sha256.Sum256([]byte("x"))))
	os.MkdirAll(filepath.Dir(orphan), 0o700)
	os.WriteFile(orphan, []byte("x"), 0o600)
	old := time.Now().Add(-2 * bodyFileGrace)
	os.Chtimes(orphan, old, old)
	release := m.HoldFileSweep()
	if n, err := m.SweepFiles(time.Now()); n != 0 || err != nil {
		t.Fatalf("sweep under a hold removed %d (%v)", n, err)
	}
	release()
	if n, err := m.SweepFiles(time.Now()); n != 1 || err != nil {
		t.Fatalf("sweep after the release removed %d (%v), want the orphan", n, err)
	}
}

// A large body's part table is kept in its reference and survives a
// restart, so OpenParts reads nothing to give it; a reference written
// before tables were kept gets one scanned from the file, once. A small
// body has none (it is read whole).
func TestPartTableKeptWithBody(t *testing.T) {
	m, dir := newManager(t)
	u := "u@x.org"
	raw := append([]byte("Subject: parts\r\nContent-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\n\r\nfirst\r\n--b\r\n\r\n"), bigBody(LargeBody, 2)...)
	raw = append(raw, "\r\n--b--\r\n"...)
	if err := m.StoreAt([]Placed{place(u, "INBOX", v1, 1, 1)}, "big1", raw, time.Now()); err != nil {
		t.Fatal(err)
	}
	m = reopen(t, m, dir)
	before := m.FileBytesRead()
	r, tab, err := m.OpenParts(u, "big1")
	if err != nil || tab == nil {
		t.Fatalf("OpenParts: %v %v", tab, err)
	}
	r.Close()
	if n := m.FileBytesRead() - before; n != 0 {
		t.Fatalf("OpenParts read %d bytes of the file", n)
	}
	if len(tab.Root.Children) != 2 || tab.Size != int64(len(raw)) {
		t.Fatalf("table %+v", tab)
	}
	second := tab.Root.Children[1]
	if !bytes.Equal(raw[second.Body:second.End], bigBody(LargeBody, 2)) {
		t.Fatalf("part 2 at %d..%d is not the part", second.Body, second.End)
	}

	// A reference without a table (written before tables were kept).
	v, closer, err := m.db.Get(bodyFileKey(u, "big1"))
	if err != nil {
		t.Fatal(err)
	}
	h, size, err := decodeBodyRef(v)
	closer.Close()
	if err != nil {
		t.Fatal(err)
	}
	if err := m.db.Set(bodyFileKey(u, "big1"), encodeBodyRef(h, int(size), nil), store.Sync); err != nil {
		t.Fatal(err)
	}
	for i := range 2 {
		before := m.FileBytesRead()
		r, old, err := m.OpenParts(u, "big1")
		if err != nil || !reflect.DeepEqual(old, tab) {
			t.Fatalf("OpenParts of a reference without a table: %+v %v", old, err)
		}
		r.Close()
		if n := m.FileBytesRead() - before; (i == 0) != (n > 0) {
			t.Fatalf("OpenParts %d read %d bytes of the file: want a scan the first time only", i, n)
		}
	}

	if err := m.StoreAt([]Placed{place(u, "INBOX", v1, 2, 2)}, "small1", []byte("Subject: s\r\n\r\nx\r\n"), time.Now()); err != nil {
		t.Fatal(err)
	}
	if r, tab, err := m.OpenParts(u, "small1"); r != nil || tab != nil || err != nil {
		t.Fatalf("OpenParts of a small body: %v %v %v", r, tab, err)
	}
	if _, _, err := m.OpenParts(u, "nothing"); !errors.Is(err, ErrNoMessage) {
		t.Fatalf("OpenParts of no message: %v", err)
	}
}

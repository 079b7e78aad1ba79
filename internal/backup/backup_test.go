package backup

import (
	"archive/tar"
	"bytes"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/quillmail/quill/internal/store"
)

// A store with data, backed up while open, extracted, restored into a new
// data directory and opened there: every key is back, the data
// directory's files too, the left-out ones not.
func TestWriteExtractRestore(t *testing.T) {
	data := t.TempDir()
	db, err := store.Open(data)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	for i := range 1000 {
		if err := db.Set(fmt.Appendf(nil, "k%04d", i), bytes.Repeat([]byte{byte(i)}, 1000), store.Sync); err != nil {
			t.Fatal(err)
		}
	}
	for name, body := range map[string]string{"node.id": "n-test\n", "node.boot": "3\n", "admin.token": "tok\n",
		"node.alive": "2020-01-01T00:00:00Z\n", "ballast": "xxxx", "tls/selfsigned.key": "key"} {
		os.MkdirAll(filepath.Dir(filepath.Join(data, name)), 0o700)
		if err := os.WriteFile(filepath.Join(data, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var archive bytes.Buffer
	m, err := Write(&archive, data, db, "n-test")
	if err != nil {
		t.Fatal(err)
	}
	if entries, _ := filepath.Glob(filepath.Join(data, tmpPrefix+"*")); len(entries) != 0 {
		t.Errorf("checkpoint left behind: %v", entries)
	}
	// A write after the backup is not in it.
	db.Set([]byte("later"), []byte("x"), store.Sync)

	into := filepath.Join(t.TempDir(), "bk")
	got, err := Extract(bytes.NewReader(archive.Bytes()), into)
	if err != nil {
		t.Fatal(err)
	}
	if got.Node != "n-test" || len(got.Files) != len(m.Files) {
		t.Fatalf("manifest %+v", got)
	}
	restored := filepath.Join(t.TempDir(), "data")
	if _, err := Restore(into, restored); err != nil {
		t.Fatal(err)
	}
	for name, want := range map[string]string{"node.id": "n-test\n", "admin.token": "tok\n", "tls/selfsigned.key": "key"} {
		if b, err := os.ReadFile(filepath.Join(restored, name)); err != nil || string(b) != want {
			t.Errorf("%s restored as %q, %v", name, b, err)
		}
	}
	for _, name := range []string{"node.alive", "ballast", ManifestName} {
		if _, err := os.Stat(filepath.Join(restored, name)); err == nil {
			t.Errorf("%s was restored", name)
		}
	}
	db2, err := store.Open(restored)
	if err != nil {
		t.Fatal(err)
	}
	defer db2.Close()
	for i := range 1000 {
		v, c, err := db2.Get(fmt.Appendf(nil, "k%04d", i))
		if err != nil || len(v) != 1000 || v[0] != byte(i) {
			t.Fatalf("key %d after restore: %v", i, err)
		}
		c.Close()
	}
	if _, _, err := db2.Get([]byte("later")); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("a write after the backup is in it: %v", err)
	}

	// Refusals: a data directory in use, an archive cut short, a file
	// changed since.
	if _, err := Restore(into, restored); !errors.Is(err, ErrNotEmpty) {
		t.Errorf("restore into a non-empty directory: %v", err)
	}
	if _, err := Extract(bytes.NewReader(archive.Bytes()[:archive.Len()/2]), filepath.Join(t.TempDir(), "cut")); err == nil {
		t.Error("an archive cut in half was taken")
	}
	if err := os.WriteFile(filepath.Join(into, "node.id"), []byte("n-other\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	if _, err := Restore(into, filepath.Join(t.TempDir(), "d")); err == nil || !strings.Contains(err.Error(), "node.id differs") {
		t.Errorf("restore of a changed backup: %v", err)
	}
}

// An archive that names a path outside its directory is refused.
func TestExtractRefusesEscapes(t *testing.T) {
	var b bytes.Buffer
	writeTar(t, &b, "../evil", "x")
	if _, err := Extract(&b, t.TempDir()); err == nil || !strings.Contains(err.Error(), "leaves the directory") {
		t.Errorf("Extract of ../evil: %v", err)
	}
}

func writeTar(t *testing.T, b *bytes.Buffer, name, body string) {
	tw := tar.NewWriter(b)
	if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o600, Size: int64(len(body)), Typeflag: tar.TypeReg}); err != nil {
		t.Fatal(err)
	}
	tw.Write([]byte(body))
	tw.Close()
}

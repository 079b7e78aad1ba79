// Package backup is a node's hard state as one archive, for `quill
// backup` and `quill restore`: a consistent Pebble checkpoint of the
// node's store (internal/store) taken by the running node, and the files
// of its data directory (node.id, node.boot, admin.token, tls/,
// cluster.known, rpc.port, bodies/: the message bodies kept as files,
// read after the checkpoint so every one it names is there), written as
// a tar stream whose last entry is a manifest with every file's SHA-256.
// An archive without its manifest was cut short and is refused.
//
// The cluster's hard state is the hard state of its nodes: `quill backup
// --cluster` asks one node's admin API, which streams each live member's
// archive over that member's Backup service (RPC), into a directory per
// node. Restoring every node's archive into its data directory brings the
// cluster back as of those moments; each node's copies of replicated
// objects are stamped (Porcupine §4.1, HLC), so nodes backed up a few
// seconds apart converge as after any brief absence: the newest stamp
// wins, the update logs push what they still hold, repair restores
// missing replicas. Restoring one node of a running cluster brings it
// back like a node that was away since its backup.
//
// What is left out, and why:
//   - node.alive: a node of a cluster last alive longer ago than
//     --log-max-age renews itself at start (core.renewIfAway: its state
//     moved aside, rejoining empty); a backup restored after a week would
//     come back empty. Without the note the node starts as one from before
//     the note existed: it keeps its state and writes the note anew.
//   - away-*/: old state a renewal moved aside.
//   - ballast (re-laid at start), sns/ (worker sockets), the store's live
//     files (the checkpoint stands for them).
//
// Pebble's Checkpoint (a hard-linked copy of the tables plus the manifest
// and WAL) is the library's own consistent copy of a running database;
// the tar framing and digests are the standard library's.
package backup

import (
	"archive/tar"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"golang.org/x/sys/unix"
)

// Format is the archive format's version, in the manifest.
const Format = 1

// ManifestName is the manifest's name: the archive's last entry, and the
// file beside the others in an extracted backup.
const ManifestName = "quill-backup.json"

// StoreDir is the store's directory in a data directory and in an archive.
const StoreDir = "store"

// tmpPrefix names the directory a checkpoint is taken into, inside the
// data directory (the same file system, so Pebble hard-links the tables).
const tmpPrefix = "backup-"

// File is one file of a backup.
type File struct {
	Name   string `json:"name"` // slash-separated, relative to the data directory
	Size   int64  `json:"size"`
	SHA256 string `json:"sha256"`
}

// Manifest describes a backup.
type Manifest struct {
	Format int       `json:"format"`
	Node   string    `json:"node"`
	Taken  time.Time `json:"taken"`
	Files  []File    `json:"files"`
}

// Bytes is the size of the backup's files.
func (m *Manifest) Bytes() int64 {
	var n int64
	for _, f := range m.Files {
		n += f.Size
	}
	return n
}

// skipped are the data directory's entries a backup leaves out (see the
// package doc).
var skipped = []string{StoreDir, "node.alive", "ballast", "sns"}

// awayPrefix names the directories where a node renewed after a long
// absence moved its old hard state (core.renewIfAway): not the node's
// state, and as large as a store.
const awayPrefix = "away-"

// skip reports whether a top-level entry of the data directory is left
// out: the list above, checkpoints being taken, files being written, old
// state moved aside.
func skip(name string) bool {
	return slices.Contains(skipped, name) || strings.HasPrefix(name, tmpPrefix) || strings.HasSuffix(name, ".tmp") ||
		strings.HasPrefix(name, awayPrefix)
}

// Checkpointer takes a consistent copy of the store (store.DB).
type Checkpointer interface {
	Checkpoint(dest string) error
}

// Write streams the node's backup to w: the checkpoint of db, the other
// files of dataDir, the manifest last.
func Write(w io.Writer, dataDir string, db Checkpointer, node string) (*Manifest, error) {
	tmp, err := os.MkdirTemp(dataDir, tmpPrefix)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	defer os.RemoveAll(tmp)
	m := &Manifest{Format: Format, Node: node, Taken: time.Now().UTC()}
	if err := db.Checkpoint(filepath.Join(tmp, StoreDir)); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	tw := tar.NewWriter(w)
	entries, err := os.ReadDir(dataDir)
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	for _, e := range entries {
		if skip(e.Name()) {
			continue
		}
		if err := addTree(tw, m, filepath.Join(dataDir, e.Name()), e.Name()); err != nil {
			return nil, err
		}
	}
	if err := addTree(tw, m, filepath.Join(tmp, StoreDir), StoreDir); err != nil {
		return nil, err
	}
	b, _ := json.MarshalIndent(m, "", "  ")
	if err := tw.WriteHeader(&tar.Header{Name: ManifestName, Mode: 0o600, Size: int64(len(b)), ModTime: m.Taken, Typeflag: tar.TypeReg}); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	if _, err := tw.Write(b); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	if err := tw.Close(); err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	return m, nil
}

// addTree writes a file, or a directory and what is under it, as name;
// only directories and regular files (no sockets, no links).
func addTree(tw *tar.Writer, m *Manifest, path, name string) error {
	return filepath.WalkDir(path, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		rel, _ := filepath.Rel(path, p)
		entry := filepath.ToSlash(filepath.Join(name, rel))
		if d.IsDir() {
			return tw.WriteHeader(&tar.Header{Name: entry + "/", Mode: 0o700, Typeflag: tar.TypeDir})
		}
		if !d.Type().IsRegular() {
			return nil
		}
		f, err := os.Open(p)
		if err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		defer f.Close()
		st, err := f.Stat()
		if err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		if err := tw.WriteHeader(&tar.Header{Name: entry, Mode: 0o600, Size: st.Size(), ModTime: st.ModTime(), Typeflag: tar.TypeReg}); err != nil {
			return fmt.Errorf("backup: %w", err)
		}
		h := sha256.New()
		// Exactly the size in the header: a file that grew meanwhile (the
		// known-members hint) is cut where it was.
		n, err := io.Copy(io.MultiWriter(tw, h), io.LimitReader(f, st.Size()))
		if err != nil {
			return fmt.Errorf("backup: %s: %w", p, err)
		}
		if n != st.Size() {
			return fmt.Errorf("backup: %s shrank while it was read", p)
		}
		m.Files = append(m.Files, File{Name: entry, Size: n, SHA256: hex.EncodeToString(h.Sum(nil))})
		return nil
	})
}

// ErrNotEmpty is a target directory that holds something already.
var ErrNotEmpty = errors.New("directory is not empty")

// emptyDir makes dir, or checks that it is empty.
func emptyDir(dir string) error {
	entries, err := os.ReadDir(dir)
	if errors.Is(err, fs.ErrNotExist) {
		return os.MkdirAll(dir, 0o700)
	}
	if err != nil {
		return err
	}
	if len(entries) > 0 {
		return fmt.Errorf("%s: %w", dir, ErrNotEmpty)
	}
	return nil
}

// Extract reads an archive into dir (made, or empty) and checks it
// against its manifest: every file present with its size and digest,
// nothing more, the manifest last. The manifest is kept as ManifestName.
// The files are flushed to disk before it returns (a backup not on disk
// is none).
func Extract(r io.Reader, dir string) (*Manifest, error) {
	if err := emptyDir(dir); err != nil {
		return nil, fmt.Errorf("backup into %w", err)
	}
	tr := tar.NewReader(r)
	got := map[string]File{}
	var m *Manifest
	for {
		h, err := tr.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("backup archive: %w (cut short?)", err)
		}
		if m != nil {
			return nil, fmt.Errorf("backup archive: %q after the manifest", h.Name)
		}
		name := strings.TrimSuffix(h.Name, "/")
		if !filepath.IsLocal(name) {
			return nil, fmt.Errorf("backup archive: entry %q leaves the directory", h.Name)
		}
		path := filepath.Join(dir, filepath.FromSlash(name))
		switch h.Typeflag {
		case tar.TypeDir:
			if err := os.MkdirAll(path, 0o700); err != nil {
				return nil, err
			}
		case tar.TypeReg:
			if name == ManifestName {
				b, err := io.ReadAll(io.LimitReader(tr, 64<<20))
				if err != nil {
					return nil, fmt.Errorf("backup archive: manifest: %w", err)
				}
				m = &Manifest{}
				if err := json.Unmarshal(b, m); err != nil {
					return nil, fmt.Errorf("backup archive: manifest: %w", err)
				}
				if err := os.WriteFile(path, b, 0o600); err != nil {
					return nil, err
				}
				continue
			}
			f, err := copyFile(path, tr)
			if err != nil {
				return nil, fmt.Errorf("backup archive: %s: %w", name, err)
			}
			got[name] = f
		default:
			return nil, fmt.Errorf("backup archive: entry %q is neither a file nor a directory", h.Name)
		}
	}
	if m == nil {
		return nil, errors.New("backup archive: no manifest at its end (cut short: the node may have failed while streaming it, see its log)")
	}
	if err := check(m, got); err != nil {
		return nil, err
	}
	return m, syncDir(dir)
}

// copyFile writes r into a new file at path and returns its size and
// digest.
func copyFile(path string, r io.Reader) (File, error) {
	if err := os.MkdirAll(filepath.Dir(path), 0o700); err != nil {
		return File{}, err
	}
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return File{}, err
	}
	h := sha256.New()
	n, err := io.Copy(io.MultiWriter(f, h), r)
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	return File{Size: n, SHA256: hex.EncodeToString(h.Sum(nil))}, err
}

// check compares what was read with the manifest.
func check(m *Manifest, got map[string]File) error {
	if m.Format != Format {
		return fmt.Errorf("backup of format %d; this quill reads format %d", m.Format, Format)
	}
	for _, f := range m.Files {
		g, ok := got[f.Name]
		switch {
		case !ok:
			return fmt.Errorf("backup: %s is in the manifest but missing", f.Name)
		case g.Size != f.Size || g.SHA256 != f.SHA256:
			return fmt.Errorf("backup: %s differs from the manifest (%d bytes, SHA-256 %s; want %d, %s)", f.Name, g.Size, g.SHA256, f.Size, f.SHA256)
		}
		delete(got, f.Name)
	}
	for name := range got {
		return fmt.Errorf("backup: %s is not in the manifest", name)
	}
	return nil
}

// syncDir flushes the file system holding dir (one syncfs for every file
// written under it, rather than a fsync per file).
func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	if err := unix.Syncfs(int(d.Fd())); err != nil {
		return fmt.Errorf("sync %s: %w", dir, err)
	}
	return nil
}

// ReadManifest reads the manifest of an extracted backup.
func ReadManifest(dir string) (*Manifest, error) {
	b, err := os.ReadFile(filepath.Join(dir, ManifestName))
	if err != nil {
		return nil, err
	}
	m := &Manifest{}
	if err := json.Unmarshal(b, m); err != nil {
		return nil, fmt.Errorf("%s: %w", filepath.Join(dir, ManifestName), err)
	}
	return m, nil
}

// Restore copies an extracted backup (from) into a node's data directory,
// which must be missing or empty (the node stopped, or never started
// there): every file checked against the manifest first, then copied into
// a directory beside dataDir that is renamed into place at the end, so a
// restore that fails leaves no half data directory.
func Restore(from, dataDir string) (*Manifest, error) {
	m, err := ReadManifest(from)
	if err != nil {
		return nil, fmt.Errorf("backup %s: %w (give the directory of one node's backup)", from, err)
	}
	if err := emptyDir(dataDir); err != nil {
		return nil, fmt.Errorf("restore into %w: restore only into a new or empty data directory, with the node stopped", err)
	}
	tmp, err := os.MkdirTemp(filepath.Dir(filepath.Clean(dataDir)), "."+filepath.Base(dataDir)+".restoring-")
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	defer os.RemoveAll(tmp)
	got := map[string]File{}
	for _, f := range m.Files {
		if !filepath.IsLocal(filepath.FromSlash(f.Name)) {
			return nil, fmt.Errorf("backup %s: entry %q leaves the directory", from, f.Name)
		}
		src, err := os.Open(filepath.Join(from, filepath.FromSlash(f.Name)))
		if err != nil {
			return nil, fmt.Errorf("backup %s: %w", from, err)
		}
		g, err := copyFile(filepath.Join(tmp, filepath.FromSlash(f.Name)), src)
		src.Close()
		if err != nil {
			return nil, fmt.Errorf("restore %s: %w", f.Name, err)
		}
		got[f.Name] = g
	}
	if err := check(m, got); err != nil {
		return nil, err
	}
	if err := os.MkdirAll(filepath.Join(tmp, StoreDir), 0o700); err != nil {
		return nil, err
	}
	if err := syncDir(tmp); err != nil {
		return nil, err
	}
	if err := os.Remove(dataDir); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	if err := os.Rename(tmp, dataDir); err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	return m, syncDir(filepath.Dir(filepath.Clean(dataDir)))
}

// NodeDirs lists the node backups in a backup directory (`quill backup
// --cluster` makes one subdirectory per node), sorted.
func NodeDirs(dir string) ([]string, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
	}
	var out []string
	for _, e := range entries {
		if _, err := os.Stat(filepath.Join(dir, e.Name(), ManifestName)); err == nil {
			out = append(out, e.Name())
		}
	}
	sort.Strings(out)
	return out, nil
}

// ctxWriter fails writes once ctx is done (a client that went away).
type ctxWriter struct {
	ctx context.Context
	w   io.Writer
}

func (c ctxWriter) Write(b []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.w.Write(b)
}

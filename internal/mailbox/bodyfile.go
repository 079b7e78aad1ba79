package mailbox

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quillmail/quill/internal/store"
)

// Large bodies as files. A body of LargeBody bytes or more is kept out of
// the LSM tree: Pebble would hold it whole in its memtable, write it to
// the WAL and then rewrite it at every compaction (issue 16). It goes to
// a file named by the SHA-256 of its bytes under DATA/bodies/, and the
// store keeps only a reference under the message's key of kind
// KindBodyFile (hash and size); bodies below the threshold stay in
// Pebble under KindBody, in whatever encoding the store gives them. A
// file is immutable once in place, so a partial fetch reads just its
// range (ReadAt) and a backup copies it as it is.
//
// Durability: the file is written to DATA/bodies.tmp/, fsync'd, renamed
// into place and its directory fsync'd before the batch that refers to it
// is committed, so a committed reference never names a missing file.
//
// Garbage: a file lives while a reference names its hash; two messages
// with the same bytes (an IMAP COPY, one message to several users of this
// node) share one file. References go with their messages (expunge,
// a replica moved away, a mailbox or user deleted) in the same batches
// that remove the messages; the files are removed by sweepFiles, which
// runs with the expunged-body sweep: every file no reference names whose
// modification time is older than bodyFileGrace goes. The grace covers a
// write between its rename and its commit (a write that reuses a file
// touches it first), and the same rule removes what a crash left between
// the two (orphans) and temporary files of writes cut short.

// LargeBody is the size from which a message body is kept as a file
// rather than in Pebble. At 64 KiB a body is larger than Pebble's data
// blocks many times over, and such messages (attachments) are a small
// share of all messages, so the files stay few.
const LargeBody = 64 << 10

// bodyFileGrace is how old a body file no reference names must be before
// the sweep removes it: far longer than a write takes between its file's
// rename and its commit (a group commit, or a replica's apply after the
// last chunk of a push). It was an hour; under a POP3 workload that
// deletes what it fetches that left 396 MB of deleted mail's files on
// disk after an hour's run (docs/benchmarks.md), for no gain.
const bodyFileGrace = 10 * time.Minute

// bodyDir and bodyTmpDir are the directories of body files under the
// data directory; bodyTmpDir ends in .tmp so backups leave it out.
const (
	bodyDir    = "bodies"
	bodyTmpDir = "bodies.tmp"
)

// bodyFiles is the node's directory of body files.
type bodyFiles struct {
	dir, tmp string
	// mu orders a write that reuses a file (touching it) with the sweep's
	// look at the file's age and its removal.
	mu sync.Mutex
	// read counts the bytes read from body files (FileBytesRead).
	read atomic.Int64
	// tables holds the part tables scanned from files whose references
	// have none (OpenParts).
	tables partTables
	// sweeping is held for reading by each HoldFileSweep in force and
	// for writing by a sweep: no file is swept while a backup may still
	// copy it, and a hold waits for a sweep under way.
	sweeping sync.RWMutex
	// synced holds the directories known durable in their parents
	// (mkdirSynced).
	synced sync.Map
}

// FileBytesRead is how many bytes were read from body files since the
// manager started: what shows that a partial fetch reads its range only.
func (m *Manager) FileBytesRead() int64 { return m.files.read.Load() }

func newBodyFiles(db *store.DB) *bodyFiles {
	if db == nil { // a manager used only to reach other nodes' fragments
		return &bodyFiles{}
	}
	data := filepath.Dir(db.Dir())
	return &bodyFiles{dir: filepath.Join(data, bodyDir), tmp: filepath.Join(data, bodyTmpDir)}
}

// bodyHash is the SHA-256 of a body, its file's name.
type bodyHash [sha256.Size]byte

// path is a body file's path: 256 subdirectories by the hash's first
// byte, so no directory grows past a few thousand entries.
func (f *bodyFiles) path(h bodyHash) string {
	s := hex.EncodeToString(h[:])
	return filepath.Join(f.dir, s[:2], s)
}

// put makes the file of body durable, or reuses (touches) the file that
// holds the same bytes.
func (f *bodyFiles) put(body []byte) (bodyHash, error) {
	h := bodyHash(sha256.Sum256(body))
	p := f.path(h)
	if err := f.touch(h); err == nil {
		// The file is there, but its writer may not have fsync'd the
		// directories that name it yet (the same message to two users
		// of this node at once): they are made durable here too before
		// this reference commits. The bytes were fsync'd before the
		// rename that made the name visible.
		if err := f.dirs(p); err != nil {
			return h, fmt.Errorf("body file %s: %w", p, err)
		}
		if err := syncDir(filepath.Dir(p)); err != nil {
			return h, fmt.Errorf("body file %s: %w", p, err)
		}
		return h, nil
	}
	if err := f.write(p, body); err != nil {
		return h, fmt.Errorf("body file %s: %w", p, err)
	}
	return h, nil
}

// touch makes a body file young again, under the lock the sweep looks at
// its age under: a write that reuses it, or a new reference to it, keeps
// it from the sweep for another grace.
func (f *bodyFiles) touch(h bodyHash) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := time.Now()
	return os.Chtimes(f.path(h), now, now)
}

// write writes body to a temporary file, fsyncs it, renames it to p and
// fsyncs p's directory (and the directories above it that it created).
func (f *bodyFiles) write(p string, body []byte) error {
	if err := f.dirs(p); err != nil {
		return err
	}
	var r [8]byte
	rand.Read(r[:])
	tmp := filepath.Join(f.tmp, hex.EncodeToString(r[:]))
	fh, err := os.OpenFile(tmp, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	_, err = fh.Write(body)
	if err == nil {
		err = fh.Sync() // the bytes are durable before any name points at them
	}
	if cerr := fh.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, p)
	}
	if err != nil {
		os.Remove(tmp)
		return err
	}
	return syncDir(filepath.Dir(p)) // the name is durable before the commit that refers to it
}

// dirs makes the directories a body file at p needs (the temporary one,
// bodies/ and p's own), each durable in its parent.
func (f *bodyFiles) dirs(p string) error {
	for _, d := range []string{f.tmp, f.dir, filepath.Dir(p)} {
		if err := f.mkdirSynced(d); err != nil {
			return err
		}
	}
	return nil
}

// mkdirSynced makes dir if it is missing and fsyncs its parent so the
// entry survives a crash. The first use of a directory in this process
// fsyncs its parent even when it exists: another write may have just made
// it and not fsync'd the parent yet (and a crash before this process may
// have left it unsynced); after that the directory is known durable.
func (f *bodyFiles) mkdirSynced(dir string) error {
	if _, ok := f.synced.Load(dir); ok {
		return nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return err
	}
	if err := syncDir(filepath.Dir(dir)); err != nil {
		return err
	}
	f.synced.Store(dir, true)
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	defer d.Close()
	return d.Sync()
}

// open opens a body file for reading.
func (f *bodyFiles) open(h bodyHash) (*os.File, error) { return os.Open(f.path(h)) }

// --- references in the store

func bodyFileKey(user, id string) []byte {
	return append(store.UserPrefix(store.KindBodyFile, user), id...)
}

// A reference is the file's hash and the body's size, then the body's
// part table (mimepart.Table.Marshal, versioned): the table goes where the
// reference goes (a COPY copies it, an expunge deletes it) and costs a
// few bytes a part. A reference written before tables were kept has none;
// OpenParts then scans the file (partTables caches what it found).
func encodeBodyRef(h bodyHash, size int, table []byte) []byte {
	v := binary.AppendUvarint(append([]byte(nil), h[:]...), uint64(size))
	return append(v, table...)
}

func decodeBodyRef(v []byte) (bodyHash, int64, error) {
	h, n, _, err := decodeBodyRefTable(v)
	return h, n, err
}

// decodeBodyRefTable is decodeBodyRef with the encoded part table (nil if
// the reference has none).
func decodeBodyRefTable(v []byte) (bodyHash, int64, []byte, error) {
	var h bodyHash
	if len(v) < len(h)+1 {
		return h, 0, nil, errShort
	}
	copy(h[:], v)
	n, k := binary.Uvarint(v[len(h):])
	if k <= 0 {
		return h, 0, nil, errShort
	}
	return h, int64(n), v[len(h)+k:], nil
}

// bodyRef reads the file reference of a message's body, if it has one.
func bodyRef(r store.Reader, user, id string) (bodyHash, int64, bool, error) {
	v, closer, err := r.Get(bodyFileKey(user, id))
	if errors.Is(err, store.ErrNotFound) {
		return bodyHash{}, 0, false, nil
	}
	if err != nil {
		return bodyHash{}, 0, false, err
	}
	defer closer.Close()
	h, n, err := decodeBodyRef(v)
	if err != nil {
		return h, 0, false, fmt.Errorf("user %s message %s: body file reference: %w", user, id, err)
	}
	return h, n, true, nil
}

// hasBody reports whether r holds a message's body, in Pebble or as a
// file. A reference whose file is missing (lost to a crash or a damaged
// disk) counts as no body, so the message's next update asks for its
// content again and another replica's copy heals it.
func (m *Manager) hasBody(r store.Reader, user, id string) (bool, error) {
	if ok, err := hasIn(r, bodyKey(user, id)); ok || err != nil {
		return ok, err
	}
	h, _, ok, err := bodyRef(r, user, id)
	if !ok || err != nil {
		return false, err
	}
	if _, err := os.Stat(m.files.path(h)); errors.Is(err, os.ErrNotExist) {
		return false, nil
	} else if err != nil {
		return false, fmt.Errorf("user %s message %s: body file: %w", user, id, err)
	}
	return true, nil
}

// setBody stores a message's body in the transaction: a large one as a
// file (durable before this returns), the others in Pebble. known says
// the message may be held here already, in the other form, which is then
// deleted; a new message (the delivery path) writes no such tombstone.
func (t *tx) setBody(user, id string, body []byte, known bool) error {
	put, other := bodyKey(user, id), bodyFileKey(user, id)
	var v []byte
	if len(body) < LargeBody {
		v = encodeBody(body)
	} else {
		h, err := t.m.files.put(body)
		if err != nil {
			return fmt.Errorf("user %s message %s: %w", user, id, err)
		}
		put, other, v = other, put, encodeBodyRef(h, len(body), partTable(body))
	}
	if known {
		if err := t.b.Delete(other); err != nil {
			return err
		}
	}
	return t.b.Set(put, v)
}

// copyBody makes message id share the body of message from (an IMAP COPY
// replicated): the file reference is copied, not the file. It reports
// false when from has no body here.
func (t *tx) copyBody(user, from, id string) (bool, error) {
	v, closer, err := t.b.Get(bodyFileKey(user, from))
	if err == nil {
		err = t.b.Set(bodyFileKey(user, id), v)
		closer.Close()
		if err == nil {
			// The file was due for the sweep if the only reference
			// went meanwhile: touched, it waits another grace.
			if h, _, derr := decodeBodyRef(v); derr == nil {
				t.m.files.touch(h)
			}
		}
		return err == nil, err
	}
	if !errors.Is(err, store.ErrNotFound) {
		return false, err
	}
	raw, closer, err := t.b.Get(bodyKey(user, from))
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer closer.Close()
	return true, t.b.Set(bodyKey(user, id), raw)
}

// deleteBody removes a message's body from the transaction, wherever it is
// kept; a file goes at the next sweep once nothing names it.
func (t *tx) deleteBody(user, id string) error {
	if err := t.b.Delete(bodyKey(user, id)); err != nil {
		return err
	}
	return t.b.Delete(bodyFileKey(user, id))
}

// BodyReader is a message's bytes to read from anywhere: a file's for a
// large body, memory's for one kept in Pebble.
type BodyReader interface {
	io.ReaderAt
	io.Closer
	Size() int64
}

type memBody struct{ *bytes.Reader }

func (memBody) Close() error { return nil }

type fileBody struct {
	*os.File
	size int64
	read *atomic.Int64
}

func (f fileBody) Size() int64 { return f.size }

// ReadAt reads from the file and counts what it read.
func (f fileBody) ReadAt(p []byte, off int64) (int, error) {
	n, err := f.File.ReadAt(p, off)
	f.read.Add(int64(n))
	return n, err
}

// OpenBody opens a message's body for reads of any range: a large body's
// file is read only where asked (an IMAP partial fetch), not whole.
func (m *Manager) OpenBody(user, id string) (BodyReader, error) {
	h, size, ok, err := bodyRef(m.db, user, id)
	if err != nil {
		return nil, err
	}
	if !ok {
		b, err := m.Body(user, id)
		if err != nil {
			return nil, err
		}
		return memBody{bytes.NewReader(b)}, nil
	}
	f, err := m.files.open(h)
	if err != nil {
		return nil, fileErr(user, id, err)
	}
	return fileBody{f, size, &m.files.read}, nil
}

// fileErr names a body file that could not be opened; a missing one is
// ErrNoMessage, as a body that is not here (hasBody).
func fileErr(user, id string, err error) error {
	if errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("user %s message %s: body file missing: %w", user, id, ErrNoMessage)
	}
	return fmt.Errorf("user %s message %s: body file: %w", user, id, err)
}

// fileBodyOf reads a message's body from its file, if it is kept as one.
func (m *Manager) fileBodyOf(user, id string) ([]byte, bool, error) {
	h, size, ok, err := bodyRef(m.db, user, id)
	if err != nil || !ok {
		return nil, false, err
	}
	f, err := m.files.open(h)
	if err != nil {
		return nil, false, fileErr(user, id, err)
	}
	defer f.Close()
	b := make([]byte, size)
	n, err := io.ReadFull(f, b)
	m.files.read.Add(int64(n))
	if err != nil {
		return nil, false, fmt.Errorf("user %s message %s: body file: %w", user, id, err)
	}
	return b, true, nil
}

// HoldFileSweep stops SweepFiles from removing any body file until the
// release it returns is called: a backup's checkpoint names files whose
// references may go before the archive has copied them.
func (m *Manager) HoldFileSweep() (release func()) {
	m.files.sweeping.RLock()
	var once sync.Once
	return func() { once.Do(m.files.sweeping.RUnlock) }
}

// SweepFiles removes the body files no reference names whose modification
// time is older than bodyFileGrace (see above), and the temporary files
// of writes cut short, and reports how many it removed.
func (m *Manager) SweepFiles(now time.Time) (int, error) {
	f := m.files
	if !f.sweeping.TryLock() {
		return 0, nil // a backup is copying the files: the next sweep
	}
	defer f.sweeping.Unlock()
	// Read the references first: a file written after this point is
	// younger than the grace, so it cannot be taken for garbage.
	named := map[bodyHash]bool{}
	it, err := m.db.PrefixIter(nil, store.KindPrefix(store.KindBodyFile))
	if err != nil {
		return 0, err
	}
	for it.First(); it.Valid(); it.Next() {
		if h, _, err := decodeBodyRef(it.Value()); err == nil {
			named[h] = true
		}
	}
	if err := it.Close(); err != nil {
		return 0, err
	}
	removed := 0
	old := func(p string) bool {
		st, err := os.Stat(p)
		return err == nil && now.Sub(st.ModTime()) > bodyFileGrace
	}
	tmps, _ := os.ReadDir(f.tmp)
	for _, e := range tmps {
		if p := filepath.Join(f.tmp, e.Name()); old(p) && os.Remove(p) == nil {
			removed++
		}
	}
	subs, err := os.ReadDir(f.dir)
	if errors.Is(err, os.ErrNotExist) {
		return removed, nil
	}
	if err != nil {
		return removed, err
	}
	for _, s := range subs {
		files, err := os.ReadDir(filepath.Join(f.dir, s.Name()))
		if err != nil {
			continue
		}
		for _, e := range files {
			var h bodyHash
			if b, err := hex.DecodeString(e.Name()); err != nil || len(b) != len(h) {
				continue // not a body file: left alone
			} else {
				copy(h[:], b)
			}
			if named[h] {
				continue
			}
			p := filepath.Join(f.dir, s.Name(), e.Name())
			f.mu.Lock()
			if old(p) && os.Remove(p) == nil {
				removed++
			}
			f.mu.Unlock()
		}
	}
	return removed, nil
}

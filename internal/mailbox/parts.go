package mailbox

import (
	"bytes"
	"errors"
	"fmt"
	"sync"

	"github.com/hashicorp/golang-lru/simplelru"
	"github.com/quillmail/quill/internal/mimepart"
	"github.com/quillmail/quill/internal/store"
)

// Part tables of large bodies (mimepart): made from the body's bytes as
// its file is written, kept in the body's reference, and given with the
// file to an IMAP FETCH of its sections, which then reads the ranges it
// needs.

// partTable is the encoded part table of a body about to be kept as a
// file. The scan reads the bytes in memory once more (and its quoted-
// printable and base64 parts once again, for their decoded sizes): about
// 0.1 s of CPU for 25 MB of base64 (mimepart.BenchmarkScan25MB), beside
// the seconds such a message takes to arrive. A body of more
// parts than a table keeps gets mimepart.NoTable (it is read whole when
// fetched); one the scan fails on otherwise (it cannot, reading memory)
// gets no table and is scanned when first fetched.
func partTable(body []byte) []byte {
	t, err := mimepart.Scan(bytes.NewReader(body), int64(len(body)))
	if errors.Is(err, mimepart.ErrTooManyParts) {
		return mimepart.NoTable
	}
	if err != nil {
		return nil
	}
	return t.Marshal()
}

// scannedTables bounds partTables: the tables of files written before
// tables were kept, scanned at their first fetch since the node started.
const scannedTables = 256

// partTables caches the tables scanned from files, by file.
type partTables struct {
	mu  sync.Mutex
	lru *simplelru.LRU
}

func (c *partTables) get(h bodyHash) (*mimepart.Table, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lru == nil {
		return nil, false
	}
	v, ok := c.lru.Get(h)
	if !ok {
		return nil, false
	}
	t, _ := v.(*mimepart.Table)
	return t, true
}

func (c *partTables) add(h bodyHash, t *mimepart.Table) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.lru == nil {
		c.lru, _ = simplelru.NewLRU(scannedTables, nil)
	}
	c.lru.Add(h, t)
}

// OpenParts opens a message's body with its part table when the body is
// kept as a file here; for a body kept in Pebble (small: read whole) or
// not here it returns a nil table and no reader.
func (m *Manager) OpenParts(user, id string) (BodyReader, *mimepart.Table, error) {
	v, closer, err := m.db.Get(bodyFileKey(user, id))
	if errors.Is(err, store.ErrNotFound) {
		if ok, err := hasIn(m.db, bodyKey(user, id)); err != nil || ok {
			return nil, nil, err
		}
		return nil, nil, fmt.Errorf("user %s message %s: %w", user, id, ErrNoMessage)
	}
	if err != nil {
		return nil, nil, err
	}
	h, size, enc, err := decodeBodyRefTable(v)
	var t *mimepart.Table
	noTable := false
	if err == nil && len(enc) > 0 {
		var uerr error
		t, uerr = mimepart.Unmarshal(enc) // one it cannot read is scanned again
		noTable = errors.Is(uerr, mimepart.ErrNoTable)
	}
	closer.Close()
	if err != nil {
		return nil, nil, fmt.Errorf("user %s message %s: body file reference: %w", user, id, err)
	}
	if noTable {
		return nil, nil, nil
	}
	f, err := m.files.open(h)
	if err != nil {
		return nil, nil, fileErr(user, id, err)
	}
	r := fileBody{f, size, &m.files.read}
	if t != nil && t.Size == size {
		return r, t, nil
	}
	if t, ok := m.files.tables.get(h); ok {
		if t == nil { // too many parts
			r.Close()
			return nil, nil, nil
		}
		return r, t, nil
	}
	if t, err = mimepart.Scan(r, size); errors.Is(err, mimepart.ErrTooManyParts) {
		m.files.tables.add(h, nil)
		r.Close()
		return nil, nil, nil
	}
	if err != nil {
		r.Close()
		return nil, nil, fmt.Errorf("user %s message %s: body file: %w", user, id, err)
	}
	m.files.tables.add(h, t)
	return r, t, nil
}

package cassandra

// Message bytes (bodies, queued messages): inline in their head row up to
// chunkSize, else in chunks of chunkSize, each chunk its own partition, so
// no cell or partition grows with the message. Written and read as streams.
//
// A blob is written chunks first and head last, and deleted head first, so
// a reader that finds a head finds its chunks (at the consistency levels
// configured) and a half-written or half-deleted blob is never served: its
// leftover chunks are garbage nobody reads. Blobs are immutable: a message
// id names one content, and writing it again writes the same bytes.

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/userdb"
)

// chunkSize is the largest cell: 1 MiB keeps a write far below Cassandra's
// largest mutation (half a 32 MiB commit log segment) and its native
// protocol frame (16 MiB), and most mail (a few KB) in one row.
const chunkSize = 1 << 20

// sourceError is an error of the reader a blob is written from (a client
// that hung up in the middle of a message, say): the caller's, never
// Retryable, whatever it wraps (io.ErrUnexpectedEOF looks like a broken
// connection to Cassandra otherwise).
type sourceError struct{ err error }

func (e sourceError) Error() string { return e.err.Error() }
func (e sourceError) Unwrap() error { return e.err }

// blobTables names a head table (size, chunks, data) and its chunk table,
// and the key columns they share before the chunk number.
type blobTables struct {
	what          string
	head, chunks  string
	key           string // "user = ? AND id = ?"
	cols, marks   string // "user, id", "?, ?"
	notFoundError error
}

var (
	bodyTables = blobTables{what: "message", head: "bodies", chunks: "body_chunks",
		key: "user = ? AND id = ?", cols: "user, id", marks: "?, ?", notFoundError: mailbox.ErrNoMessage}
	queueMessageTables = blobTables{what: "queued message", head: "queue_messages", chunks: "queue_message_chunks",
		key: "id = ?", cols: "id", marks: "?", notFoundError: queue.ErrNotFound}
)

// putBlob writes what r gives, chunk by chunk, and returns its size.
func (st *Store) putBlob(ctx context.Context, t blobTables, name string, key []any, r io.Reader) (int64, error) {
	br := bufio.NewReader(sourceReader{r})
	// next reads up to a chunk, and whether more follows.
	next := func() ([]byte, bool, error) {
		buf := make([]byte, chunkSize)
		n, err := io.ReadFull(br, buf)
		var src sourceError
		if errors.As(err, &src) {
			return nil, false, fmt.Errorf("%s %s: read: %w", t.what, name, err)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			return buf[:n], false, nil
		}
		if err != nil {
			return nil, false, fmt.Errorf("%s %s: read: %w", t.what, name, sourceError{err})
		}
		if _, err := br.Peek(1); err == io.EOF {
			return buf, false, nil
		} else if err != nil {
			return nil, false, fmt.Errorf("%s %s: read: %w", t.what, name, sourceError{err})
		}
		return buf, true, nil
	}
	data, more, err := next()
	if err != nil {
		return 0, err
	}
	if !more {
		args := append(append([]any{}, key...), int64(len(data)), 0, data)
		if err := st.write(ctx, `INSERT INTO `+t.head+` (`+t.cols+`, size, chunks, data) VALUES (`+t.marks+`, ?, ?, ?)`,
			args...).Exec(); err != nil {
			return 0, fmt.Errorf("%s %s: write: %w", t.what, name, err)
		}
		return int64(len(data)), nil
	}
	size, chunk := int64(0), 0
	for {
		args := append(append([]any{}, key...), chunk, data)
		if err := st.write(ctx, `INSERT INTO `+t.chunks+` (`+t.cols+`, chunk, data) VALUES (`+t.marks+`, ?, ?)`,
			args...).Exec(); err != nil {
			return 0, fmt.Errorf("%s %s: write chunk %d: %w", t.what, name, chunk, err)
		}
		size += int64(len(data))
		chunk++
		if !more {
			break
		}
		if data, more, err = next(); err != nil {
			return 0, err
		}
	}
	args := append(append([]any{}, key...), size, chunk)
	if err := st.write(ctx, `INSERT INTO `+t.head+` (`+t.cols+`, size, chunks) VALUES (`+t.marks+`, ?, ?)`,
		args...).Exec(); err != nil {
		return 0, fmt.Errorf("%s %s: write: %w", t.what, name, err)
	}
	return size, nil
}

// sourceReader marks every error of the message's source but its end as a
// sourceError, so io.ReadFull's io.ErrUnexpectedEOF (a short last chunk)
// is never confused with a source that itself failed with that error (a
// client cut off in the middle of a message): a truncated message is
// refused, not stored.
type sourceReader struct{ r io.Reader }

func (s sourceReader) Read(p []byte) (int, error) {
	n, err := s.r.Read(p)
	if err != nil && err != io.EOF {
		err = sourceError{err}
	}
	return n, err
}

// blobHead reads a blob's head row.
func (st *Store) blobHead(ctx context.Context, t blobTables, name string, key []any) (size int64, chunks int, data []byte, err error) {
	err = st.read(ctx, `SELECT size, chunks, data FROM `+t.head+` WHERE `+t.key, key...).Scan(&size, &chunks, &data)
	if notFound(err) {
		return 0, 0, nil, fmt.Errorf("%s %s: %w", t.what, name, t.notFoundError)
	}
	if err != nil {
		return 0, 0, nil, fmt.Errorf("%s %s: read: %w", t.what, name, err)
	}
	return size, chunks, data, nil
}

// openBlob returns a reader of a blob that reads one chunk at a time, and
// its size.
func (st *Store) openBlob(ctx context.Context, t blobTables, name string, key []any) (io.Reader, int64, error) {
	size, chunks, data, err := st.blobHead(ctx, t, name, key)
	if err != nil {
		return nil, 0, err
	}
	if chunks == 0 {
		if int64(len(data)) != size {
			return nil, 0, fmt.Errorf("%s %s: %d bytes stored, %d recorded", t.what, name, len(data), size)
		}
		return bytes.NewReader(data), size, nil
	}
	return &blobReader{st: st, ctx: ctx, t: t, name: name, key: key, chunks: chunks, size: size}, size, nil
}

// blobReader reads a chunked blob chunk by chunk.
type blobReader struct {
	st     *Store
	ctx    context.Context
	t      blobTables
	name   string
	key    []any
	chunks int
	next   int
	size   int64
	read   int64
	buf    []byte
}

func (r *blobReader) Read(p []byte) (int, error) {
	for len(r.buf) == 0 {
		if r.next == r.chunks {
			if r.read != r.size {
				return 0, fmt.Errorf("%s %s: %d bytes in its chunks, %d recorded", r.t.what, r.name, r.read, r.size)
			}
			return 0, io.EOF
		}
		args := append(append([]any{}, r.key...), r.next)
		var data []byte
		err := r.st.read(r.ctx, `SELECT data FROM `+r.t.chunks+` WHERE `+r.t.key+` AND chunk = ?`, args...).Scan(&data)
		if notFound(err) {
			return 0, fmt.Errorf("%s %s: chunk %d of %d missing", r.t.what, r.name, r.next, r.chunks)
		}
		if err != nil {
			return 0, fmt.Errorf("%s %s: read chunk %d: %w", r.t.what, r.name, r.next, err)
		}
		r.next++
		r.read += int64(len(data))
		r.buf = data
	}
	n := copy(p, r.buf)
	r.buf = r.buf[n:]
	return n, nil
}

// readBlob returns a whole blob.
func (st *Store) readBlob(ctx context.Context, t blobTables, name string, key []any) ([]byte, error) {
	r, size, err := st.openBlob(ctx, t, name, key)
	if err != nil {
		return nil, err
	}
	out := bytes.NewBuffer(make([]byte, 0, size))
	if _, err := io.Copy(out, r); err != nil {
		return nil, err
	}
	return out.Bytes(), nil
}

// deleteBlob removes a blob, head first. Deleting one that is not there is
// not an error.
func (st *Store) deleteBlob(ctx context.Context, t blobTables, name string, key []any) error {
	_, chunks, _, err := st.blobHead(ctx, t, name, key)
	if errors.Is(err, t.notFoundError) {
		return nil
	}
	if err != nil {
		return err
	}
	if err := st.write(ctx, `DELETE FROM `+t.head+` WHERE `+t.key, key...).Exec(); err != nil {
		return fmt.Errorf("%s %s: delete: %w", t.what, name, err)
	}
	for c := 0; c < chunks; c++ {
		args := append(append([]any{}, key...), c)
		if err := st.write(ctx, `DELETE FROM `+t.chunks+` WHERE `+t.key+` AND chunk = ?`, args...).Exec(); err != nil {
			return fmt.Errorf("%s %s: delete chunk %d: %w", t.what, name, c, err)
		}
	}
	return nil
}

func bodyName(user, id string) string { return id + " of " + user }

// PutBody writes a message's bytes, read from r, and returns their size.
func (st *Store) PutBody(ctx context.Context, user, id string, r io.Reader) (int64, error) {
	user = userdb.Normalize(user)
	if id == "" {
		return 0, fmt.Errorf("user %s: message without an id", user)
	}
	return st.putBlob(ctx, bodyTables, bodyName(user, id), []any{user, id}, r)
}

// OpenBody returns a reader of a message's bytes, which reads a chunk at a
// time, and their size; an error wraps mailbox.ErrNoMessage if there are
// none.
func (st *Store) OpenBody(ctx context.Context, user, id string) (io.Reader, int64, error) {
	user = userdb.Normalize(user)
	return st.openBlob(ctx, bodyTables, bodyName(user, id), []any{user, id})
}

// Body returns a message's bytes.
func (st *Store) Body(ctx context.Context, user, id string) ([]byte, error) {
	user = userdb.Normalize(user)
	return st.readBlob(ctx, bodyTables, bodyName(user, id), []any{user, id})
}

// DeleteBody removes a message's bytes.
func (st *Store) DeleteBody(ctx context.Context, user, id string) error {
	user = userdb.Normalize(user)
	return st.deleteBlob(ctx, bodyTables, bodyName(user, id), []any{user, id})
}

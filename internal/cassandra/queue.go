package cassandra

// The outbound queue (queue.Entry) and its messages, and the clusterwide
// objects (clusterwide.Object).

import (
	"context"
	"fmt"
	"hash/fnv"
	"io"
	"strings"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/clusterwide"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/replica"
)

// queueShards is how many partitions the queue's entries are spread over:
// a backlog of 100,000 entries is about 6,000 rows of a few hundred bytes
// per partition, and a listing reads this many partitions.
const queueShards = 16

func queueShard(id string) int16 {
	h := fnv.New32a()
	h.Write([]byte(id))
	return int16(h.Sum32() % queueShards)
}

// PutQueueEntry writes an entry's state at its stamp (a newer state
// replaces it, an older one changes nothing); a finished entry is a
// tombstone (Deleted) as in the native queue.
func (st *Store) PutQueueEntry(ctx context.Context, e *queue.Entry) error {
	if err := queue.ValidID(e.ID); err != nil {
		return err
	}
	ts, err := stamped("queue entry "+e.ID, uint64(e.Stamp.Clock))
	if err != nil {
		return err
	}
	data, err := queue.Marshal(e)
	if err != nil {
		return fmt.Errorf("queue entry %s: encode: %w", e.ID, err)
	}
	if err := st.write(ctx, `INSERT INTO queue (shard, id, version, deleted, entry) VALUES (?, ?, ?, ?, ?) USING TIMESTAMP ?`,
		queueShard(e.ID), e.ID, ts, e.Deleted, data, ts).Exec(); err != nil {
		return fmt.Errorf("queue entry %s: write: %w", e.ID, err)
	}
	return nil
}

// QueueEntry returns an entry (a tombstone too), or an error wrapping
// queue.ErrNotFound.
func (st *Store) QueueEntry(ctx context.Context, id string) (*queue.Entry, error) {
	var data []byte
	err := st.read(ctx, `SELECT entry FROM queue WHERE shard = ? AND id = ?`, queueShard(id), id).Scan(&data)
	if notFound(err) {
		return nil, fmt.Errorf("queue entry %s: %w", id, queue.ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("queue entry %s: read: %w", id, err)
	}
	e, err := queue.Unmarshal(data)
	if err != nil {
		return nil, fmt.Errorf("queue entry %s: corrupt: %w", id, err)
	}
	return e, nil
}

// QueueEntries calls fn for every entry, tombstones included, shard by
// shard.
func (st *Store) QueueEntries(ctx context.Context, fn func(*queue.Entry) error) error {
	for sh := int16(0); sh < queueShards; sh++ {
		it := st.read(ctx, `SELECT id, entry FROM queue WHERE shard = ?`, sh).Iter()
		var id string
		var data []byte
		for it.Scan(&id, &data) {
			e, err := queue.Unmarshal(data)
			if err != nil {
				it.Close()
				return fmt.Errorf("queue entry %s: corrupt: %w", id, err)
			}
			if err := fn(e); err != nil {
				it.Close()
				return err
			}
		}
		if err := it.Close(); err != nil {
			return fmt.Errorf("queue: list: %w", err)
		}
	}
	return nil
}

// DeleteQueueEntry removes an entry for good (sweeping a tombstone) and
// its message: writes stamped before stamp are gone.
func (st *Store) DeleteQueueEntry(ctx context.Context, id string, stamp replica.Stamp) error {
	ts, err := stamped("queue entry "+id, uint64(stamp.Clock))
	if err != nil {
		return err
	}
	if err := st.write(ctx, `DELETE FROM queue USING TIMESTAMP ? WHERE shard = ? AND id = ?`, ts, queueShard(id), id).Exec(); err != nil {
		return fmt.Errorf("queue entry %s: delete: %w", id, err)
	}
	return st.deleteBlob(ctx, queueMessageTables, id, []any{id})
}

// PutQueueMessage writes the message of a queue entry, read from r, and
// returns its size.
func (st *Store) PutQueueMessage(ctx context.Context, id string, r io.Reader) (int64, error) {
	if err := queue.ValidID(id); err != nil {
		return 0, err
	}
	return st.putBlob(ctx, queueMessageTables, id, []any{id}, r)
}

// QueueMessage returns the message of a queue entry.
func (st *Store) QueueMessage(ctx context.Context, id string) ([]byte, error) {
	return st.readBlob(ctx, queueMessageTables, id, []any{id})
}

// DeleteQueueMessage removes the message of a finished queue entry (its
// tombstone stays until swept).
func (st *Store) DeleteQueueMessage(ctx context.Context, id string) error {
	return st.deleteBlob(ctx, queueMessageTables, id, []any{id})
}

// PutObject writes a clusterwide object at its stamp: the newest stamp
// wins, a deleted object is a tombstone (Deleted), as clusterwide's
// replicas keep them.
func (st *Store) PutObject(ctx context.Context, o clusterwide.Object) error {
	if err := clusterwide.ValidName(o.Name); err != nil {
		return err
	}
	ts, err := stamped("clusterwide object "+o.Name, uint64(o.Stamp.Clock))
	if err != nil {
		return err
	}
	kind, name, _ := strings.Cut(o.Name, "/")
	if err := st.write(ctx, `INSERT INTO clusterwide (kind, name, version, origin, deleted, data) VALUES (?, ?, ?, ?, ?, ?)
		USING TIMESTAMP ?`, kind, name, ts, string(o.Stamp.Node), o.Deleted, o.Data, ts).Exec(); err != nil {
		return fmt.Errorf("clusterwide object %s: write: %w", o.Name, err)
	}
	return nil
}

// Object returns a clusterwide object ("kind/name"), a tombstone too; ok is
// false if there is none.
func (st *Store) Object(ctx context.Context, fullName string) (o clusterwide.Object, ok bool, err error) {
	kind, name, _ := strings.Cut(fullName, "/")
	it := st.read(ctx, `SELECT name, version, origin, deleted, data FROM clusterwide WHERE kind = ? AND name = ?`, kind, name).Iter()
	ok = scanObject(it, kind, &o)
	if err := it.Close(); err != nil {
		return clusterwide.Object{}, false, fmt.Errorf("clusterwide object %s: read: %w", fullName, err)
	}
	return o, ok, nil
}

func scanObject(sc interface{ Scan(...any) bool }, kind string, o *clusterwide.Object) bool {
	var name, origin string
	var version int64
	if !sc.Scan(&name, &version, &origin, &o.Deleted, &o.Data) {
		return false
	}
	o.Name = kind + "/" + name
	o.Stamp = replica.Stamp{Clock: hlc.Timestamp(version), Node: cluster.NodeID(origin)}
	return true
}

// Objects returns the clusterwide objects of one kind ("tls", "dkim",
// "domain", "alias", ...), tombstones included, by name.
func (st *Store) Objects(ctx context.Context, kind string) ([]clusterwide.Object, error) {
	it := st.read(ctx, `SELECT name, version, origin, deleted, data FROM clusterwide WHERE kind = ?`, kind).Iter()
	var out []clusterwide.Object
	for {
		var o clusterwide.Object
		if !scanObject(it, kind, &o) {
			break
		}
		out = append(out, o)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("clusterwide objects %s/: read: %w", kind, err)
	}
	return out, nil
}

// ObjectKinds lists the kinds that have objects.
func (st *Store) ObjectKinds(ctx context.Context) ([]string, error) {
	it := st.read(ctx, `SELECT DISTINCT kind FROM clusterwide`).Iter()
	var out []string
	var k string
	for it.Scan(&k) {
		out = append(out, k)
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("clusterwide objects: list kinds: %w", err)
	}
	return out, nil
}

// DeleteObject removes a clusterwide object for good (sweeping a
// tombstone): writes stamped before stamp are gone.
func (st *Store) DeleteObject(ctx context.Context, fullName string, stamp replica.Stamp) error {
	ts, err := stamped("clusterwide object "+fullName, uint64(stamp.Clock))
	if err != nil {
		return err
	}
	kind, name, _ := strings.Cut(fullName, "/")
	if err := st.write(ctx, `DELETE FROM clusterwide USING TIMESTAMP ? WHERE kind = ? AND name = ?`, ts, kind, name).Exec(); err != nil {
		return fmt.Errorf("clusterwide object %s: delete: %w", fullName, err)
	}
	return nil
}

// The queue's storage on Cassandra (queue.Shared) is over these
// operations.
var _ queue.SharedStore = (*Store)(nil)

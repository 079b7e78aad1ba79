package storemigrate

// Apache Cassandra: read and written through internal/cassandra's typed
// operations only, so the layout is the store's business.

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"sort"
	"strings"
	"sync"

	"github.com/quillmail/quill/internal/cassandra"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

// Cassandra is a keyspace read or written by a migration.
type Cassandra struct {
	St  *cassandra.Store
	URL string
}

// Name is the URL it was opened with.
func (c *Cassandra) Name() string { return c.URL }

// Close ends the session.
func (c *Cassandra) Close() error { c.St.Close(); return nil }

// Snapshot reads every profile (bucket by bucket), each live user's
// mailboxes, fences and message index, the queue and the clusterwide
// objects.
func (c *Cassandra) Snapshot(ctx context.Context) (*Snapshot, error) {
	snap := &Snapshot{}
	err := c.St.AllProfiles(ctx, func(p *userdb.Profile) error {
		snap.Users = append(snap.Users, &User{Profile: p})
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(snap.Users, func(i, j int) bool { return snap.Users[i].Profile.Address < snap.Users[j].Profile.Address })
	for _, u := range snap.Users {
		if u.Profile.Deleted {
			continue
		}
		boxes, err := c.St.Mailboxes(ctx, u.Profile.Address)
		if err != nil {
			return nil, err
		}
		for _, mb := range boxes {
			f, err := c.St.Reservations(ctx, u.Profile.Address, mb.UIDValidity)
			if err != nil {
				return nil, err
			}
			msgs, err := c.St.AllMessages(ctx, u.Profile.Address, mb.UIDValidity)
			if err != nil {
				return nil, err
			}
			// A mailbox's record keeps UIDNEXT and HIGHESTMODSEQ as they
			// were when no message carried them (a copy, an expunge); a
			// message stored since carries its own (as a writer's view
			// reads them: cassandra.WriterStorage.Load).
			for _, m := range msgs {
				mb.UIDNext, mb.HighestModSeq = max(mb.UIDNext, m.UID+1), max(mb.HighestModSeq, m.ModSeq)
			}
			u.Boxes = append(u.Boxes, &Box{Mailbox: mb, Messages: msgs, Reserved: Ends{UID: f.UIDReserved, ModSeq: f.ModSeqReserved}})
		}
	}
	err = c.St.QueueEntries(ctx, func(e *queue.Entry) error {
		snap.Queue = append(snap.Queue, e)
		return nil
	})
	if err != nil {
		return nil, err
	}
	sort.Slice(snap.Queue, func(i, j int) bool { return snap.Queue[i].ID < snap.Queue[j].ID })
	kinds, err := c.St.ObjectKinds(ctx)
	if err != nil {
		return nil, err
	}
	for _, k := range kinds {
		os, err := c.St.Objects(ctx, k)
		if err != nil {
			return nil, err
		}
		snap.Objects = append(snap.Objects, os...)
	}
	sort.Slice(snap.Objects, func(i, j int) bool { return snap.Objects[i].Name < snap.Objects[j].Name })
	return snap, nil
}

// Body reads a message's bytes.
func (c *Cassandra) Body(ctx context.Context, user, id string) ([]byte, error) {
	return c.St.Body(ctx, user, id)
}

// QueueMessage reads a queue entry's message.
func (c *Cassandra) QueueMessage(ctx context.Context, id string) ([]byte, error) {
	return c.St.QueueMessage(ctx, id)
}

// Owner is the fence owner a migration claims a mailbox's reservations
// as, when it must move their ends.
const Owner = "quill-migrate"

// Workers is how many messages a copy into Cassandra writes at once: each
// is two round trips (body, index record) at the write consistency level,
// so one at a time leaves the cluster idle between them.
const Workers = 16

// CopyToCassandra writes snap, read from src, into Cassandra: profiles
// (tombstones too), then per mailbox its record, its fence (moved only if
// it does not already reach past everything copied), each message's body
// (unless a body of that size is there) and index record at its stamp,
// and a delete at the tombstone's stamp of each message expunged since a
// node listed it; then the queue and the clusterwide objects. Every
// stamped write is USING TIMESTAMP its stamp, so copying again changes
// nothing.
func CopyToCassandra(ctx context.Context, src Source, snap *Snapshot, dst *Cassandra, p Progress) (Summary, error) {
	var sum Summary
	st := dst.St
	lp := &lockedProgress{p: p}
	for _, u := range snap.Users {
		user := u.Profile.Address
		if err := st.PutProfile(ctx, u.Profile); err != nil {
			return sum, err
		}
		if err := prune(ctx, st, u); err != nil {
			return sum, err
		}
		if u.Profile.Deleted {
			sum.Deleted++
			continue
		}
		sum.Users++
		for _, b := range u.Boxes {
			sum.Mailboxes++
			lp.Folder(user+" "+b.Mailbox.Name, len(b.Messages))
			if err := st.PutMailbox(ctx, user, &b.Mailbox); err != nil {
				return sum, err
			}
			if err := fence(ctx, st, user, b); err != nil {
				return sum, err
			}
			n, err := copyMessages(ctx, src, st, user, b, lp)
			sum.Messages += len(b.Messages)
			sum.Bytes += n
			if err != nil {
				return sum, err
			}
			for _, m := range b.Expunged {
				if err := st.DeleteMessage(ctx, user, b.Mailbox.UIDValidity, m.UID, m.Version); err != nil {
					return sum, err
				}
				sum.Expunged++
			}
		}
	}
	for _, e := range snap.Queue {
		if !e.Deleted {
			body, err := src.QueueMessage(ctx, e.ID)
			if err != nil {
				return sum, fmt.Errorf("queue entry %s: %w", e.ID, err)
			}
			if _, err := st.PutQueueMessage(ctx, e.ID, bytes.NewReader(body)); err != nil {
				return sum, err
			}
		}
		if err := st.PutQueueEntry(ctx, e); err != nil {
			return sum, err
		}
		sum.Queue++
	}
	for _, o := range snap.Objects {
		if err := st.PutObject(ctx, o); err != nil {
			return sum, err
		}
		sum.Objects++
	}
	return sum, nil
}

// prune removes from Cassandra the mailboxes of a user that the source no
// longer has (deleted since an earlier copy, or the user deleted): their
// records, index and fence (cassandra.Store.DeleteMailbox, at the
// profile's stamp: the delete came after every message in them), and the
// bodies of their messages that no mailbox copied keeps.
func prune(ctx context.Context, st *cassandra.Store, u *User) error {
	user := u.Profile.Address
	rows, err := st.Mailboxes(ctx, user)
	if err != nil {
		return err
	}
	keep := map[uint32]bool{}
	ids := map[string]bool{}
	for _, b := range u.Boxes {
		keep[b.Mailbox.UIDValidity] = true
		for _, m := range b.Messages {
			ids[m.ID] = true
		}
	}
	at := replica.Stamp{Clock: u.Profile.Version}
	for _, row := range rows {
		if keep[row.UIDValidity] {
			continue
		}
		msgs, err := st.AllMessages(ctx, user, row.UIDValidity)
		if err != nil {
			return err
		}
		if err := st.DeleteMailbox(ctx, user, row.UIDValidity, at); err != nil {
			return err
		}
		for _, m := range msgs {
			if !ids[m.ID] {
				if err := st.DeleteBody(ctx, user, m.ID); err != nil {
					return err
				}
			}
		}
	}
	return nil
}

// fence moves a mailbox's reserved ends in Cassandra past everything
// copied (FenceEnds), claiming the reservations as Owner; ends that reach
// far enough already are left alone, so a rerun claims nothing.
func fence(ctx context.Context, st *cassandra.Store, user string, b *Box) error {
	v := b.Mailbox.UIDValidity
	cur, err := st.Reservations(ctx, user, v)
	if err != nil {
		return err
	}
	have := Ends{UID: cur.UIDReserved, ModSeq: cur.ModSeqReserved}
	want := FenceEnds(b.Mailbox, b.Messages, []Ends{b.Reserved, have})
	if cur.Epoch > 0 && have.Covers(want) {
		return nil
	}
	f, err := st.Claim(ctx, user, v, Owner)
	if err != nil {
		return err
	}
	// The claim read the ends again: never move them back.
	want = FenceEnds(b.Mailbox, nil, []Ends{want, {UID: f.UIDReserved, ModSeq: f.ModSeqReserved}})
	_, err = st.Reserve(ctx, f, want.UID, want.ModSeq)
	return err
}

// copyMessages writes a mailbox's bodies and index records, Workers at a
// time; it returns the bytes copied.
func copyMessages(ctx context.Context, src Source, st *cassandra.Store, user string, b *Box, p Progress) (int64, error) {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	work := make(chan *mailbox.Message)
	var (
		mu    sync.Mutex
		first error
		total int64
		wg    sync.WaitGroup
	)
	fail := func(err error) {
		mu.Lock()
		if first == nil {
			first = err
			cancel()
		}
		mu.Unlock()
	}
	for range Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for m := range work {
				n, err := copyMessage(ctx, src, st, user, b.Mailbox.UIDValidity, m)
				if err != nil {
					fail(fmt.Errorf("user %s mailbox %q uid %d: %w", user, b.Mailbox.Name, m.UID, err))
					continue
				}
				mu.Lock()
				total += n
				mu.Unlock()
				p.Message(n)
			}
		}()
	}
	for i := range b.Messages {
		select {
		case work <- &b.Messages[i]:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
	}
	close(work)
	wg.Wait()
	if first == nil && ctx.Err() != nil {
		first = ctx.Err()
	}
	return total, first
}

// copyMessage writes one message's body, unless one of its size is there
// (a body never changes under its id), then its index record.
func copyMessage(ctx context.Context, src Source, st *cassandra.Store, user string, v uint32, m *mailbox.Message) (int64, error) {
	_, size, err := st.OpenBody(ctx, user, m.ID)
	switch {
	case err == nil && size == m.Size:
	case err == nil || errors.Is(err, mailbox.ErrNoMessage):
		body, err := src.Body(ctx, user, m.ID)
		if err != nil {
			return 0, err
		}
		if _, err := st.PutBody(ctx, user, m.ID, bytes.NewReader(body)); err != nil {
			return 0, err
		}
	default:
		return 0, err
	}
	return m.Size, st.PutMessage(ctx, user, v, m)
}

// ParseURL reads a Cassandra URL of quill migrate:
// cassandra://HOST[:PORT][,HOST[:PORT]...]/KEYSPACE[?rf=3&write=QUORUM&read=QUORUM].
// The keyspace defaults to cassandra.DefaultKeyspace; rf is
// cassandra.ParseReplication's form (3, or dc1:3,dc2:2).
func ParseURL(s string) (cassandra.Config, error) {
	var cfg cassandra.Config
	rest, ok := strings.CutPrefix(s, "cassandra://")
	if !ok {
		return cfg, fmt.Errorf("%q: want cassandra://HOST[:PORT][,HOST...]/KEYSPACE", s)
	}
	rest, query, _ := strings.Cut(rest, "?")
	hosts, ks, _ := strings.Cut(rest, "/")
	for _, h := range strings.Split(hosts, ",") {
		if h = strings.TrimSpace(h); h != "" {
			if strings.ContainsAny(h, "@/ ") {
				return cfg, fmt.Errorf("%q: host %q: want HOST or HOST:PORT", s, h)
			}
			cfg.Hosts = append(cfg.Hosts, h)
		}
	}
	if len(cfg.Hosts) == 0 {
		return cfg, fmt.Errorf("%q: no Cassandra host", s)
	}
	cfg.Keyspace = strings.TrimSuffix(ks, "/")
	if strings.Contains(cfg.Keyspace, "/") {
		return cfg, fmt.Errorf("%q: keyspace %q: one name, no slashes", s, cfg.Keyspace)
	}
	for _, kv := range strings.Split(query, "&") {
		if kv == "" {
			continue
		}
		k, v, _ := strings.Cut(kv, "=")
		var err error
		switch strings.ToLower(k) {
		case "rf":
			cfg.Replication, err = cassandra.ParseReplication(v)
		case "read":
			cfg.Read, err = cassandra.ParseConsistency(v)
		case "write":
			cfg.Write, err = cassandra.ParseConsistency(v)
		default:
			err = fmt.Errorf("unknown parameter %q: want rf, read or write", k)
		}
		if err != nil {
			return cfg, fmt.Errorf("%q: %w", s, err)
		}
	}
	return cfg, nil
}

// IsURL says whether a --from or --to names Cassandra.
func IsURL(s string) bool { return strings.HasPrefix(s, "cassandra://") }

// OpenCassandra connects (making the keyspace and its tables if missing,
// as every Quill node does).
func OpenCassandra(ctx context.Context, url string) (*Cassandra, error) {
	cfg, err := ParseURL(url)
	if err != nil {
		return nil, err
	}
	st, err := cassandra.Open(ctx, cfg)
	if err != nil {
		return nil, err
	}
	return &Cassandra{St: st, URL: url}, nil
}

package cassandra

// Mailbox records (mailbox.Mailbox) and the message index (mailbox.Message).
// A mailbox is named by its UIDVALIDITY below the writer, as in the native
// fragments: it never changes while the mailbox lives, renames keep it.

import (
	"context"
	"fmt"
	"math"
	"slices"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

// uidBlockBits cuts a mailbox's index into partitions of 2^16 UIDs: at a
// few hundred bytes a record, a partition stays within tens of MB however
// many messages the mailbox has (Cassandra's guidance is below 100 MB), and
// a mailbox of 100,000 messages is two partitions.
const uidBlockBits = 16

func uidBlock(uid uint32) int64 { return int64(uid >> uidBlockBits) }

// PutMailbox writes a mailbox record (made or changed: renamed,
// subscribed, its counters moved).
func (st *Store) PutMailbox(ctx context.Context, user string, mb *mailbox.Mailbox) error {
	user = userdb.Normalize(user)
	if mb.UIDValidity == 0 {
		return fmt.Errorf("user %s mailbox %q: UIDVALIDITY 0", user, mb.Name)
	}
	if err := mailbox.ValidateName(mb.Name); err != nil {
		return fmt.Errorf("user %s: %w", user, err)
	}
	if err := st.write(ctx, `INSERT INTO mailboxes (user, uidvalidity, id, name, uidnext, highestmodseq, subscribed, special_use, created)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?)`, user, int64(mb.UIDValidity), int64(mb.ID), mailbox.NormName(mb.Name),
		int64(mb.UIDNext), int64(mb.HighestModSeq), mb.Subscribed, mb.SpecialUse, mb.Created).Exec(); err != nil {
		return fmt.Errorf("user %s mailbox %q: write: %w", user, mb.Name, err)
	}
	return nil
}

const mailboxColumns = `uidvalidity, id, name, uidnext, highestmodseq, subscribed, special_use, created`

func scanMailbox(sc interface{ Scan(...any) bool }, mb *mailbox.Mailbox) bool {
	var v, id, next, hms int64
	ok := sc.Scan(&v, &id, &mb.Name, &next, &hms, &mb.Subscribed, &mb.SpecialUse, &mb.Created)
	mb.UIDValidity, mb.ID, mb.UIDNext, mb.HighestModSeq = uint32(v), uint64(id), uint32(next), uint64(hms)
	return ok
}

// Mailboxes returns a user's mailbox records, by UIDVALIDITY.
func (st *Store) Mailboxes(ctx context.Context, user string) ([]mailbox.Mailbox, error) {
	user = userdb.Normalize(user)
	it := st.read(ctx, `SELECT `+mailboxColumns+` FROM mailboxes WHERE user = ?`, user).Iter()
	var out []mailbox.Mailbox
	var mb mailbox.Mailbox
	for scanMailbox(it, &mb) {
		out = append(out, mb)
		mb = mailbox.Mailbox{}
	}
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("user %s: read mailboxes: %w", user, err)
	}
	return out, nil
}

// Mailbox returns the record of the mailbox with UIDVALIDITY v.
func (st *Store) Mailbox(ctx context.Context, user string, v uint32) (*mailbox.Mailbox, error) {
	user = userdb.Normalize(user)
	it := st.read(ctx, `SELECT `+mailboxColumns+` FROM mailboxes WHERE user = ? AND uidvalidity = ?`, user, int64(v)).Iter()
	var mb mailbox.Mailbox
	found := scanMailbox(it, &mb)
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("user %s mailbox %d: read: %w", user, v, err)
	}
	if !found {
		return nil, fmt.Errorf("user %s mailbox %d: %w", user, v, mailbox.ErrNoMailbox)
	}
	return &mb, nil
}

// MailboxByName returns the record of a mailbox by name (INBOX in any
// case): the user's few records are read and matched, as names are not a
// key (a rename must not move the mailbox).
func (st *Store) MailboxByName(ctx context.Context, user, name string) (*mailbox.Mailbox, error) {
	all, err := st.Mailboxes(ctx, user)
	if err != nil {
		return nil, err
	}
	name = mailbox.NormName(name)
	for i := range all {
		if all[i].Name == name {
			return &all[i], nil
		}
	}
	return nil, fmt.Errorf("user %s mailbox %q: %w", userdb.Normalize(user), name, mailbox.ErrNoMailbox)
}

// DeleteMailbox removes a mailbox record, its message index (every record
// stamped before stamp) and its reservations. The bodies stay: a message id
// may be listed in other mailboxes too, so the caller, which knows, deletes
// them (DeleteBody).
func (st *Store) DeleteMailbox(ctx context.Context, user string, v uint32, stamp replica.Stamp) error {
	user = userdb.Normalize(user)
	ts, err := stamped(fmt.Sprintf("user %s mailbox %d", user, v), uint64(stamp.Clock))
	if err != nil {
		return err
	}
	end, err := st.reservedEnd(ctx, user, v)
	if err != nil {
		return err
	}
	last := uint32(0)
	if end > 0 {
		last = end - 1
	}
	for blk := int64(0); blk <= uidBlock(last); blk++ {
		if err := st.write(ctx, `DELETE FROM messages USING TIMESTAMP ? WHERE user = ? AND uidvalidity = ? AND uid_block = ?`,
			ts, user, int64(v), blk).Exec(); err != nil {
			return fmt.Errorf("user %s mailbox %d: delete index: %w", user, v, err)
		}
	}
	if err := st.write(ctx, `DELETE FROM mailboxes WHERE user = ? AND uidvalidity = ?`, user, int64(v)).Exec(); err != nil {
		return fmt.Errorf("user %s mailbox %d: delete: %w", user, v, err)
	}
	if _, err := st.cas(ctx, `DELETE FROM reservations WHERE user = ? AND uidvalidity = ? IF EXISTS`, user, int64(v)).
		MapScanCASContext(ctx, map[string]any{}); err != nil {
		return fmt.Errorf("user %s mailbox %d: delete reservations: %w", user, v, err)
	}
	return nil
}

// PutMessage writes a message's index record under its UID, at the
// record's stamp (msg.Version): a newer version of the record replaces it,
// an older one changes nothing. Replicas and Want are the native store's
// placement and are not kept: Cassandra places and replicates.
func (st *Store) PutMessage(ctx context.Context, user string, v uint32, msg *mailbox.Message) error {
	user = userdb.Normalize(user)
	what := fmt.Sprintf("user %s mailbox %d uid %d", user, v, msg.UID)
	ts, err := stamped(what, uint64(msg.Version.Clock))
	if err != nil {
		return err
	}
	if msg.UID == 0 || msg.ID == "" {
		return fmt.Errorf("%s: needs a UID and a message id", what)
	}
	if err := st.write(ctx, `INSERT INTO messages (user, uidvalidity, uid_block, uid, id, size, internal_date, flags, modseq, stamp, stamp_node)
		VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?) USING TIMESTAMP ?`,
		user, int64(v), uidBlock(msg.UID), int64(msg.UID), msg.ID, msg.Size, msg.Date, cloneStrings(msg.Flags),
		int64(msg.ModSeq), ts, string(msg.Version.Node), ts).Exec(); err != nil {
		return fmt.Errorf("%s: write: %w", what, err)
	}
	return nil
}

// UpdateFlags sets a message's flags and MODSEQ at a new stamp (the
// writer's decision of a STORE). A stamp older than the record's changes
// nothing; one on an expunged record (older than the delete) neither.
func (st *Store) UpdateFlags(ctx context.Context, user string, v, uid uint32, flags []string, modseq uint64, stamp replica.Stamp) error {
	user = userdb.Normalize(user)
	what := fmt.Sprintf("user %s mailbox %d uid %d", user, v, uid)
	ts, err := stamped(what, uint64(stamp.Clock))
	if err != nil {
		return err
	}
	if err := st.write(ctx, `UPDATE messages USING TIMESTAMP ? SET flags = ?, modseq = ?, stamp = ?, stamp_node = ?
		WHERE user = ? AND uidvalidity = ? AND uid_block = ? AND uid = ?`,
		ts, cloneStrings(flags), int64(modseq), ts, string(stamp.Node), user, int64(v), uidBlock(uid), int64(uid)).Exec(); err != nil {
		return fmt.Errorf("%s: store flags: %w", what, err)
	}
	return nil
}

// DeleteMessage removes a message's index record (an expunge) at a stamp:
// versions stamped before it are gone even if they arrive later.
func (st *Store) DeleteMessage(ctx context.Context, user string, v, uid uint32, stamp replica.Stamp) error {
	user = userdb.Normalize(user)
	what := fmt.Sprintf("user %s mailbox %d uid %d", user, v, uid)
	ts, err := stamped(what, uint64(stamp.Clock))
	if err != nil {
		return err
	}
	if err := st.write(ctx, `DELETE FROM messages USING TIMESTAMP ? WHERE user = ? AND uidvalidity = ? AND uid_block = ? AND uid = ?`,
		ts, user, int64(v), uidBlock(uid), int64(uid)).Exec(); err != nil {
		return fmt.Errorf("%s: delete: %w", what, err)
	}
	return nil
}

const messageColumns = `uid, id, size, internal_date, flags, modseq, stamp, stamp_node`

// scanMessage reads one row; ok is false at the end. A row without a
// message id (only a flag update stamped after the record was deleted
// reached it) is no message: skip is true.
func scanMessage(it *gocql.Iter, m *mailbox.Message) (ok, skip bool) {
	var uid, modseq, stamp int64
	var id, node string
	var date time.Time
	if !it.Scan(&uid, &id, &m.Size, &date, &m.Flags, &modseq, &stamp, &node) {
		return false, false
	}
	m.UID, m.ID, m.Date, m.ModSeq = uint32(uid), id, date, uint64(modseq)
	m.Version = replica.Stamp{Clock: hlc.Timestamp(stamp), Node: cluster.NodeID(node)}
	return true, id == ""
}

// Message returns the index record of one message, or an error wrapping
// mailbox.ErrNoMessage.
func (st *Store) Message(ctx context.Context, user string, v, uid uint32) (*mailbox.Message, error) {
	user = userdb.Normalize(user)
	it := st.read(ctx, `SELECT `+messageColumns+` FROM messages WHERE user = ? AND uidvalidity = ? AND uid_block = ? AND uid = ?`,
		user, int64(v), uidBlock(uid), int64(uid)).Iter()
	var m mailbox.Message
	ok, skip := scanMessage(it, &m)
	if err := it.Close(); err != nil {
		return nil, fmt.Errorf("user %s mailbox %d uid %d: read: %w", user, v, uid, err)
	}
	if !ok || skip {
		return nil, fmt.Errorf("user %s mailbox %d uid %d: %w", user, v, uid, mailbox.ErrNoMessage)
	}
	return &m, nil
}

// Messages calls fn for the index records with lo <= UID <= hi, in UID
// order, partition by partition. hi is capped at the mailbox's reserved UID
// end: no UID at or past it was ever handed out (fence.go).
func (st *Store) Messages(ctx context.Context, user string, v uint32, lo, hi uint32, fn func(*mailbox.Message) error) error {
	user = userdb.Normalize(user)
	end, err := st.reservedEnd(ctx, user, v)
	if err != nil {
		return err
	}
	if end == 0 {
		return nil
	}
	hi = min(hi, end-1)
	for blk := uidBlock(lo); blk <= uidBlock(hi) && lo <= hi; blk++ {
		it := st.read(ctx, `SELECT `+messageColumns+` FROM messages
			WHERE user = ? AND uidvalidity = ? AND uid_block = ? AND uid >= ? AND uid <= ?`,
			user, int64(v), blk, int64(lo), int64(hi)).Iter()
		for {
			var m mailbox.Message
			ok, skip := scanMessage(it, &m)
			if !ok {
				break
			}
			if skip {
				continue
			}
			if err := fn(&m); err != nil {
				it.Close()
				return err
			}
		}
		if err := it.Close(); err != nil {
			return fmt.Errorf("user %s mailbox %d: read index: %w", user, v, err)
		}
	}
	return nil
}

// AllMessages returns a mailbox's whole index in UID order.
func (st *Store) AllMessages(ctx context.Context, user string, v uint32) ([]mailbox.Message, error) {
	var out []mailbox.Message
	err := st.Messages(ctx, user, v, 1, math.MaxUint32, func(m *mailbox.Message) error {
		c := *m
		c.Flags = slices.Clone(m.Flags)
		out = append(out, c)
		return nil
	})
	return out, err
}

// NameMailbox writes a mailbox's name, subscription and special use (a
// rename, a SUBSCRIBE), leaving its counters and creation as they are.
func (st *Store) NameMailbox(ctx context.Context, user string, mb *mailbox.Mailbox) error {
	user = userdb.Normalize(user)
	if err := mailbox.ValidateName(mb.Name); err != nil {
		return fmt.Errorf("user %s: %w", user, err)
	}
	if err := st.write(ctx, `UPDATE mailboxes SET id = ?, name = ?, subscribed = ?, special_use = ? WHERE user = ? AND uidvalidity = ?`,
		int64(mb.ID), mailbox.NormName(mb.Name), mb.Subscribed, mb.SpecialUse, user, int64(mb.UIDValidity)).Exec(); err != nil {
		return fmt.Errorf("user %s mailbox %q: write: %w", user, mb.Name, err)
	}
	return nil
}

// SetMailboxCounters writes a mailbox's UIDNEXT and HIGHESTMODSEQ (its
// writer's, after an expunge or a move out left no message carrying them).
func (st *Store) SetMailboxCounters(ctx context.Context, user string, v uint32, uidNext uint32, modseq uint64) error {
	user = userdb.Normalize(user)
	if err := st.write(ctx, `UPDATE mailboxes SET uidnext = ?, highestmodseq = ? WHERE user = ? AND uidvalidity = ?`,
		int64(uidNext), int64(modseq), user, int64(v)).Exec(); err != nil {
		return fmt.Errorf("user %s mailbox %d: write counters: %w", user, v, err)
	}
	return nil
}

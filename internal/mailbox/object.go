package mailbox

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
)

// Messages as replicated objects (Porcupine §4.1: the unit of replication is
// a mail message, named ⟨type, user, message id⟩, updated totally). The
// object's content is where the message is in the cluster mailbox (its
// mailbox's UIDVALIDITY, UID and MODSEQ, as the writer decided), its flags
// and its replica set; its bytes travel as the update's blob. A flag change,
// a move, an expunge and a new replica set are each a new version of the
// whole object, applied on a replica only if its stamp is newer than the
// stamp the replica holds. An expunged message leaves a tombstone with its
// stamp, so an older update that arrives late cannot bring it back.

// ObjectKind is the replication manager's name for message objects.
const ObjectKind = "m"

// Object is a message's replicated content.
type Object struct {
	User        string           `json:"user"`
	ID          string           `json:"id"`
	Mailbox     string           `json:"mailbox,omitempty"`
	UIDValidity uint32           `json:"uidvalidity,omitempty"`
	UID         uint32           `json:"uid,omitempty"`
	ModSeq      uint64           `json:"modseq,omitempty"`
	Flags       []string         `json:"flags,omitempty"`
	Size        int64            `json:"size,omitempty"`
	Date        time.Time        `json:"date,omitzero"`
	Replicas    []cluster.NodeID `json:"replicas"`
	Want        int              `json:"want,omitempty"`
	Deleted     bool             `json:"deleted,omitempty"`
	// BodyFrom names another message of the user whose bytes this one
	// shares (an IMAP COPY): a replica that holds it copies them locally.
	BodyFrom string `json:"body_from,omitempty"`
}

// ObjectName names a message object for the replication manager.
func ObjectName(user, id string) string { return ObjectKind + "/" + id + "/" + user }

// ParseObjectName splits an object name into user and message id.
func ParseObjectName(name string) (user, id string, ok bool) {
	rest, ok := strings.CutPrefix(name, ObjectKind+"/")
	if !ok {
		return "", "", false
	}
	id, user, ok = strings.Cut(rest, "/")
	return user, id, ok && user != "" && id != ""
}

// Update returns the replication update that makes o the message's content.
func (o *Object) Update(stamp replica.Stamp, targets []cluster.NodeID, body []byte) (*replica.Update, error) {
	data, err := encodeObject(o)
	if err != nil {
		return nil, err
	}
	return &replica.Update{Object: ObjectName(o.User, o.ID), Stamp: stamp, Targets: targets, Data: data, Blob: body}, nil
}

// ObjectFrom returns the object a message of a mailbox is.
func ObjectFrom(user, mailbox string, v uint32, msg *Message) *Object {
	return &Object{User: user, ID: msg.ID, Mailbox: mailbox, UIDValidity: v, UID: msg.UID, ModSeq: msg.ModSeq,
		Flags: msg.Flags, Size: msg.Size, Date: msg.Date, Replicas: msg.Replicas, Want: msg.Want}
}

// objectRecord says where this node keeps a message object, and its stamp.
type objectRecord struct {
	Stamp       replica.Stamp `json:"stamp"`
	UIDValidity uint32        `json:"v,omitempty"`
	UID         uint32        `json:"uid,omitempty"`
	Deleted     bool          `json:"deleted,omitempty"`
}

func objectKey(user, id string) []byte {
	return append(store.UserPrefix(store.KindObject, user), id...)
}

func (t *tx) objectRecord(user, id string) (*objectRecord, error) {
	var rec objectRecord
	ok, err := getJSON(t.b, objectKey(user, id), &rec)
	if err != nil || !ok {
		return nil, err
	}
	return &rec, nil
}

func (t *tx) has(key []byte) (bool, error) { return hasIn(t.b, key) }

// hasIn reports whether r holds key.
func hasIn(r store.Reader, key []byte) (bool, error) {
	_, closer, err := r.Get(key)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	closer.Close()
	return true, nil
}

// Apply implements replica.Handler: each update newer than the replica here
// becomes it, all in one durable batch with the log entries logw writes.
func (m *Manager) Apply(ups []*replica.Update, logw func(b *store.Batch, outs []replica.Outcome) error) ([]replica.Outcome, error) {
	objs := make([]*Object, len(ups))
	users := make([]string, len(ups))
	for i, u := range ups {
		objs[i] = &Object{}
		if err := decodeObject(u.Data, objs[i]); err != nil {
			return nil, fmt.Errorf("message object %s: %w", u.Object, err)
		}
		users[i] = objs[i].User
	}
	defer m.lockUsers(users)()
	// Under the users' locks: of two Applies of one minted id (a late
	// delivery and a newer change of it), the one that runs first takes
	// the mark and really finds nothing; the other reads what it wrote.
	fresh := m.minted.fresh(objs)
	t := m.newTx()
	outs := make([]replica.Outcome, len(ups))
	for i, o := range objs {
		out, err := t.applyObject(o, ups[i], fresh[i])
		switch {
		case errors.Is(err, ErrUIDTaken):
			// Two messages under one UID (a partition let two writers
			// hand it out): refused here as a conflict, which makes the
			// pusher ask the writer to renumber one of them.
			m.logf("message object %s not applied: %v", ups[i].Object, err)
			out, err = replica.Conflict, nil
		case errors.Is(err, errBadObject) || errors.Is(err, ErrBadName):
			m.logf("message object %s not applied: %v", ups[i].Object, err) // bad input: refused
			out, err = replica.Failed, nil
		}
		if err != nil {
			t.abort()
			return nil, err
		}
		outs[i] = out
	}
	if logw != nil {
		if err := logw(t.b, outs); err != nil {
			t.abort()
			return nil, err
		}
	}
	if err := t.commit(); err != nil {
		return nil, fmt.Errorf("apply %d message objects: %w", len(ups), err)
	}
	return outs, nil
}

// errBadObject marks an update whose content cannot be a message (bad
// input from the network: refused, nothing written).
var errBadObject = errors.New("not a valid message object")

func validObject(o *Object, u *replica.Update) error {
	user, id, ok := ParseObjectName(u.Object)
	switch {
	case !ok || user != o.User || id != o.ID:
		return fmt.Errorf("object %q holds message %s of %s: %w", u.Object, o.ID, o.User, errBadObject)
	case strings.ContainsRune(o.User, 0) || strings.ContainsAny(o.ID, "\x00/"):
		return fmt.Errorf("object %q: %w: NUL or slash in a name", u.Object, errBadObject)
	case o.Deleted:
		return nil
	case o.UID == 0 || o.UIDValidity == 0:
		return fmt.Errorf("object %q: %w: UID %d, UIDVALIDITY %d", u.Object, errBadObject, o.UID, o.UIDValidity)
	}
	return ValidateName(o.Mailbox)
}

// applyObject applies one update. fresh says the object cannot be here
// yet (its id minted here and not applied before, minted.go).
func (t *tx) applyObject(o *Object, u *replica.Update, fresh bool) (replica.Outcome, error) {
	if err := validObject(o, u); err != nil {
		return 0, err
	}
	// A message id this node minted and has not applied yet names no
	// object here: no read of what it replaces (there is nothing).
	var rec *objectRecord
	var err error
	if !fresh {
		if rec, err = t.objectRecord(o.User, o.ID); err != nil {
			return 0, err
		}
	}
	if rec != nil && !rec.Stamp.Less(u.Stamp) {
		return replica.Stale, nil
	}
	// A node that is no longer among the replicas drops its copy (it was
	// replaced while away, repair.go).
	drop := o.Deleted || (len(o.Replicas) > 0 && !slices.Contains(o.Replicas, t.m.Self))
	hadBody := false
	if !drop {
		// Whether a body is here matters only to an update without one,
		// or to a message held here already (for its text index entry).
		have := false
		if u.Blob == nil || (rec != nil && !rec.Deleted) {
			if have, err = t.m.hasBody(t.b, o.User, o.ID); err != nil {
				return 0, err
			}
		}
		hadBody = have
		switch {
		case u.Blob != nil:
			if err := t.setBody(o.User, o.ID, u.Blob, rec != nil); err != nil {
				return 0, err
			}
		case have:
		case o.BodyFrom != "":
			if ok, err := t.copyBody(o.User, o.BodyFrom, o.ID); err != nil {
				return 0, err
			} else if !ok {
				return replica.NeedContent, nil
			}
		default:
			return replica.NeedContent, nil
		}
	}
	var mb *Mailbox
	if !drop {
		if mb, err = t.m.fragmentFor(t, &Placed{User: o.User, Mailbox: o.Mailbox, UIDValidity: o.UIDValidity}); err != nil {
			return 0, err
		}
		if uidMayBeTaken(mb, o.UID) {
			if old, ok, err := t.message(o.User, mb.ID, o.UID); err != nil {
				return 0, err
			} else if ok && old.ID != o.ID {
				return 0, fmt.Errorf("user %s mailbox %q uid %d: %w", o.User, o.Mailbox, o.UID, ErrUIDTaken)
			}
		}
	}
	// Take the message from where this replica had it.
	if rec != nil && !rec.Deleted && (drop || rec.UIDValidity != o.UIDValidity || rec.UID != o.UID) {
		old, err := t.m.fragmentByValidity(t, o.User, rec.UIDValidity)
		if err != nil {
			return 0, err
		}
		if old != nil {
			if err := t.b.Delete(messageKey(o.User, old.ID, rec.UID)); err != nil {
				return 0, err
			}
			t.follow(old, 0, o.ModSeq)
			if mb != nil && mb.ID == old.ID {
				mb = old
			}
			if err := t.putMailbox(o.User, old); err != nil {
				return 0, err
			}
		}
	}
	if drop {
		if err := t.dropBody(o); err != nil {
			return 0, err
		}
		if rec != nil && !rec.Deleted { // only a message held here can have a document
			if err := t.moveText(o.User, o.ID, docLoc{}); err != nil {
				return 0, err
			}
		}
		return replica.Applied, t.putJSON(objectKey(o.User, o.ID), &objectRecord{Stamp: u.Stamp, Deleted: true})
	}
	msg := Message{UID: o.UID, ID: o.ID, Size: o.Size, Date: o.Date, Flags: cleanFlags(o.Flags), ModSeq: o.ModSeq,
		Version: u.Stamp, Replicas: o.Replicas, Want: o.Want}
	if err := t.b.Set(messageKey(o.User, mb.ID, o.UID), encodeMessage(&msg)); err != nil {
		return 0, err
	}
	t.follow(mb, o.UID, o.ModSeq)
	if err := t.putMailbox(o.User, mb); err != nil {
		return 0, err
	}
	// The text index reads a message new here; one that moved keeps its
	// terms under its new place.
	switch {
	case rec == nil || rec.Deleted || !hadBody:
		err = t.queueText(o.User, o.ID)
	case rec.UIDValidity != o.UIDValidity || rec.UID != o.UID:
		err = t.moveText(o.User, o.ID, docLoc{v: o.UIDValidity, uid: o.UID})
	}
	if err != nil {
		return 0, err
	}
	return replica.Applied, t.putJSON(objectKey(o.User, o.ID), &objectRecord{Stamp: u.Stamp, UIDValidity: o.UIDValidity, UID: o.UID})
}

// Fill implements replica.Handler: it adds the message's bytes to an update
// of it, if this replica still holds that version.
func (m *Manager) Fill(u *replica.Update) error {
	user, id, ok := ParseObjectName(u.Object)
	if !ok {
		return fmt.Errorf("object %q: not a message", u.Object)
	}
	var o Object
	if err := decodeObject(u.Data, &o); err != nil {
		return err
	}
	if o.Deleted {
		return nil
	}
	var rec objectRecord
	if ok, err := getJSON(m.db, objectKey(user, id), &rec); err != nil {
		return err
	} else if !ok || rec.Stamp != u.Stamp {
		return fmt.Errorf("message object %s: replica here is another version", u.Object)
	}
	body, err := m.Body(user, id)
	if err != nil {
		return err
	}
	u.Blob = body
	return nil
}

// Scan implements replica.Scanner: every message this node holds, with its
// replica set.
func (m *Manager) Scan(fn func(h replica.Held) error) error {
	return m.eachRecord(func(user string, v []byte) error {
		var msg Message
		if err := decodeMessage(v, &msg); err != nil {
			return nil
		}
		if len(msg.Replicas) == 0 {
			return nil // stored before replication: its node is its only copy
		}
		return fn(replica.Held{Object: ObjectName(user, msg.ID), User: user, Replicas: msg.Replicas, Want: msg.Want, Bytes: msg.Size})
	})
}

// eachRecord calls fn with the user and the encoded record of every
// message this node holds.
func (m *Manager) eachRecord(fn func(user string, v []byte) error) error {
	it, err := m.db.PrefixIter(nil, store.KindPrefix(store.KindMessage))
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		user, _, ok := splitUserKey(it.Key())
		if !ok {
			continue
		}
		if err := fn(user, it.Value()); err != nil {
			return err
		}
	}
	return it.Error()
}

func (m *Manager) logf(format string, args ...any) {
	if m.Log != nil {
		m.Log.Warn(fmt.Sprintf(format, args...))
	}
}

// ExpungedBodyGrace is how long the body of an expunged message stays on
// its replica: an IMAP session that still numbers the message (its
// EXPUNGE not yet sent) may fetch it meanwhile (RFC 2180 §4.1.2).
// SweepExpunged removes it after.
const ExpungedBodyGrace = 2 * time.Minute

func expungedKey(user, id string) []byte {
	return append(store.UserPrefix(store.KindExpunged, user), id...)
}

// dropBody removes this replica's body of a message that leaves it: at
// once when the replica is no longer one of the message's (its copy moved
// elsewhere), after ExpungedBodyGrace when the message was expunged.
func (t *tx) dropBody(o *Object) error {
	if !o.Deleted {
		return t.deleteBody(o.User, o.ID)
	}
	have, err := t.m.hasBody(t.b, o.User, o.ID)
	if err != nil || !have {
		return err
	}
	var until [8]byte
	binary.BigEndian.PutUint64(until[:], uint64(time.Now().Add(ExpungedBodyGrace).UnixNano()))
	return t.b.Set(expungedKey(o.User, o.ID), until[:])
}

// maxSweep bounds the bodies one sweep removes: a Trash of 100,000
// messages emptied at once is swept over several rounds.
const maxSweep = 10000

// SweepExpunged removes the bodies of expunged messages whose grace ended
// before now, and reports how many. A message that is not a tombstone
// any more keeps its body (only its mark goes). Each user's are removed in
// one batch without fsync: a sweep lost in a crash leaves its marks, and
// the next one does it again. A user whose records do not read is logged
// and skipped; the others are swept.
func (m *Manager) SweepExpunged(now time.Time) (int, error) {
	byUser := map[string][]string{}
	var users []string
	it, err := m.db.NewIter(&store.IterOptions{LowerBound: store.KindPrefix(store.KindExpunged),
		UpperBound: store.UpperBound(store.KindPrefix(store.KindExpunged))})
	if err != nil {
		return 0, err
	}
	n := 0
	for ok := it.First(); ok && n < maxSweep; ok = it.Next() {
		k, v := it.Key(), it.Value()
		if len(v) != 8 || int64(binary.BigEndian.Uint64(v)) > now.UnixNano() || len(k) < 3 {
			continue
		}
		user, id, found := bytes.Cut(k[2:], []byte{0})
		if !found {
			continue
		}
		if byUser[string(user)] == nil {
			users = append(users, string(user))
		}
		byUser[string(user)] = append(byUser[string(user)], string(id))
		n++
	}
	if err := it.Close(); err != nil {
		return 0, err
	}
	swept := 0
	var first error
	for _, u := range users {
		k, err := m.sweepUser(u, byUser[u], now)
		swept += k
		if err != nil {
			m.logf("user %s: expunged bodies not swept: %v", u, err)
			if first == nil {
				first = fmt.Errorf("user %s: sweep expunged bodies: %w", u, err)
			}
		}
	}
	return swept, first
}

// sweepUser removes a user's expunged bodies whose grace ended, under the
// user's lock, rereading each mark (an expunge since the scan may have
// given it a new grace).
func (m *Manager) sweepUser(user string, ids []string, now time.Time) (int, error) {
	defer m.lockUser(user)()
	t := m.newTx()
	defer t.abort()
	swept := 0
	for _, id := range ids {
		v, closer, err := t.b.Get(expungedKey(user, id))
		if errors.Is(err, store.ErrNotFound) {
			continue
		}
		if err != nil {
			return 0, err
		}
		due := len(v) != 8 || int64(binary.BigEndian.Uint64(v)) <= now.UnixNano()
		closer.Close()
		if !due {
			continue
		}
		rec, err := t.objectRecord(user, id)
		if err != nil {
			return 0, err
		}
		if rec == nil || rec.Deleted {
			if err := t.deleteBody(user, id); err != nil {
				return 0, err
			}
			swept++
		}
		if err := t.b.Delete(expungedKey(user, id)); err != nil {
			return 0, err
		}
	}
	if t.b.Empty() {
		return 0, nil
	}
	if err := t.b.Commit(store.NoSync); err != nil {
		return 0, err
	}
	return swept, nil
}

// Package mailbox is the mailbox manager of Porcupine §2.2: it keeps this
// node's mailbox fragments (the messages stored here for each user) on
// stable storage and serves them to the delivery and retrieval proxies.
//
// A user has several mailboxes (Porcupine's ⟨user, mailbox⟩ pairs). A
// fragment holds, for each mailbox it has messages of, a record named by the
// mailbox's UIDVALIDITY and the messages under the UIDs and MODSEQs the
// mailbox's writer handed out (fragment.go; the writer is in usermgr). All
// keys of a user sit under the user's bucket, so the fragments of a whole
// bucket are found by one scan (§3.3, §6.1).
//
// Every change is one Pebble batch committed with fsync before the call
// returns. Changes to one user are serialised by a per-user lock held across
// the commit; changes to different users commit concurrently and share WAL
// fsyncs (group commit).
package mailbox

import (
	"bytes"
	"crypto/rand"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"hash/fnv"
	"log/slog"
	"sort"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/store"
)

// Inbox is the name of the mailbox that SMTP delivers to (RFC 3501 §5.1:
// case-insensitive).
const Inbox = "INBOX"

// Separator is the hierarchy delimiter of mailbox names.
const Separator = "/"

// DefaultMailboxes are made for every new user, with their RFC 6154
// special-use attribute.
var DefaultMailboxes = []struct{ Name, SpecialUse string }{
	{Inbox, ""},
	{"Sent", `\Sent`},
	{"Drafts", `\Drafts`},
	{"Trash", `\Trash`},
	{"Junk", `\Junk`},
	{"Archive", `\Archive`},
}

var (
	ErrNoMailbox     = errors.New("no such mailbox")
	ErrMailboxExists = errors.New("mailbox already exists")
	ErrNoMessage     = errors.New("no such message")
	ErrBadName       = errors.New("invalid mailbox name")
)

// The errors keep their identity when a writer or fragment on another
// node returns them, so IMAP answers NO [NONEXISTENT] or [ALREADYEXISTS]
// through any node, not [SERVERBUG].
func init() { rpc.Known(ErrNoMailbox, ErrMailboxExists, ErrNoMessage, ErrBadName) }

// Mailbox is the record of one mailbox.
type Mailbox struct {
	ID            uint64    `json:"id"`
	Name          string    `json:"name"`
	UIDValidity   uint32    `json:"uidvalidity"`
	UIDNext       uint32    `json:"uidnext"`
	HighestModSeq uint64    `json:"highestmodseq"`
	Subscribed    bool      `json:"subscribed"`
	SpecialUse    string    `json:"special_use,omitempty"`
	Created       time.Time `json:"created"`
}

// Usage is what a user's mail takes over all mailboxes, and the user's
// quota limits (0: none).
type Usage struct {
	Storage       int64 `json:"storage"`
	Messages      int64 `json:"messages"`
	QuotaStorage  int64 `json:"quota_storage,omitempty"`
	QuotaMessages int64 `json:"quota_messages,omitempty"`
}

// String says what is used of what, for errors and logs.
func (u Usage) String() string {
	var parts []string
	if u.QuotaStorage > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d bytes", u.Storage, u.QuotaStorage))
	}
	if u.QuotaMessages > 0 {
		parts = append(parts, fmt.Sprintf("%d of %d messages", u.Messages, u.QuotaMessages))
	}
	if len(parts) == 0 {
		return fmt.Sprintf("%d bytes, %d messages, no quota", u.Storage, u.Messages)
	}
	return strings.Join(parts, ", ")
}

// Over reports whether adding n messages of size bytes in all would take
// the user past a limit (RFC 9208 §5.1: an APPEND, COPY or delivery that
// would exceed the quota fails). n and size 0 ask whether the user is at
// a limit already (the size of the message to come is not known).
func (u Usage) Over(n, size int64) bool {
	n, size = max(n, 1), max(size, 1) // no message is empty
	return (u.QuotaMessages > 0 && u.Messages+n > u.QuotaMessages) || (u.QuotaStorage > 0 && u.Storage+size > u.QuotaStorage)
}

// NewMessage is a message a client stores (IMAP APPEND): its bytes, flags
// and internal date.
type NewMessage struct {
	Raw   []byte
	Flags []string
	Date  time.Time
}

// Message is the index record of one message in a mailbox.
type Message struct {
	UID    uint32
	ID     string // node-independent id, the POP3 UIDL and the body's key
	Size   int64
	Date   time.Time // IMAP INTERNALDATE
	Flags  []string
	ModSeq uint64
	// Version is the stamp of the update that made this replica, Replicas
	// the nodes meant to hold the message and Want how many copies its
	// user asked for (Porcupine §4.3: the mail map records replica sets).
	Version  replica.Stamp
	Replicas []cluster.NodeID
	Want     int
}

// HasFlag reports whether the message carries flag (case-insensitive, RFC
// 3501 §2.3.2).
func (m *Message) HasFlag(flag string) bool { return hasFold(m.Flags, flag) }

// userMeta holds per-user counters.
type userMeta struct {
	NextMailboxID uint64 `json:"next_mailbox_id"`
}

// Change tells subscribers that a mailbox of a user changed.
type Change struct {
	User    string
	Mailbox uint64 // mailbox ID; 0 when the set of mailboxes changed
}

// Manager is the node's mailbox manager.
type Manager struct {
	db    *store.DB
	locks [1024]sync.Mutex
	// pending counts commits waiting for their fsync: the load measure of
	// Porcupine §5 (pending disk operations).
	pending atomic.Int64
	// names caches, per (user, UIDVALIDITY), the name of the local
	// mailbox record (fragment.go).
	names sync.Map
	// Self is this node: a replica of a message whose replica set no
	// longer names it drops its copy.
	Self cluster.NodeID
	Log  *slog.Logger

	Notifier
	// TextIndexDelay is how long a stored message waits before the text
	// index reads it (DefaultTextIndexDelay for quill serve; 0: at once).
	TextIndexDelay time.Duration
	text           textIndex
	// minted are the ids handed out here not yet applied (minted.go).
	minted mintedIDs
	// files holds the bodies too large for Pebble (bodyfile.go).
	files *bodyFiles
}

// New returns the mailbox manager on top of the node's store.
func New(db *store.DB) *Manager {
	return &Manager{db: db, files: newBodyFiles(db)}
}

func (m *Manager) lockUser(user string) func() {
	h := fnv.New32a()
	h.Write([]byte(user))
	mu := &m.locks[h.Sum32()%uint32(len(m.locks))]
	mu.Lock()
	return mu.Unlock
}

// lockUsers locks several users' stripes in a fixed order, so two
// multi-recipient deliveries cannot deadlock.
func (m *Manager) lockUsers(users []string) func() {
	idx := map[uint32]bool{}
	for _, u := range users {
		h := fnv.New32a()
		h.Write([]byte(u))
		idx[h.Sum32()%uint32(len(m.locks))] = true
	}
	order := make([]int, 0, len(idx))
	for i := range idx {
		order = append(order, int(i))
	}
	sort.Ints(order)
	for _, i := range order {
		m.locks[i].Lock()
	}
	return func() {
		for _, i := range order {
			m.locks[i].Unlock()
		}
	}
}

// Pending returns the number of disk writes in flight.
func (m *Manager) Pending() int { return int(m.pending.Load()) }

// NewMessageID returns a node-independent message id: time-ordered, with 64
// random bits, so ids from different nodes never collide. It is printable
// ASCII of 29 characters, valid as a POP3 unique-id (RFC 1939 §7).
func (m *Manager) NewMessageID() string {
	var r [8]byte
	rand.Read(r[:])
	id := fmt.Sprintf("%013x%s", time.Now().UnixMicro(), hex.EncodeToString(r[:]))
	m.minted.add(id)
	return id
}

// --- keys

func mailboxKey(user, name string) []byte {
	return append(store.UserPrefix(store.KindMailbox, user), normName(name)...)
}

func messagePrefix(user string, mbox uint64) []byte {
	k := store.UserPrefix(store.KindMessage, user)
	return binary.BigEndian.AppendUint64(k, mbox)
}

func messageKey(user string, mbox uint64, uid uint32) []byte {
	return binary.BigEndian.AppendUint32(messagePrefix(user, mbox), uid)
}

func bodyKey(user, id string) []byte {
	return append(store.UserPrefix(store.KindBody, user), id...)
}

func userMetaKey(user string) []byte { return store.UserPrefix(store.KindUserMeta, user) }

// NormName returns the stored form of a mailbox name.
func NormName(name string) string { return normName(name) }

// normName makes INBOX case-insensitive (RFC 3501 §5.1); other names are
// case-sensitive.
func normName(name string) string {
	if strings.EqualFold(name, Inbox) {
		return Inbox
	}
	if len(name) > 6 && strings.EqualFold(name[:6], Inbox+Separator) {
		return Inbox + name[5:]
	}
	return name
}

// maxNameLen bounds mailbox names; IMAP clients never need more.
const maxNameLen = 512

// ValidateName checks a mailbox name.
func ValidateName(name string) error {
	if name == "" || len(name) > maxNameLen {
		return fmt.Errorf("mailbox %q: %w: length must be 1 to %d", name, ErrBadName, maxNameLen)
	}
	if strings.HasPrefix(name, Separator) || strings.HasSuffix(name, Separator) || strings.Contains(name, Separator+Separator) {
		return fmt.Errorf("mailbox %q: %w: empty hierarchy level", name, ErrBadName)
	}
	for _, c := range []byte(name) {
		if c < ' ' || c == 0x7f || c == '*' || c == '%' {
			return fmt.Errorf("mailbox %q: %w: character %q not allowed", name, ErrBadName, c)
		}
	}
	return nil
}

// --- reads

func getJSON(r store.Reader, key []byte, v any) (bool, error) {
	b, closer, err := r.Get(key)
	if errors.Is(err, store.ErrNotFound) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	defer closer.Close()
	return true, json.Unmarshal(b, v)
}

// Mailbox returns one mailbox record.
func (m *Manager) Mailbox(user, name string) (*Mailbox, error) {
	return m.getMailbox(m.db, user, name)
}

func (m *Manager) getMailbox(r store.Reader, user, name string) (*Mailbox, error) {
	var mb Mailbox
	ok, err := getJSON(r, mailboxKey(user, name), &mb)
	if err != nil {
		return nil, fmt.Errorf("user %s mailbox %q: %w", user, name, err)
	}
	if !ok {
		return nil, fmt.Errorf("user %s mailbox %q: %w", user, name, ErrNoMailbox)
	}
	return &mb, nil
}

// Messages returns the index records of a mailbox, in UID order.
func (m *Manager) Messages(user string, mbox uint64) ([]Message, error) {
	it, err := m.db.PrefixIter(nil, messagePrefix(user, mbox))
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []Message
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		var msg Message
		msg.UID = binary.BigEndian.Uint32(k[len(k)-4:])
		if err := decodeMessage(it.Value(), &msg); err != nil {
			return nil, fmt.Errorf("user %s mailbox %d uid %d: %w", user, mbox, msg.UID, err)
		}
		out = append(out, msg)
	}
	return out, it.Error()
}

// Body returns the whole message as stored (CRLF line endings).
func (m *Manager) Body(user, id string) ([]byte, error) {
	b, closer, err := m.db.Get(bodyKey(user, id))
	if errors.Is(err, store.ErrNotFound) {
		if b, ok, err := m.fileBodyOf(user, id); ok || err != nil {
			return b, err
		}
		return nil, fmt.Errorf("user %s message %s: %w", user, id, ErrNoMessage)
	}
	if err != nil {
		return nil, fmt.Errorf("user %s message %s: read: %w", user, id, err)
	}
	defer closer.Close()
	raw, err := decodeBody(b)
	if err != nil {
		return nil, fmt.Errorf("user %s message %s: %w", user, id, err)
	}
	if len(raw) > 0 && len(b) > 0 && &raw[0] == &b[0] {
		raw = bytes.Clone(raw) // kept as it is: b is Pebble's until closer.Close
	}
	return raw, nil
}

// --- writes

// tx is one change to a user's mail under the user's lock: reads see the
// batch's own writes, and commit makes them durable.
type tx struct {
	m       *Manager
	b       *store.Batch
	changed map[string]map[uint64]bool
	// The text index's part of the change (textindex.go).
	textQueued  bool
	textChanges []textChange
}

func (m *Manager) newTx() *tx {
	return &tx{m: m, b: m.db.NewIndexedBatch(), changed: map[string]map[uint64]bool{}}
}

func (t *tx) touch(user string, mbox uint64) {
	if t.changed[user] == nil {
		t.changed[user] = map[uint64]bool{}
	}
	t.changed[user][mbox] = true
}

func (t *tx) putJSON(key []byte, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return t.b.Set(key, b)
}

func (t *tx) putMailbox(user string, mb *Mailbox) error {
	t.touch(user, mb.ID)
	return t.putJSON(mailboxKey(user, mb.Name), mb)
}

// commit fsyncs the batch (store.Sync), then tells subscribers.
func (t *tx) commit() error {
	defer t.b.Close()
	if t.b.Empty() {
		return nil
	}
	t.m.pending.Add(1)
	err := t.b.Commit(store.Sync)
	t.m.pending.Add(-1)
	if err != nil {
		return fmt.Errorf("commit: %w", err)
	}
	t.textCommitted()
	for user, boxes := range t.changed {
		for id := range boxes {
			t.m.Publish(Change{User: user, Mailbox: id})
		}
	}
	return nil
}

func (t *tx) abort() { t.b.Close() }

func (t *tx) meta(user string) (*userMeta, error) {
	var um userMeta
	if _, err := getJSON(t.b, userMetaKey(user), &um); err != nil {
		return nil, fmt.Errorf("user %s: counters: %w", user, err)
	}
	return &um, nil
}

func (t *tx) dropMessages(user string, mbox uint64) error {
	msgs, err := t.m.messagesIn(t.b, user, mbox)
	if err != nil {
		return err
	}
	for _, msg := range msgs {
		if err := t.deleteBody(user, msg.ID); err != nil {
			return err
		}
	}
	p := messagePrefix(user, mbox)
	return t.b.DeleteRange(p, store.UpperBound(p))
}

func (m *Manager) messagesIn(r store.Reader, user string, mbox uint64) ([]Message, error) {
	it, err := m.db.PrefixIter(r, messagePrefix(user, mbox))
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []Message
	for it.First(); it.Valid(); it.Next() {
		k := it.Key()
		msg := Message{UID: binary.BigEndian.Uint32(k[len(k)-4:])}
		if err := decodeMessage(it.Value(), &msg); err != nil {
			return nil, err
		}
		out = append(out, msg)
	}
	return out, it.Error()
}

func (m *Manager) mailboxesIn(r store.Reader, user string) ([]Mailbox, error) {
	it, err := m.db.PrefixIter(r, store.UserPrefix(store.KindMailbox, user))
	if err != nil {
		return nil, err
	}
	defer it.Close()
	var out []Mailbox
	for it.First(); it.Valid(); it.Next() {
		var mb Mailbox
		if err := json.Unmarshal(it.Value(), &mb); err != nil {
			return nil, err
		}
		out = append(out, mb)
	}
	return out, it.Error()
}

// FlagOp says how StoreFlags changes flags (RFC 3501 §6.4.6).
type FlagOp int

const (
	FlagsSet FlagOp = iota
	FlagsAdd
	FlagsRemove
)

func (m *Manager) mailboxByID(r store.Reader, user string, id uint64) (*Mailbox, error) {
	all, err := m.mailboxesIn(r, user)
	if err != nil {
		return nil, err
	}
	for i := range all {
		if all[i].ID == id {
			return &all[i], nil
		}
	}
	return nil, fmt.Errorf("user %s mailbox id %d: %w", user, id, ErrNoMailbox)
}

func (t *tx) message(user string, mbox uint64, uid uint32) (Message, bool, error) {
	b, closer, err := t.b.Get(messageKey(user, mbox, uid))
	if errors.Is(err, store.ErrNotFound) {
		return Message{}, false, nil
	}
	if err != nil {
		return Message{}, false, err
	}
	defer closer.Close()
	msg := Message{UID: uid}
	return msg, true, decodeMessage(b, &msg)
}

// CopyResult pairs a source UID with the UID of its copy (RFC 4315 COPYUID).
type CopyResult struct {
	Dest    *Mailbox
	SrcUIDs []uint32
	DstUIDs []uint32
}

// DeleteUser removes every mailbox and message of a user on this node.
func (m *Manager) DeleteUser(user string) error {
	defer m.lockUser(user)()
	b := m.db.NewBatch()
	defer b.Close()
	for _, kind := range []byte{store.KindMailbox, store.KindMessage, store.KindBody, store.KindUserMeta, store.KindObject, store.KindExpunged, store.KindText, store.KindToIndex, store.KindBodyFile} {
		p := store.UserPrefix(kind, user)
		if err := b.DeleteRange(p, store.UpperBound(p)); err != nil {
			return err
		}
	}
	if err := b.Commit(store.Sync); err != nil {
		return fmt.Errorf("user %s: delete mail: %w", user, err)
	}
	m.forgetText(user)
	m.Publish(Change{User: user})
	return nil
}

// FragmentUsers calls fn for every user that has mailboxes on this node in
// the given bucket (or in every bucket when bucket < 0), with the number of
// messages stored here. It is the bucket-scoped disk scan the user manager
// rebuilds mail maps from (Porcupine §3.3).
func (m *Manager) FragmentUsers(bucket int, fn func(user string, messages int) error) error {
	prefix := store.KindPrefix(store.KindMailbox)
	if bucket >= 0 {
		prefix = store.BucketPrefix(store.KindMailbox, uint8(bucket))
	}
	it, err := m.db.PrefixIter(nil, prefix)
	if err != nil {
		return err
	}
	defer it.Close()
	last := ""
	for it.First(); it.Valid(); it.Next() {
		user, _, ok := splitUserKey(it.Key())
		if !ok || user == last {
			continue
		}
		last = user
		n, err := m.countMessages(user)
		if err != nil {
			return err
		}
		if err := fn(user, n); err != nil {
			return err
		}
	}
	return it.Error()
}

// HoldsMail reports whether this node holds any message of the user, in
// any mailbox: what FragmentUsers counts, so a mail map kept by it agrees
// with one rebuilt from the scans.
func (m *Manager) HoldsMail(user string) (bool, error) {
	it, err := m.db.PrefixIter(nil, store.UserPrefix(store.KindMessage, user))
	if err != nil {
		return false, err
	}
	defer it.Close()
	return it.First(), it.Error()
}

func (m *Manager) countMessages(user string) (int, error) {
	return m.countKeys(store.UserPrefix(store.KindMessage, user))
}

// countKeys counts the keys with prefix p.
func (m *Manager) countKeys(p []byte) (int, error) {
	it, err := m.db.PrefixIter(nil, p)
	if err != nil {
		return 0, err
	}
	defer it.Close()
	n := 0
	for it.First(); it.Valid(); it.Next() {
		n++
	}
	return n, it.Error()
}

// --- flags

// hasFold reports whether list holds f, case-insensitively (RFC 3501
// §2.3.2: flags are case-insensitive).
func hasFold(list []string, f string) bool {
	for _, g := range list {
		if strings.EqualFold(f, g) {
			return true
		}
	}
	return false
}

// cleanFlags drops duplicates (case-insensitively) and \Recent, which is
// session state and never stored (RFC 3501 §2.3.2).
func cleanFlags(flags []string) []string {
	out := make([]string, 0, len(flags))
	for _, f := range flags {
		if f != "" && !strings.EqualFold(f, `\Recent`) && !hasFold(out, f) {
			out = append(out, f)
		}
	}
	return out
}

// ApplyFlags returns cur changed by a STORE of flags with op.
func ApplyFlags(cur []string, op FlagOp, flags []string) []string {
	switch op {
	case FlagsSet:
		return cleanFlags(flags)
	case FlagsAdd:
		return cleanFlags(append(append([]string{}, cur...), flags...))
	default:
		out := []string{}
		for _, f := range cur {
			if !hasFold(flags, f) {
				out = append(out, f)
			}
		}
		return out
	}
}

// SameFlags reports whether two flag lists hold the same flags, in any
// order and case.
func SameFlags(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for _, f := range a {
		if !hasFold(b, f) {
			return false
		}
	}
	return true
}

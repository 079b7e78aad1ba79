// Package userdb is the user database manager of Porcupine §2.2: the node's
// replica of the user profile database, which is hard state. A profile holds
// the address, the password hash and per-user policy. Passwords are stored
// only as argon2id hashes (bcrypt hashes are accepted on verification, for
// imported users).
package userdb

import (
	"errors"
	"fmt"
	"github.com/quillmail/quill/internal/domain"
	"strings"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
)

// ErrNotFound is returned for a user that has no profile.
var ErrNotFound = errors.New("no such user")

// ErrOverQuota says a user's quota leaves no room for a message (SMTP 452
// 4.2.2, IMAP NO [OVERQUOTA]).
var ErrOverQuota = errors.New("over quota")

// ErrQuotaFinal comes beside ErrOverQuota when the recipient's domain
// makes quota refusals permanent (SMTP 552 5.2.2, the queue bounces at
// once).
var ErrQuotaFinal = errors.New("refused for good")

// ProfileReplicas is how many nodes keep each user profile (the two ranked
// highest for its bucket), so one crash never stops a login.
const ProfileReplicas = 2

// ErrExists is returned when adding a user that already has a profile.
var ErrExists = errors.New("user already exists")

// Profile is one user's hard state in the profile database.
type Profile struct {
	Address      string `json:"address"`
	PasswordHash string `json:"password_hash,omitempty"`
	// SCRAMSHA256 holds the SCRAM-SHA-256 keys derived from the password
	// when it was set (RFC 5803 form, see DeriveSCRAM): what a SCRAM login
	// needs, never the password itself. Empty for a user whose password
	// was set before Quill had SCRAM, until their next password login.
	SCRAMSHA256 string    `json:"scram_sha256,omitempty"`
	Created     time.Time `json:"created"`
	Updated     time.Time `json:"updated"`
	// Version orders updates of the profile across nodes: a hybrid
	// logical clock timestamp, so skewed wall clocks never let an older
	// update win (BLUEPRINT invariant 6).
	Version hlc.Timestamp `json:"version"`
	// Deleted marks a tombstone: a deleted user's profile stays, without
	// its hash, so a replica that missed the delete cannot bring it back.
	Deleted bool `json:"deleted,omitempty"`
	// Mailboxes are the user's IMAP mailboxes. Their messages lie in
	// fragments on many nodes; what must survive any one node — names,
	// UIDVALIDITY, subscriptions and how far UIDs and MODSEQs were handed
	// out — lives here, with the profile, on its replicas.
	Mailboxes []MailboxDef `json:"mailboxes,omitempty"`
	// Spread is how many nodes this user's mail may spread over (Porcupine
	// §5); 0 means the cluster default.
	Spread int `json:"spread,omitempty"`
	// Replicas is how many nodes keep each of the user's messages and
	// WritePolicy how many must have it before delivery is acknowledged
	// (one, quorum, all); zero and empty take the cluster's defaults.
	Replicas    int    `json:"replicas,omitempty"`
	WritePolicy string `json:"write_policy,omitempty"`
	// LastUIDValidity is the highest UIDVALIDITY given to any mailbox of the
	// user, so a mailbox made again never repeats one (RFC 3501 §2.3.1.1).
	LastUIDValidity uint32 `json:"last_uidvalidity,omitempty"`
	// Subscriptions are the subscribed names that have no mailbox: a
	// subscription outlives a deleted mailbox and may name one not yet
	// made (RFC 9051 §6.3.7); an existing mailbox's is its Subscribed.
	Subscriptions []string `json:"subscriptions,omitempty"`
	// QuotaStorage and QuotaMessages limit the user's mail, over all
	// mailboxes: bytes and messages (RFC 9208's STORAGE, in bytes here,
	// and MESSAGE); 0 is no limit.
	QuotaStorage  int64 `json:"quota_storage,omitempty"`
	QuotaMessages int64 `json:"quota_messages,omitempty"`
	// Admin lets the user sign in to the admin console with their
	// password (besides the node's admin token).
	Admin bool `json:"admin,omitempty"`
}

// MailboxDef is the hard state of one mailbox of a user.
type MailboxDef struct {
	Name        string `json:"name"`
	UIDValidity uint32 `json:"uidvalidity"`
	Subscribed  bool   `json:"subscribed,omitempty"`
	SpecialUse  string `json:"special_use,omitempty"`
	// UIDReserved and ModSeqReserved end the blocks of UIDs and MODSEQs the
	// mailbox's writer has reserved. A new writer (after a failover) starts
	// at them, past anything the old one may have handed out, so a UID is
	// never given twice (BLUEPRINT invariant 5).
	UIDReserved    uint32 `json:"uid_reserved,omitempty"`
	ModSeqReserved uint64 `json:"modseq_reserved,omitempty"`
}

// MailboxByName returns the definition of a mailbox (INBOX matched
// case-insensitively), or nil.
func (p *Profile) MailboxByName(name string) *MailboxDef {
	for i := range p.Mailboxes {
		if p.Mailboxes[i].Name == name || (strings.EqualFold(name, "INBOX") && p.Mailboxes[i].Name == "INBOX") {
			return &p.Mailboxes[i]
		}
	}
	return nil
}

// MailboxByValidity returns the definition with that UIDVALIDITY, or nil.
func (p *Profile) MailboxByValidity(v uint32) *MailboxDef {
	for i := range p.Mailboxes {
		if p.Mailboxes[i].UIDValidity == v {
			return &p.Mailboxes[i]
		}
	}
	return nil
}

// Clone returns a deep copy, so a writer can change it without touching
// the cached one.
func (p *Profile) Clone() *Profile {
	c := *p
	c.Mailboxes = append([]MailboxDef(nil), p.Mailboxes...)
	c.Subscriptions = append([]string(nil), p.Subscriptions...)
	return &c
}

// Domain returns the domain part of the address.
func (p *Profile) Domain() string { return Domain(p.Address) }

// DB is the node's replica of the user profile database.
type DB struct {
	db *store.DB
	mu sync.Mutex // orders PutIfNewer's and Apply's reads and writes
	// OnApply hears of each profile a replication update wrote.
	OnApply func(*Profile)
}

// New returns the profile database on top of the node's store.
func New(db *store.DB) *DB { return &DB{db: db} }

func key(addr string) []byte {
	k := store.UserPrefix(store.KindProfile, addr)
	return k[:len(k)-1] // profiles need no separator: the address ends the key
}

// Get returns the profile of addr.
func (d *DB) Get(addr string) (*Profile, error) {
	addr = Normalize(addr)
	v, closer, err := d.db.Get(key(addr))
	if errors.Is(err, store.ErrNotFound) {
		return nil, fmt.Errorf("user %s: %w", addr, ErrNotFound)
	}
	if err != nil {
		return nil, fmt.Errorf("user %s: read profile: %w", addr, err)
	}
	defer closer.Close()
	p, err := Decode(v)
	if err != nil {
		return nil, fmt.Errorf("user %s: corrupt profile: %w", addr, err)
	}
	return p, nil
}

// Put writes a profile durably.
func (d *DB) Put(p *Profile) error {
	v, err := p.Encode()
	if err != nil {
		return err
	}
	if err := d.db.Set(key(p.Address), v, store.Sync); err != nil {
		return fmt.Errorf("user %s: write profile: %w", p.Address, err)
	}
	return nil
}

// PutIfNewer writes p only if it is newer than the stored profile, and
// reports whether it did. Replicas apply updates with it, so updates may
// arrive in any order and more than once.
func (d *DB) PutIfNewer(p *Profile) (bool, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	cur, err := d.Get(p.Address)
	if err == nil && cur.Version >= p.Version {
		return false, nil
	}
	if err != nil && !errors.Is(err, ErrNotFound) {
		return false, err
	}
	return true, d.Put(p)
}

// ProfileKind is the replication manager's name for profile objects.
const ProfileKind = "p"

// ObjectName names a profile for the replication manager.
func ObjectName(addr string) string { return ProfileKind + "/" + addr }

// Apply implements replica.Handler: profiles are replicated like messages
// (Porcupine §4.1), each update a whole profile ordered by its HLC version.
// OnApply, if set, hears of every profile applied.
func (d *DB) Apply(ups []*replica.Update, logw func(b *store.Batch, outs []replica.Outcome) error) ([]replica.Outcome, error) {
	d.mu.Lock()
	defer d.mu.Unlock()
	b := d.db.NewIndexedBatch()
	defer b.Close()
	outs := make([]replica.Outcome, len(ups))
	var applied []*Profile
	for i, u := range ups {
		pp, err := Decode(u.Data)
		if err != nil {
			return nil, fmt.Errorf("profile object %s: %w", u.Object, err)
		}
		p := *pp
		if u.Object != ObjectName(p.Address) || ValidateAddress(p.Address) != nil || p.Version == 0 {
			outs[i] = replica.Failed // bad input from the network: refused
			continue
		}
		var cur *Profile
		v, closer, err := b.Get(key(p.Address))
		if err == nil {
			cur, err = Decode(v)
			closer.Close()
			if err != nil {
				return nil, fmt.Errorf("user %s: corrupt profile: %w", p.Address, err)
			}
			if cur.Version >= p.Version {
				outs[i] = replica.Stale
				continue
			}
		} else if !errors.Is(err, store.ErrNotFound) {
			return nil, fmt.Errorf("user %s: read profile: %w", p.Address, err)
		}
		if err := b.Set(key(p.Address), u.Data); err != nil {
			return nil, err
		}
		applied = append(applied, &p)
	}
	if logw != nil {
		if err := logw(b, outs); err != nil {
			return nil, err
		}
	}
	if err := b.Commit(store.Sync); err != nil {
		return nil, fmt.Errorf("write %d profiles: %w", len(ups), err)
	}
	if d.OnApply != nil {
		for _, p := range applied {
			d.OnApply(p)
		}
	}
	return outs, nil
}

// Fill implements replica.Handler: a profile update carries all of it.
func (d *DB) Fill(u *replica.Update) error { return nil }

// Scan calls fn for every profile in the given bucket, or in every bucket
// when bucket < 0. It is the scan the user manager rebuilds its profile soft
// state from (Porcupine §3.3).
func (d *DB) Scan(bucket int, fn func(*Profile) error) error {
	prefix := store.KindPrefix(store.KindProfile)
	if bucket >= 0 {
		prefix = store.BucketPrefix(store.KindProfile, uint8(bucket))
	}
	it, err := d.db.PrefixIter(nil, prefix)
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		p, err := Decode(it.Value())
		if err != nil {
			return fmt.Errorf("profile key %q: corrupt: %w", it.Key(), err)
		}
		if err := fn(p); err != nil {
			return err
		}
	}
	return it.Error()
}

// Normalize lower-cases an address: Quill treats addresses as
// case-insensitive, as users expect (RFC 5321 §2.4 allows this for the local
// part when the server chooses).
func Normalize(addr string) string { return strings.ToLower(strings.TrimSpace(addr)) }

// Domain returns the part of an address after the last '@'.
func Domain(addr string) string {
	if i := strings.LastIndexByte(addr, '@'); i >= 0 {
		return strings.ToLower(addr[i+1:])
	}
	return ""
}

// maxAddressLen is RFC 5321 §4.5.3.1.3's limit on a path, less the brackets.
const maxAddressLen = 254

// ValidateAddress checks that addr is a plain mailbox address we can host:
// local@domain, printable ASCII, no spaces, within RFC 5321 length limits.
func ValidateAddress(addr string) error {
	if len(addr) == 0 || len(addr) > maxAddressLen {
		return fmt.Errorf("address %q: length must be 1 to %d", addr, maxAddressLen)
	}
	at := strings.LastIndexByte(addr, '@')
	if at <= 0 || at == len(addr)-1 {
		return fmt.Errorf("address %q: must be local@domain", addr)
	}
	if at > 64 {
		return fmt.Errorf("address %q: local part longer than 64 octets", addr)
	}
	for _, c := range []byte(addr) {
		if c <= ' ' || c >= 0x7f || c == '<' || c == '>' || c == '"' || c == '\\' || c == ',' || c == ';' || c == ':' {
			return fmt.Errorf("address %q: character %q not allowed", addr, c)
		}
	}
	dom := addr[at+1:]
	if strings.Contains(addr[:at], "@") || strings.HasPrefix(dom, ".") || strings.HasSuffix(dom, ".") || strings.Contains(dom, "..") {
		return fmt.Errorf("address %q: bad domain", addr)
	}
	return nil
}

// ValidateNewAddress is ValidateAddress and more, for an address that is to
// become a user or an alias: a local part of letters, digits and . - _ + =
// (no dot first, last or twice in a row: RFC 5321's dot-atom, narrowed to
// what is safe as a file or folder name when mail is exported, so no / or
// ..), and a domain name domain.ValidName accepts. Addresses already
// stored are only held to ValidateAddress, so an upgrade reads them all.
func ValidateNewAddress(addr string) error {
	if err := ValidateAddress(addr); err != nil {
		return err
	}
	at := strings.LastIndexByte(addr, '@')
	local := addr[:at]
	if local[0] == '.' || local[len(local)-1] == '.' || strings.Contains(local, "..") {
		return fmt.Errorf("address %q: a dot may not start or end the local part or follow another", addr)
	}
	for _, c := range []byte(local) {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || strings.IndexByte(".-_+=", c) >= 0) {
			return fmt.Errorf("address %q: character %q not allowed in the local part (letters, digits and . - _ + =)", addr, c)
		}
	}
	if err := domain.ValidName(strings.ToLower(addr[at+1:])); err != nil {
		return fmt.Errorf("address %q: %w", addr, err)
	}
	return nil
}

// Package usermgr is the user manager of Porcupine §2.2 and §3.3: the soft
// state of the users whose bucket this node manages in the user map — a
// cached copy of each profile and the mail map, the set of nodes holding
// mailbox fragments of ⟨user, mailbox⟩ — plus the set of domains the users
// live in. None of it is written to disk: Rebuild recomputes it from the
// node's hard state (profiles and fragments) by a bucket-scoped scan, which
// is what the node does at start and, in a cluster, for every bucket whose
// manager changed.
package usermgr

import (
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"errors"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/userdb"
)

// ErrUnknownUser is returned for an address that has no profile.
var ErrUnknownUser = userdb.ErrNotFound

// ErrBadPassword is returned when a password does not match.
var ErrBadPassword = userdb.ErrPasswordMismatch

// Manager is the node's user manager.
type Manager struct {
	self  cluster.NodeID
	users *userdb.DB
	boxes *mailbox.Manager

	mu       sync.RWMutex
	profiles map[string]*userdb.Profile
	mailMap  map[string]map[cluster.NodeID]bool
	domains  map[string]int // domain -> number of users in it

	// verified caches, per user, a keyed MAC of the last password that
	// passed the argon2id check, so a POP3 client polling every minute does
	// not pay 20 MiB and tens of milliseconds of hashing per login. The key
	// is random per process and the cache is soft state: dropped with the
	// profile on any change.
	verified map[string][32]byte
	macKey   [32]byte
	// dummyHash is checked for unknown users so a login attempt takes as
	// long for a missing user as for a wrong password.
	dummyHash string
}

// New returns an empty user manager; call Rebuild to fill it.
func New(self cluster.NodeID, users *userdb.DB, boxes *mailbox.Manager) *Manager {
	m := &Manager{self: self, users: users, boxes: boxes,
		profiles: map[string]*userdb.Profile{}, mailMap: map[string]map[cluster.NodeID]bool{},
		domains: map[string]int{}, verified: map[string][32]byte{}}
	rand.Read(m.macKey[:])
	m.dummyHash, _ = userdb.HashPassword("no such user")
	return m
}

// Rebuild recomputes the soft state of the given buckets (all when buckets
// is nil) from this node's profile database and mailbox fragments.
func (m *Manager) Rebuild(buckets []uint8) error {
	if buckets == nil {
		buckets = make([]uint8, cluster.Buckets)
		for i := range buckets {
			buckets[i] = uint8(i)
		}
	}
	for _, b := range buckets {
		profiles := map[string]*userdb.Profile{}
		if err := m.users.Scan(int(b), func(p *userdb.Profile) error {
			profiles[p.Address] = p
			return nil
		}); err != nil {
			return fmt.Errorf("rebuild bucket %d: profiles: %w", b, err)
		}
		frag := map[string]bool{}
		if err := m.boxes.FragmentUsers(int(b), func(user string, n int) error {
			if n > 0 {
				frag[user] = true
			}
			return nil
		}); err != nil {
			return fmt.Errorf("rebuild bucket %d: fragments: %w", b, err)
		}
		m.mu.Lock()
		for u, p := range m.profiles {
			if cluster.Bucket(u) == b {
				m.dropLocked(u, p)
			}
		}
		for u := range m.mailMap {
			if cluster.Bucket(u) == b {
				delete(m.mailMap, u)
			}
		}
		for u, p := range profiles {
			m.putLocked(p)
			_ = u
		}
		for u := range frag {
			m.noteLocked(u, m.self)
		}
		m.mu.Unlock()
	}
	return nil
}

func (m *Manager) putLocked(p *userdb.Profile) {
	if old, ok := m.profiles[p.Address]; ok {
		m.dropLocked(p.Address, old)
	}
	m.profiles[p.Address] = p
	m.domains[p.Domain()]++
}

func (m *Manager) dropLocked(user string, p *userdb.Profile) {
	delete(m.profiles, user)
	delete(m.verified, user)
	d := p.Domain()
	if m.domains[d]--; m.domains[d] <= 0 {
		delete(m.domains, d)
	}
}

func (m *Manager) noteLocked(user string, n cluster.NodeID) {
	s := m.mailMap[user]
	if s == nil {
		s = map[cluster.NodeID]bool{}
		m.mailMap[user] = s
	}
	s[n] = true
}

// Lookup returns the cached profile of a user.
func (m *Manager) Lookup(addr string) (*userdb.Profile, error) {
	addr = userdb.Normalize(addr)
	m.mu.RLock()
	p, ok := m.profiles[addr]
	m.mu.RUnlock()
	if !ok {
		return nil, fmt.Errorf("user %s: %w", addr, ErrUnknownUser)
	}
	return p, nil
}

// ServesDomain reports whether any user lives in the domain: the domains of
// the users are the domains the node accepts mail for.
func (m *Manager) ServesDomain(domain string) bool {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.domains[userdb.Normalize(domain)] > 0
}

// Authenticate checks a user's password. The error names the user and says
// whether the user is unknown or the password wrong; protocol servers must
// not pass that difference on to the client.
func (m *Manager) Authenticate(addr, password string) (*userdb.Profile, error) {
	addr = userdb.Normalize(addr)
	mac := m.mac(addr, password)
	m.mu.RLock()
	p, ok := m.profiles[addr]
	cached, hit := m.verified[addr]
	m.mu.RUnlock()
	if !ok {
		userdb.CheckPassword(m.dummyHash, password)
		return nil, fmt.Errorf("user %s: %w", addr, ErrUnknownUser)
	}
	if hit && hmac.Equal(cached[:], mac[:]) {
		return p, nil
	}
	if err := userdb.CheckPassword(p.PasswordHash, password); err != nil {
		return nil, fmt.Errorf("user %s: %w", addr, err)
	}
	m.mu.Lock()
	if m.profiles[addr] == p { // not changed meanwhile
		m.verified[addr] = mac
	}
	m.mu.Unlock()
	return p, nil
}

func (m *Manager) mac(user, password string) [32]byte {
	h := hmac.New(sha256.New, m.macKey[:])
	h.Write([]byte(user))
	h.Write([]byte{0})
	h.Write([]byte(password))
	var out [32]byte
	copy(out[:], h.Sum(nil))
	return out
}

// AddUser creates a user: the profile (hard state) and the default
// mailboxes, then the soft state.
func (m *Manager) AddUser(addr, password string) (*userdb.Profile, error) {
	addr = userdb.Normalize(addr)
	if err := userdb.ValidateAddress(addr); err != nil {
		return nil, err
	}
	if _, err := m.users.Get(addr); err == nil {
		return nil, fmt.Errorf("user %s: %w", addr, userdb.ErrExists)
	} else if !errors.Is(err, userdb.ErrNotFound) {
		return nil, err
	}
	hash, err := userdb.HashPassword(password)
	if err != nil {
		return nil, fmt.Errorf("user %s: %w", addr, err)
	}
	now := time.Now().UTC()
	p := &userdb.Profile{Address: addr, PasswordHash: hash, Created: now, Updated: now}
	if err := m.users.Put(p); err != nil {
		return nil, err
	}
	if err := m.boxes.EnsureUser(addr); err != nil {
		return nil, fmt.Errorf("user %s: mailboxes: %w", addr, err)
	}
	m.mu.Lock()
	m.putLocked(p)
	m.mu.Unlock()
	return p, nil
}

// SetPassword changes a user's password.
func (m *Manager) SetPassword(addr, password string) error {
	p, err := m.users.Get(addr)
	if err != nil {
		return err
	}
	hash, err := userdb.HashPassword(password)
	if err != nil {
		return fmt.Errorf("user %s: %w", p.Address, err)
	}
	np := *p
	np.PasswordHash = hash
	np.Updated = time.Now().UTC()
	if err := m.users.Put(&np); err != nil {
		return err
	}
	m.mu.Lock()
	m.putLocked(&np)
	m.mu.Unlock()
	return nil
}

// DeleteUser removes a user's profile and mail.
func (m *Manager) DeleteUser(addr string) error {
	addr = userdb.Normalize(addr)
	if _, err := m.users.Get(addr); err != nil {
		return err
	}
	if err := m.users.Delete(addr); err != nil {
		return err
	}
	if err := m.boxes.DeleteUser(addr); err != nil {
		return err
	}
	m.mu.Lock()
	if p, ok := m.profiles[addr]; ok {
		m.dropLocked(addr, p)
	}
	delete(m.mailMap, addr)
	m.mu.Unlock()
	return nil
}

// Users returns the cached profiles, sorted by address.
func (m *Manager) Users() []userdb.Profile {
	m.mu.RLock()
	out := make([]userdb.Profile, 0, len(m.profiles))
	for _, p := range m.profiles {
		out = append(out, *p)
	}
	m.mu.RUnlock()
	sort.Slice(out, func(i, j int) bool { return out[i].Address < out[j].Address })
	return out
}

// MailMap returns the nodes holding mailbox fragments of the user.
func (m *Manager) MailMap(addr string) []cluster.NodeID {
	addr = userdb.Normalize(addr)
	m.mu.RLock()
	defer m.mu.RUnlock()
	out := make([]cluster.NodeID, 0, len(m.mailMap[addr]))
	for n := range m.mailMap[addr] {
		out = append(out, n)
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// NoteFragment records that node n now stores mail of the user (Porcupine
// §2.3.1 step 8: the storing node makes its participation known).
func (m *Manager) NoteFragment(addr string, n cluster.NodeID) {
	addr = userdb.Normalize(addr)
	m.mu.RLock()
	known := m.mailMap[addr][n]
	m.mu.RUnlock()
	if known {
		return
	}
	m.mu.Lock()
	m.noteLocked(addr, n)
	m.mu.Unlock()
}

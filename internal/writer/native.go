package writer

// The native storage: the writer over Porcupine's own store. A mailbox's
// messages are in fragments on the nodes of the user's mail map, read and
// merged (view.go) when a view loads; every change is a new version of the
// message object, written through the replication manager (Porcupine §4.4:
// the retrieval agent's update is the deletion or modification of a
// message), stamped by its clock so the writer's changes to one object are
// ordered, and sent to one live replica that coordinates it; the reserved
// ends of the UID and MODSEQ blocks are in the profile.

import (
	"cmp"
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

// Replicator is the node's replication manager, as the writer uses it.
type Replicator interface {
	Write(ctx context.Context, req *replica.WriteRequest) (*replica.WriteReply, error)
	// On returns node n's replication manager (this one, or a client).
	On(n cluster.NodeID) replica.Service
	Now() replica.Stamp
	Observe(replica.Stamp)
}

// Native is the writer's storage on the native store.
type Native struct {
	self  cluster.NodeID
	users Users
	boxes *mailbox.Manager
	repl  Replicator
	peers Peers
	log   *slog.Logger
}

// NewNative returns the native storage of node self.
func NewNative(self cluster.NodeID, users Users, boxes *mailbox.Manager, repl Replicator, peers Peers, log *slog.Logger) *Native {
	return &Native{self: self, users: users, boxes: boxes, repl: repl, peers: peers, log: log}
}

// Reserved: the profile holds the reserved ends already.
func (s *Native) Reserved(context.Context, string, *userdb.MailboxDef, bool) error { return nil }

// Load reads every live fragment in the mail map and merges them. Two
// fragments that claim one UID for different messages (a writer that could
// not see a node's reservation, after a partition) both go to Clash.
func (s *Native) Load(ctx context.Context, user string, def *userdb.MailboxDef, removed func(id string, v replica.Stamp) bool) (Contents, error) {
	partial := false
	mailMap, err := s.users.MailMap(context.Background(), user)
	if err != nil {
		return Contents{}, err
	}
	var frags []fragment
	for _, n := range mailMap {
		fctx, cancel := context.WithTimeout(ctx, fragmentReadTimeout)
		d, err := s.boxes.On(s.peers, n).Get(fctx, &mailbox.FragmentRequest{User: user, UIDValidity: def.UIDValidity})
		cancel()
		if err != nil {
			s.log.Warn("fragment unavailable, its messages are hidden", "user", user, "mailbox", def.Name, "node", n, "err", err)
			partial = true
			continue
		}
		if s.repl != nil {
			for i := range d.Messages {
				s.repl.Observe(d.Messages[i].Version)
			}
		}
		frags = append(frags, fragment{node: n, d: d})
	}
	c := merge(frags, removed)
	c.Partial = partial
	return c, nil
}

// Write writes each change through a coordinator, grouping changes that
// share coordinator and targets into one call, and sets each change's Err.
func (s *Native) Write(ctx context.Context, changes []*Change) {
	alive := map[cluster.NodeID]bool{}
	for _, mi := range s.peers.Alive() {
		alive[mi.ID] = true
	}
	type group struct {
		coord   cluster.NodeID
		targets []cluster.NodeID
		policy  replica.Policy
		members []*Change
	}
	groups := map[string]*group{}
	var order []string
	for _, c := range changes {
		if len(c.Obj.Replicas) == 0 { // stored before replication
			c.Obj.Replicas = slices.Clone(c.Holders)
		}
		targets := cluster.NodeSet(append(slices.Clone(c.Obj.Replicas), c.Leaving...))
		coord := cluster.NodeID("")
		for _, n := range c.Holders {
			if !alive[n] || !slices.Contains(targets, n) {
				continue
			}
			if n == s.self {
				coord = n
				break
			}
			if coord == "" {
				coord = n
			}
		}
		if coord == "" {
			c.Err = fmt.Errorf("user %s message %s: no live replica (holders %v)", c.Obj.User, c.Obj.ID, c.Holders)
			continue
		}
		key := string(coord) + "|" + joinIDs(targets) + "|" + string(c.Policy)
		g := groups[key]
		if g == nil {
			g = &group{coord: coord, targets: targets, policy: c.Policy}
			groups[key] = g
			order = append(order, key)
		}
		g.members = append(g.members, c)
	}
	for _, key := range order {
		g := groups[key]
		stamp := s.repl.Now()
		req := &replica.WriteRequest{Policy: cmp.Or(g.policy, replica.One)}
		for _, c := range g.members {
			c.Stamp = stamp
			u, err := c.Obj.Update(stamp, g.targets, nil)
			if err != nil {
				c.Err = err
				continue
			}
			req.Updates = append(req.Updates, u)
		}
		_, err := s.repl.On(g.coord).Write(ctx, req)
		for _, c := range g.members {
			if c.Err == nil && err != nil {
				c.Err = fmt.Errorf("user %s message %s: update through %s: %w", c.Obj.User, c.Obj.ID, g.coord, err)
			}
		}
	}
}

// Reserve writes the ends into the profile, on at least one replica, so
// delivery goes on while one replica is away (BLUEPRINT invariant 2).
func (s *Native) Reserve(ctx context.Context, p *userdb.Profile, def *userdb.MailboxDef, uidEnd uint32, modEnd uint64) error {
	def.UIDReserved, def.ModSeqReserved = uidEnd, modEnd
	return s.users.SaveProfile(ctx, p, 1)
}

// Release writes the ends into the profile.
func (s *Native) Release(ctx context.Context, p *userdb.Profile, ends []Ends) error {
	if len(ends) == 0 {
		return nil
	}
	for _, e := range ends {
		e.Def.UIDReserved, e.Def.ModSeqReserved = e.UIDNext, e.ModSeq
	}
	return s.users.SaveProfile(ctx, p, 1)
}

// KeepCounters: a fragment keeps its own UIDNEXT and HIGHESTMODSEQ.
func (s *Native) KeepCounters(context.Context, string, *userdb.MailboxDef, uint32, uint64) error {
	return nil
}

// SaveMailboxes: the profile is where mailboxes are defined.
func (s *Native) SaveMailboxes(context.Context, *userdb.Profile) error { return nil }

// DropMailbox drops the mailbox's fragment on every node of the mail map.
func (s *Native) DropMailbox(ctx context.Context, user string, v uint32) error {
	mailMap, _ := s.users.MailMap(context.Background(), user)
	for _, n := range mailMap {
		req := &mailbox.FragmentRequest{User: user, UIDValidity: v}
		if err := s.boxes.On(s.peers, n).Drop(ctx, req); err != nil {
			// The node's fragment stays until it stores into a mailbox of
			// that name again, which replaces it; it is never shown.
			s.log.Warn("could not drop a deleted mailbox's fragment", "user", user, "node", n, "err", err)
		}
	}
	return nil
}

// DropUser drops the user's fragments on the nodes of the mail map as it is
// before the tombstone.
func (s *Native) DropUser(ctx context.Context, user string, _ *userdb.Profile) func(context.Context) {
	mailMap, _ := s.users.MailMap(context.Background(), user)
	return func(ctx context.Context) {
		for _, n := range mailMap {
			s.boxes.On(s.peers, n).DropUser(ctx, &mailbox.FragmentRequest{User: user})
		}
	}
}

// NewMessageID returns a new message id.
func (s *Native) NewMessageID() string { return s.boxes.NewMessageID() }

// Observe moves the replication manager's clock past s.
func (s *Native) Observe(st replica.Stamp) {
	if s.repl != nil {
		s.repl.Observe(st)
	}
}

// Opened: the native store holds nothing per writer.
func (s *Native) Opened(uint8) {}

// audit asks node n (this node directly) about its fragments (audit.go).
func (s *Native) audit(ctx context.Context, n cluster.NodeID, req *mailbox.AuditRequest, timeout time.Duration) (*mailbox.AuditReply, error) {
	cctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	return s.boxes.On(s.peers, n).Audit(cctx, req)
}

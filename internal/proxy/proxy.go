// Package proxy is the protocol-independent half of the delivery and
// retrieval proxies of Porcupine §2.3: the SMTP, POP3 and IMAP servers parse
// their protocols and call this package, which resolves the user through the
// user manager (on whichever node manages the user's bucket), lets the load
// balancer choose where mail goes, and reaches the mailbox managers — the
// local one directly, the others by RPC. The proxies hold no hard state.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/balance"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/usermgr"
)

var (
	// ErrUnknownUser: the recipient's domain is ours but the user is not.
	ErrUnknownUser = errors.New("no such user here")
	// ErrForeignDomain: we do not serve the recipient's domain (and do not
	// relay for unauthenticated senders).
	ErrForeignDomain = errors.New("domain not served here")
)

// storeAttempts bounds how many nodes a delivery tries before giving up
// with a temporary failure: the first choice and, if it fails, others
// (Porcupine §4.1: the proxy picks another node when one fails).
const storeAttempts = 3

// Peers is what the proxy needs of the cluster.
type Peers interface {
	Alive() []cluster.MemberInfo
	Call(ctx context.Context, node cluster.NodeID, method string, req, resp any) error
}

// Proxy joins the managers of one node for the protocol servers.
type Proxy struct {
	Self  cluster.NodeID
	Users *usermgr.Manager
	Boxes *mailbox.Manager
	Peers Peers
	Loads *balance.Tracker
	// Spread is how many nodes a user's mail may spread over.
	Spread int

	rndMu sync.Mutex
	rnd   *rand.Rand
}

func (p *Proxy) choose(holders []cluster.NodeID, spread int, exclude map[cluster.NodeID]bool) (cluster.NodeID, bool) {
	if spread <= 0 {
		spread = p.Spread
	}
	var live []cluster.NodeID
	for _, m := range p.Peers.Alive() {
		if !exclude[m.ID] {
			live = append(live, m.ID)
		}
	}
	p.rndMu.Lock()
	defer p.rndMu.Unlock()
	if p.rnd == nil {
		p.rnd = rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))
	}
	return balance.Choose(holders, live, spread, p.Loads.Get, p.rnd)
}

// CheckRecipient says whether mail for addr is accepted here: nil, or an
// error wrapping ErrUnknownUser or ErrForeignDomain, or another error when
// the user's manager cannot be reached (a temporary failure).
func (p *Proxy) CheckRecipient(ctx context.Context, addr string) error {
	addr = userdb.Normalize(addr)
	_, _, err := p.Users.Lookup(ctx, addr)
	if err == nil {
		return nil
	}
	if !errors.Is(err, usermgr.ErrUnknownUser) {
		return err
	}
	if !p.Users.ServesDomain(userdb.Domain(addr)) {
		return fmt.Errorf("recipient %s: %w", addr, ErrForeignDomain)
	}
	return fmt.Errorf("recipient %s: %w", addr, ErrUnknownUser)
}

// Deliver stores one message for every recipient (Porcupine §2.3.1): for
// each recipient the mailbox's writer on the user's manager hands out the
// UID and says where the user's mail already is (the mail map); the
// balancer chooses the storing node, whose mailbox manager stores the
// message; then the writer is told, and records the node in the mail map.
// Recipients stored on one node share one write and one fsync. It returns
// only once the message is durable for every recipient.
func (p *Proxy) Deliver(ctx context.Context, rcpts []string, raw []byte) error {
	start := time.Now()
	var users []string
	seen := map[string]bool{}
	for _, r := range rcpts {
		if u := userdb.Normalize(r); !seen[u] {
			seen[u] = true
			users = append(users, u)
		}
	}
	if _, err := p.place(ctx, users, mailbox.Inbox, nil, raw, start); err != nil {
		return err
	}
	metrics.DeliverySeconds.Observe(time.Since(start).Seconds())
	metrics.Delivered.Add(float64(len(users)))
	return nil
}

// place stores raw into mailbox name of every user, choosing a node per
// user and retrying on other nodes when one fails (Porcupine §4.1). It
// returns the index record stored for each user.
func (p *Proxy) place(ctx context.Context, users []string, name string, flags []string, raw []byte, date time.Time) (map[string]mailbox.Message, error) {
	pending := users
	failed := map[cluster.NodeID]bool{}
	id := p.Boxes.NewMessageID()
	stored := map[string]mailbox.Message{}
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == storeAttempts {
			return nil, fmt.Errorf("deliver to %v: no node could store the message after %d attempts", pending, attempt)
		}
		groups := map[cluster.NodeID][]mailbox.Placed{}
		for _, u := range pending {
			a, err := usermgr.Writer(ctx, p.Users, u, "writer.Alloc", &usermgr.AllocRequest{User: u, Mailbox: name, From: p.member(p.Self)}, p.Users.LocalAlloc)
			if err != nil {
				return nil, err
			}
			n, ok := p.choose(a.MailMap, a.Spread, failed)
			if !ok {
				p.confirm(ctx, &usermgr.ConfirmRequest{Place: a.Place, Cancel: true})
				return nil, fmt.Errorf("deliver to %s: no live node with disk space", u)
			}
			a.Place.Flags = flags
			groups[n] = append(groups[n], a.Place)
		}
		pending = nil
		for n, places := range groups {
			err := p.storeOn(ctx, n, places, id, raw, date)
			for _, pl := range places {
				msg := mailbox.Message{UID: pl.UID, ID: id, Size: int64(len(raw)), Date: date, Flags: pl.Flags, ModSeq: pl.ModSeq}
				p.confirm(ctx, &usermgr.ConfirmRequest{Place: pl, Message: msg, Node: n, Cancel: err != nil})
				if err == nil {
					stored[pl.User] = msg
				}
			}
			if err != nil {
				failed[n] = true
				for _, pl := range places {
					pending = append(pending, pl.User)
				}
			}
		}
	}
	return stored, nil
}

// confirmAttempts and confirmBackoff bound how hard a proxy tries to tell
// the writer that a message was stored (or not): the writer may be paused
// or failing over. If it never hears, the allocation expires and the writer
// loads the mailbox again from the fragments, which finds the message.
const (
	confirmAttempts = 4
	confirmBackoff  = 500 * time.Millisecond
)

// confirm tells the writer the outcome of a store, retrying while the
// writer is unreachable.
func (p *Proxy) confirm(ctx context.Context, c *usermgr.ConfirmRequest) {
	for i := 0; i < confirmAttempts; i++ {
		if _, err := usermgr.Writer(ctx, p.Users, c.Place.User, "writer.Confirm", c, p.Users.LocalConfirm); err == nil {
			return
		}
		select {
		case <-time.After(confirmBackoff << i):
		case <-ctx.Done():
			return
		}
	}
}

// member returns a live node with its boot.
func (p *Proxy) member(n cluster.NodeID) cluster.Member {
	for _, m := range p.Peers.Alive() {
		if m.ID == n {
			return m.Member
		}
	}
	return cluster.Member{}
}

func (p *Proxy) storeOn(ctx context.Context, n cluster.NodeID, places []mailbox.Placed, id string, raw []byte, date time.Time) error {
	if n == p.Self {
		return p.Boxes.StoreAt(places, id, raw, date)
	}
	return p.Peers.Call(ctx, n, "fragment.StoreAt", &mailbox.StoreAtRequest{Places: places, ID: id, Raw: raw, Date: date}, &mailbox.Empty{})
}

// Login authenticates a user for a retrieval session.
func (p *Proxy) Login(ctx context.Context, user, password string) (*userdb.Profile, error) {
	return p.Users.Authenticate(ctx, user, password)
}

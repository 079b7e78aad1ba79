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
// each recipient ask the user's manager for the mail map, let the balancer
// choose the storing node, get the message's UID from the mailbox's writer,
// and hand the message to the storing node's mailbox manager; then confirm
// to the writer, which records the node in the mail map. Recipients stored
// on one node share one write and one fsync. It returns only once the
// message is durable for every recipient.
func (p *Proxy) Deliver(ctx context.Context, rcpts []string, raw []byte) error {
	start := time.Now()
	holders := map[string]target{}
	var users []string
	for _, r := range rcpts {
		u := userdb.Normalize(r)
		if _, ok := holders[u]; ok {
			continue
		}
		prof, mm, err := p.Users.Lookup(ctx, u)
		if err != nil {
			return err
		}
		holders[u] = target{mailMap: mm, spread: prof.Spread}
		users = append(users, u)
	}
	if err := p.place(ctx, users, holders, mailbox.Inbox, nil, raw, start); err != nil {
		return err
	}
	metrics.DeliverySeconds.Observe(time.Since(start).Seconds())
	metrics.Delivered.Add(float64(len(users)))
	return nil
}

// target is what placement needs of a user: where its mail is and how far
// it may spread.
type target struct {
	mailMap []cluster.NodeID
	spread  int
}

// place stores raw into mailbox name of every user, choosing a node per
// user and retrying on other nodes when one fails (Porcupine §4.1).
func (p *Proxy) place(ctx context.Context, users []string, holders map[string]target, name string, flags []string, raw []byte, date time.Time) error {
	pending := users
	failed := map[cluster.NodeID]bool{}
	id := p.Boxes.NewMessageID()
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == storeAttempts {
			return fmt.Errorf("deliver to %v: no node could store the message after %d attempts", pending, attempt)
		}
		groups := map[cluster.NodeID][]mailbox.Placed{}
		for _, u := range pending {
			n, ok := p.choose(holders[u].mailMap, holders[u].spread, failed)
			if !ok {
				return fmt.Errorf("deliver to %s: no live node with disk space", u)
			}
			a, err := usermgr.Writer(ctx, p.Users, u, "writer.Alloc", &usermgr.AllocRequest{User: u, Mailbox: name, From: p.member(p.Self)}, p.Users.LocalAlloc)
			if err != nil {
				return err
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
			}
			if err != nil {
				failed[n] = true
				for _, pl := range places {
					pending = append(pending, pl.User)
				}
			}
		}
	}
	return nil
}

// placeOne stores one message for one user into a named mailbox and
// returns its index record.
func (p *Proxy) placeOne(ctx context.Context, user string, t target, name string, flags []string, raw []byte, date time.Time, got *mailbox.Message) error {
	n, ok := p.choose(t.mailMap, t.spread, nil)
	if !ok {
		return fmt.Errorf("append for %s: no live node with disk space", user)
	}
	a, err := usermgr.Writer(ctx, p.Users, user, "writer.Alloc", &usermgr.AllocRequest{User: user, Mailbox: name, From: p.member(p.Self)}, p.Users.LocalAlloc)
	if err != nil {
		return err
	}
	a.Place.Flags = flags
	id := p.Boxes.NewMessageID()
	serr := p.storeOn(ctx, n, []mailbox.Placed{a.Place}, id, raw, date)
	*got = mailbox.Message{UID: a.Place.UID, ID: id, Size: int64(len(raw)), Date: date, Flags: flags, ModSeq: a.Place.ModSeq}
	p.confirm(ctx, &usermgr.ConfirmRequest{Place: a.Place, Message: *got, Node: n, Cancel: serr != nil})
	return serr
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

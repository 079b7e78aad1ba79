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

func (p *Proxy) choose(holders []cluster.NodeID, exclude map[cluster.NodeID]bool) (cluster.NodeID, bool) {
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
	return balance.Choose(holders, live, p.Spread, p.Loads.Get, p.rnd)
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
// choose the storing node, and hand the message to that node's mailbox
// manager, which records itself in the mail map. Recipients that go to the
// same node share one write and one fsync. It returns only once the message
// is durable for every recipient.
func (p *Proxy) Deliver(ctx context.Context, rcpts []string, raw []byte) error {
	start := time.Now()
	holders := map[string][]cluster.NodeID{}
	var users []string
	for _, r := range rcpts {
		u := userdb.Normalize(r)
		if _, ok := holders[u]; ok {
			continue
		}
		_, mm, err := p.Users.Lookup(ctx, u)
		if err != nil {
			return err
		}
		holders[u] = mm
		users = append(users, u)
	}
	pending := users
	failed := map[cluster.NodeID]bool{}
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == storeAttempts {
			return fmt.Errorf("deliver to %v: no node could store the message after %d attempts", pending, attempt)
		}
		groups := map[cluster.NodeID][]string{}
		for _, u := range pending {
			n, ok := p.choose(holders[u], failed)
			if !ok {
				return fmt.Errorf("deliver to %s: no live node with disk space", u)
			}
			groups[n] = append(groups[n], u)
		}
		pending = nil
		for n, us := range groups {
			if err := p.storeOn(ctx, n, us, raw); err != nil {
				failed[n] = true
				pending = append(pending, us...)
				continue
			}
		}
	}
	metrics.DeliverySeconds.Observe(time.Since(start).Seconds())
	metrics.Delivered.Add(float64(len(users)))
	return nil
}

// StoreRequest asks a node's mailbox manager to store a message.
type StoreRequest struct {
	Users []string `json:"users"`
	Raw   []byte   `json:"raw"`
}

func (p *Proxy) storeOn(ctx context.Context, n cluster.NodeID, users []string, raw []byte) error {
	if n == p.Self {
		_, err := p.LocalStore(ctx, &StoreRequest{Users: users, Raw: raw})
		return err
	}
	return p.Peers.Call(ctx, n, "mailbox.Store", &StoreRequest{Users: users, Raw: raw}, &struct{}{})
}

// LocalStore stores a message in this node's fragments and records the node
// in each user's mail map (Porcupine Fig. 4, steps 7 and 8). The message is
// durable before the mail map is told, so a failure after the store leaves
// a fragment the next soft-state reconstruction finds anyway.
func (p *Proxy) LocalStore(ctx context.Context, req *StoreRequest) (*struct{}, error) {
	if _, err := p.Boxes.Deliver(req.Users, req.Raw, time.Now()); err != nil {
		return nil, err
	}
	for _, u := range req.Users {
		if err := p.Users.NoteFragment(ctx, u, p.Self); err != nil {
			// Not fatal: the fragment is on disk and the manager's next
			// scan of this node finds it.
			continue
		}
	}
	return &struct{}{}, nil
}

// Login authenticates a user for a retrieval session.
func (p *Proxy) Login(ctx context.Context, user, password string) (*userdb.Profile, error) {
	return p.Users.Authenticate(ctx, user, password)
}

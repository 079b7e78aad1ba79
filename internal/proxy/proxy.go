// Package proxy is the protocol-independent half of the delivery and
// retrieval proxies of Porcupine §2.3: the SMTP, POP3 and IMAP servers parse
// their protocols and call this package, which resolves the user through the
// user manager, chooses where mail goes, and reaches the mailbox managers.
// The proxies hold no hard state.
//
// On one node the mail map names only this node; the call sequence —
// user manager, then placement, then mailbox manager, then recording the
// fragment in the mail map — is the one Porcupine Fig. 4 shows.
package proxy

import (
	"context"
	"errors"
	"fmt"
	"time"

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

// Proxy joins the managers of one node for the protocol servers.
type Proxy struct {
	Self  cluster.NodeID
	Users *usermgr.Manager
	Boxes *mailbox.Manager
}

// CheckRecipient says whether mail for addr is accepted here.
func (p *Proxy) CheckRecipient(addr string) error {
	addr = userdb.Normalize(addr)
	if _, err := p.Users.Lookup(addr); err == nil {
		return nil
	}
	if !p.Users.ServesDomain(userdb.Domain(addr)) {
		return fmt.Errorf("recipient %s: %w", addr, ErrForeignDomain)
	}
	return fmt.Errorf("recipient %s: %w", addr, ErrUnknownUser)
}

// Deliver stores one message for every recipient (Porcupine §2.3.1): look
// up each recipient's manager and mail map, choose the storing node, hand
// the message to its mailbox manager, and record the fragment. It returns
// only once the message is durable for every recipient.
func (p *Proxy) Deliver(ctx context.Context, rcpts []string, raw []byte) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	users := make([]string, 0, len(rcpts))
	for _, r := range rcpts {
		u := userdb.Normalize(r)
		if _, err := p.Users.Lookup(u); err != nil {
			return fmt.Errorf("recipient %s: %w", u, ErrUnknownUser)
		}
		users = append(users, u)
	}
	// One node: every fragment is local, so all recipients go in one
	// batch and share one fsync.
	start := time.Now()
	if _, err := p.Boxes.Deliver(users, raw, start); err != nil {
		return err
	}
	metrics.DeliverySeconds.Observe(time.Since(start).Seconds())
	metrics.Delivered.Add(float64(len(users)))
	for _, u := range users {
		p.Users.NoteFragment(u, p.Self)
	}
	return nil
}

// Login authenticates a user for a retrieval session.
func (p *Proxy) Login(ctx context.Context, user, password string) (*userdb.Profile, error) {
	return p.Users.Authenticate(user, password)
}

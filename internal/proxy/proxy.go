// Package proxy is the protocol-independent half of the delivery and
// retrieval proxies of Porcupine §2.3: the SMTP, POP3 and IMAP servers parse
// their protocols and call this package, which resolves the user through the
// user manager (on whichever node manages the user's bucket), lets the load
// balancer choose where mail goes, and reaches the mailbox managers — the
// local one directly, the others by RPC. The proxies hold no hard state.
package proxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"slices"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/balance"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/domain"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/retry"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/saslsrv"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/usermgr"
	"github.com/quillmail/quill/internal/writer"
	"github.com/xdg-go/scram"
)

var (
	// ErrForeignDomain: we do not serve the recipient's domain (and do not
	// relay for unauthenticated senders).
	ErrForeignDomain = errors.New("domain not served here")
	// ErrTryLater is a temporary failure (SMTP 4xx, IMAP UNAVAILABLE).
	ErrTryLater = errors.New("try again later")
)

// NoStorage reports whether a delivery failed for want of disk space on
// a node (a store's reserve refused the write, or a replica refuses
// content; the meaning crosses RPC as rpc.ErrNoSpace): SMTP's 452 4.3.1, a
// temporary failure a sender retries later.
func NoStorage(err error) bool { return errors.Is(err, rpc.ErrNoSpace) }

// storeAttempts bounds how many nodes a delivery tries before giving up
// with a temporary failure: the first choice and, if it fails, others
// (Porcupine §4.1: the proxy picks another node when one fails).
const storeAttempts = 3

// Peers is what the proxy needs of the cluster.
type Peers interface {
	Alive() []cluster.MemberInfo
	Degraded() bool
	cluster.Conns
}

// Proxy joins the managers of one node for the protocol servers.
type Proxy struct {
	Self  cluster.NodeID
	Users *usermgr.Manager
	// Writers are the node's mailbox writers (those of the users whose
	// bucket it manages); calls reach any user's through Writers.For.
	Writers *writer.Manager
	Boxes   *mailbox.Manager
	Peers   Peers
	Loads   *balance.Tracker
	// Placer chooses every new message's replica set (Porcupine §5).
	Placer *balance.Placer
	// Repl is the node's replication manager; Replicas and Policy are the
	// cluster's defaults for users who set none.
	Repl     *replica.Manager
	Replicas int
	Policy   replica.Policy
	// Domains are the cluster's served domains and aliases (nil: none,
	// users only); Separator splits sub-addresses (RFC 5233, "": none).
	Domains   domain.Tables
	Separator string
	Log       *slog.Logger // nil: slog's default
	// Shared, when set, is the store every node reaches (Cassandra, issue
	// 15) that holds every message: deliveries write there under the
	// allocated UID instead of to a replica set, and bodies are read from
	// it. Nil: the native store.
	Shared Messages

	// late are the holders that were slow to give a body lately
	// (remote.go).
	late late
}

func (p *Proxy) log() *slog.Logger {
	if p.Log != nil {
		return p.Log
	}
	return slog.Default()
}

// CheckRecipient says whether mail of size bytes (0: not known yet) for
// addr is accepted here: nil, or an error wrapping userdb.ErrNotFound,
// ErrForeignDomain or userdb.ErrOverQuota (with userdb.ErrQuotaFinal when
// the user's domain makes quota refusals permanent), or another error when
// the user's manager cannot be reached (a temporary failure). limited says
// the user or their domain has a quota, so a message larger than size is
// worth checking again once its real size is known; for anyone else no
// size can be refused.
func (p *Proxy) CheckRecipient(ctx context.Context, addr string, size int64) (limited bool, err error) {
	addr = userdb.Normalize(addr)
	lctx, cancel := context.WithTimeout(ctx, writerCallTimeout)
	defer cancel()
	prof, _, err := p.Users.Lookup(lctx, addr)
	if err == nil {
		var dom domain.Domain
		if p.Domains != nil {
			dom, _ = p.Domains.Domain(userdb.Domain(prof.Address))
		}
		return prof.QuotaStorage > 0 || prof.QuotaMessages > 0 || dom.Limited(), p.checkQuota(lctx, prof, dom, size)
	}
	if !errors.Is(err, userdb.ErrNotFound) {
		return false, err
	}
	if p.Peers.Degraded() {
		// The user's profile may be on a node that is down or cut off: a
		// bounce would be final, so ask the sender to try later.
		return false, fmt.Errorf("recipient %s: not found while some nodes are unreachable: %w", addr, ErrTryLater)
	}
	if !p.ServesDomain(userdb.Domain(addr)) {
		return false, fmt.Errorf("recipient %s: %w", addr, ErrForeignDomain)
	}
	return false, fmt.Errorf("recipient %s: %w", addr, userdb.ErrNotFound)
}

// Recipients says which users receive mail of size bytes (0: not known
// yet) sent to addr, and which of them have a quota (limited): addr itself
// when it is a user; an alias's targets, looked at first (as Postfix's
// virtual aliases are); else the first of domain.Fallbacks (the address
// without its sub-address tag, the domain's postmaster for a role address,
// its catch-all) that reaches a user. The errors are CheckRecipient's: a
// target over its quota refuses the whole address (452 for all rather
// than a message split between its targets), a target that is no user
// here (deleted since, or elsewhere) is left out and logged.
func (p *Proxy) Recipients(ctx context.Context, addr string, size int64) (users, limited []string, err error) {
	addr = userdb.Normalize(addr)
	if p.Domains != nil {
		if targets, ok := domain.Expand(addr, p.Domains); ok {
			return p.targets(ctx, addr, targets, size, true)
		}
	}
	lim, err := p.CheckRecipient(ctx, addr, size)
	if err == nil {
		if lim {
			limited = []string{addr}
		}
		return []string{addr}, limited, nil
	}
	if !errors.Is(err, userdb.ErrNotFound) || p.Domains == nil {
		return nil, nil, err
	}
	for _, fb := range domain.Fallbacks(addr, p.Separator, p.Domains) {
		targets, isAlias := domain.Expand(fb, p.Domains)
		if !isAlias {
			targets = []string{fb}
		}
		u, l, ferr := p.targets(ctx, addr, targets, size, isAlias)
		if errors.Is(ferr, userdb.ErrNotFound) {
			continue
		}
		return u, l, ferr
	}
	return nil, nil, err
}

// targets checks each address addr stands for, as Recipients says; a
// missing target of an alias is logged (an operator's dangling alias),
// one of a fallback is not (anyone can probe x+y@).
func (p *Proxy) targets(ctx context.Context, addr string, targets []string, size int64, alias bool) (users, limited []string, err error) {
	var over error
	allFinal := true
	for _, t := range targets {
		lim, err := p.CheckRecipient(ctx, t, size)
		switch {
		case err == nil:
			users = append(users, t)
			if lim {
				limited = append(limited, t)
			}
		case errors.Is(err, userdb.ErrOverQuota):
			// The whole address waits (452 for all rather than a
			// message split between its targets); it is refused for
			// good only if every target is full for good.
			if over == nil {
				over = err
			}
			allFinal = allFinal && errors.Is(err, userdb.ErrQuotaFinal)
		case errors.Is(err, userdb.ErrNotFound) || errors.Is(err, ErrForeignDomain):
			if !alias {
				continue
			}
			p.log().Warn("alias target is not a user here; left out", "address", addr, "target", t)
		default:
			return nil, nil, fmt.Errorf("address %s: %w", addr, err)
		}
	}
	switch {
	case over != nil && allFinal && len(users) == 0:
		return nil, nil, fmt.Errorf("address %s: %w", addr, over)
	case over != nil:
		return nil, nil, fmt.Errorf("address %s: %v: %w", addr, over, userdb.ErrOverQuota)
	case len(users) == 0:
		return nil, nil, fmt.Errorf("address %s: none of %s is a user here: %w", addr, strings.Join(targets, ", "), userdb.ErrNotFound)
	}
	return users, limited, nil
}

// checkQuota refuses a message that would take a user with a quota past
// it (RFC 9208 §5.1 for IMAP; for SMTP, what the recipient's size allows
// when the message is announced), or the user's domain past the domain's.
// A user with no limits costs nothing more; a user with limits, a look at
// the writer's usage; a domain with limits, a look at its summed usage
// (usermgr.DomainUsage, at most domainUsageTTL old).
func (p *Proxy) checkQuota(ctx context.Context, prof *userdb.Profile, dom domain.Domain, size int64) error {
	// partial says the figure may be off: a permanent refusal needs a
	// whole one.
	refuse := func(err error, partial bool) error {
		if dom.QuotaPermanent && !partial {
			return fmt.Errorf("%w (%w)", err, userdb.ErrQuotaFinal)
		}
		return err
	}
	if prof.QuotaStorage > 0 || prof.QuotaMessages > 0 {
		rep, err := p.usage(ctx, prof.Address)
		if err != nil {
			return fmt.Errorf("recipient %s: quota: %w", prof.Address, err)
		}
		if rep.Usage.Over(1, size) {
			return refuse(fmt.Errorf("recipient %s: %s: %w", prof.Address, rep.Usage, userdb.ErrOverQuota), false)
		}
	}
	if partial, err := p.domainRoom(ctx, prof.Address, dom, 1, size); err != nil {
		return refuse(fmt.Errorf("recipient %w", err), partial)
	}
	return nil
}

// domainRoom refuses n messages of size bytes in all that would take
// user's domain dom past its quota, with an error wrapping
// userdb.ErrOverQuota; partial says the domain's figure may be off (a
// bucket's manager did not answer). A domain without limits costs nothing.
func (p *Proxy) domainRoom(ctx context.Context, user string, dom domain.Domain, n, size int64) (partial bool, err error) {
	if !dom.Limited() {
		return false, nil
	}
	du, err := p.Users.DomainUsage(ctx, dom.Name)
	if err != nil {
		// The user's own quota still holds; a domain's figure that cannot
		// be had now does not hold mail back.
		p.log().Warn("domain quota not checked: usage unknown", "domain", dom.Name, "user", user, "err", err)
		return false, nil
	}
	u := mailbox.Usage{Storage: du.Storage, Messages: du.Messages, QuotaStorage: dom.QuotaStorage, QuotaMessages: dom.QuotaMessages}
	if u.Over(n, size) {
		return du.Partial, fmt.Errorf("%s: domain %s: %s: %w", user, dom.Name, u, userdb.ErrOverQuota)
	}
	return false, nil
}

// DomainRoom refuses n messages of size bytes in all that would take the
// domain of user past the domain's quota (IMAP APPEND and COPY; delivery
// checks it in CheckRecipient), with an error wrapping
// userdb.ErrOverQuota.
func (p *Proxy) DomainRoom(ctx context.Context, user string, n, size int64) error {
	if p.Domains == nil {
		return nil
	}
	dom, _ := p.Domains.Domain(userdb.Domain(user))
	_, err := p.domainRoom(ctx, user, dom, n, size)
	return err
}

// usage lists a user's mailboxes with what their mail takes, counted by
// the writer only for a user with quota limits.
func (p *Proxy) usage(ctx context.Context, user string) (*writer.MailboxesReply, error) {
	rep, err := p.Writers.For(user).Mailboxes(ctx, &writer.MailboxRequest{User: user, Usage: true})
	if err != nil {
		return &writer.MailboxesReply{}, err
	}
	return rep, nil
}

// ServesDomain reports whether the cluster serves a domain (it was added,
// or any live node holds a profile in it): mail for other domains leaves
// through the outbound queue.
func (p *Proxy) ServesDomain(name string) bool {
	if p.Domains != nil {
		if _, ok := p.Domains.Domain(domain.Normalize(name)); ok {
			return true
		}
	}
	return p.Users.ServesDomain(name)
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
	users := uniqueUsers(rcpts)
	if _, err := p.place(ctx, users, mailbox.Inbox, nil, raw, start); err != nil {
		return err
	}
	delivered(start, len(users))
	return nil
}

// uniqueUsers normalizes the recipients and drops repeats, in order.
func uniqueUsers(rcpts []string) []string {
	var users []string
	seen := map[string]bool{}
	for _, r := range rcpts {
		if u := userdb.Normalize(r); !seen[u] {
			seen[u] = true
			users = append(users, u)
		}
	}
	return users
}

// delivered counts a delivery begun at start to n users.
func delivered(start time.Time, n int) {
	metrics.DeliverySeconds.Observe(time.Since(start).Seconds())
	metrics.Delivered.Add(float64(n))
}

// DeliverJunk stores a message the sender's DMARC policy asks to
// quarantine (RFC 7489 §6.3) into each recipient's junk mailbox: the one
// marked \Junk (RFC 6154; every user gets "Junk"), or INBOX for a user
// who has none.
func (p *Proxy) DeliverJunk(ctx context.Context, rcpts []string, raw []byte) error {
	start := time.Now()
	byBox := map[string][]string{}
	var order []string
	users := uniqueUsers(rcpts)
	for _, u := range users {
		name := mailbox.Inbox
		lctx, cancel := context.WithTimeout(ctx, writerCallTimeout)
		rep, err := p.Writers.For(u).Mailboxes(lctx, &writer.MailboxRequest{User: u})
		cancel()
		if err != nil {
			return err
		}
		for _, mb := range rep.Mailboxes {
			if mb.SpecialUse == `\Junk` {
				name = mb.Name
				break
			}
		}
		if _, ok := byBox[name]; !ok {
			order = append(order, name)
		}
		byBox[name] = append(byBox[name], u)
	}
	for _, name := range order {
		if _, err := p.place(ctx, byBox[name], name, nil, raw, start); err != nil {
			return err
		}
	}
	delivered(start, len(users))
	return nil
}

// Messages is a message store every node reads and writes
// (cassandra.Store): it replicates by itself, at the consistency level it
// was opened with, which stands for the native write policy.
type Messages interface {
	PutBody(ctx context.Context, user, id string, r io.Reader) (int64, error)
	PutMessage(ctx context.Context, user string, v uint32, msg *mailbox.Message) error
	OpenBody(ctx context.Context, user, id string) (io.Reader, int64, error)
	Body(ctx context.Context, user, id string) ([]byte, error)
}

// place stores raw into mailbox name of every user (Porcupine §4.3): for
// each user the writer allocates the UID, the balancer chooses the user's
// replica set (R nodes), and one node of the set coordinates the update
// through its replication manager, answering once the user's write policy
// is met. Users with the same replica set share one update and one fsync per
// replica. When the coordinator fails, or the policy cannot be met, the
// message is placed again as a new object on a new set (§4.4: duplicates
// are possible, loss is not). It returns the index record stored for each
// user.
func (p *Proxy) place(ctx context.Context, users []string, name string, flags []string, raw []byte, date time.Time) (map[string]mailbox.Message, error) {
	return p.placeTracked(ctx, users, name, flags, raw, date, nil)
}

// placeTracked is place, calling confirmed (when not nil) for every
// message it confirms to a writer: the one returned, and the copies of
// attempts that missed their policy but were stored somewhere (a
// MULTIAPPEND that fails removes those too).
func (p *Proxy) placeTracked(ctx context.Context, users []string, name string, flags []string, raw []byte, date time.Time,
	confirmed func(user string, m mailbox.Message)) (map[string]mailbox.Message, error) {
	if p.Shared != nil {
		return p.placeShared(ctx, users, name, flags, raw, date, confirmed)
	}
	pending := users
	failed := map[cluster.NodeID]bool{}
	stored := map[string]mailbox.Message{}
	var lastErr error
	for attempt := 0; len(pending) > 0; attempt++ {
		if attempt == storeAttempts {
			return nil, fmt.Errorf("deliver to %v: no replica set could store the message after %d attempts: %w", pending, attempt, lastErr)
		}
		// A new object id per attempt: a failed attempt may still have
		// stored its object somewhere, and it stays a message of its own.
		id := p.Boxes.NewMessageID()
		type group struct {
			set    []cluster.NodeID
			policy replica.Policy
			want   int
			places []mailbox.Placed
			objs   []*mailbox.Object
		}
		groups := map[string]*group{}
		var order []string
		for _, u := range pending {
			actx, cancel := context.WithTimeout(ctx, writerCallTimeout)
			a, err := p.Writers.For(u).Alloc(actx, &writer.AllocRequest{User: u, Mailbox: name, From: p.member(p.Self)})
			cancel()
			if err != nil {
				return nil, err
			}
			want := a.Replicas
			if want <= 0 {
				want = p.Replicas
			}
			policy := a.Policy
			if policy == "" {
				policy = p.Policy
			}
			set := p.Placer.Place(u, a.MailMap, a.Spread, max(want, 1), failed)
			if len(set) == 0 || len(set) < policy.Need(want) {
				p.confirm(ctx, &writer.ConfirmRequest{Place: a.Place, Cancel: true})
				why := "no earlier attempt"
				if lastErr != nil {
					why = "last attempt: " + lastErr.Error()
				}
				return nil, fmt.Errorf("deliver to %s: write policy %s needs %d of %d replicas, %d live nodes with disk space to choose from (%s): %w",
					u, policy, policy.Need(want), want, len(set), why, ErrTryLater)
			}
			a.Place.Flags = flags
			o := &mailbox.Object{User: a.Place.User, ID: id, Mailbox: a.Place.Mailbox, UIDValidity: a.Place.UIDValidity,
				UID: a.Place.UID, ModSeq: a.Place.ModSeq, Flags: flags, Size: int64(len(raw)), Date: date,
				Replicas: set, Want: want}
			key := fmt.Sprint(policy, want, set)
			g := groups[key]
			if g == nil {
				g = &group{set: set, policy: policy, want: want}
				groups[key] = g
				order = append(order, key)
			}
			g.places = append(g.places, a.Place)
			g.objs = append(g.objs, o)
		}
		pending = nil
		for _, key := range order {
			g := groups[key]
			stamp := p.Repl.Now()
			req := &replica.WriteRequest{Policy: g.policy, Want: g.want}
			for _, o := range g.objs {
				u, err := o.Update(stamp, g.set, raw)
				if err != nil {
					return nil, err
				}
				req.Updates = append(req.Updates, u)
			}
			coord := g.set[0]
			if slices.Contains(g.set, p.Self) {
				coord = p.Self
			}
			wctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
			rep, err := p.write(wctx, coord, req)
			cancel()
			if err != nil {
				lastErr = err
				for _, n := range g.set {
					if rep == nil || !slices.Contains(rep.Acked, n) {
						failed[n] = true
					}
				}
			}
			for i, pl := range g.places {
				msg := mailbox.Message{UID: pl.UID, ID: id, Size: int64(len(raw)), Date: date, Flags: pl.Flags, ModSeq: pl.ModSeq,
					Version: stamp, Replicas: g.set, Want: g.objs[i].Want}
				// A write that missed its policy may still have stored the
				// object: it is confirmed as a message (a duplicate of the
				// retry to come) rather than hidden until a reload.
				var acked []cluster.NodeID
				if rep != nil {
					acked = rep.Acked
				}
				p.confirm(ctx, &writer.ConfirmRequest{Place: pl, Message: msg, Nodes: acked, Cancel: len(acked) == 0})
				if confirmed != nil && len(acked) > 0 {
					confirmed(pl.User, msg)
				}
				if err == nil {
					stored[pl.User] = msg
				} else {
					pending = append(pending, pl.User)
				}
			}
		}
	}
	return stored, nil
}

// placeShared is placeTracked on a shared store: for each user the writer
// allocates the UID, the bytes and then the index record under that UID
// are written to the store (so a reader that finds the record finds the
// bytes), stamped by this node's clock, and the writer is told. A user
// whose write fails gets a new allocation and id, up to storeAttempts;
// a failed write's record may still have been stored (a timeout), and the
// writer, told of the cancel, reads the mailbox again and shows it.
func (p *Proxy) placeShared(ctx context.Context, users []string, name string, flags []string, raw []byte, date time.Time,
	confirmed func(user string, m mailbox.Message)) (map[string]mailbox.Message, error) {
	stored := map[string]mailbox.Message{}
	for _, u := range users {
		var lastErr error
		for attempt := 0; ; attempt++ {
			if attempt == storeAttempts {
				return nil, fmt.Errorf("deliver to %s: the store did not take the message after %d attempts: %w: %w", u, attempt, lastErr, ErrTryLater)
			}
			actx, cancel := context.WithTimeout(ctx, writerCallTimeout)
			a, err := p.Writers.For(u).Alloc(actx, &writer.AllocRequest{User: u, Mailbox: name, From: p.member(p.Self)})
			cancel()
			if err != nil {
				return nil, err
			}
			pl := a.Place
			pl.Flags = flags
			msg := mailbox.Message{UID: pl.UID, ID: p.Boxes.NewMessageID(), Size: int64(len(raw)), Date: date, Flags: flags,
				ModSeq: pl.ModSeq, Version: p.Repl.Now()}
			wctx, cancel := context.WithTimeout(ctx, storeCallTimeout)
			_, err = p.Shared.PutBody(wctx, pl.User, msg.ID, bytes.NewReader(raw))
			if err == nil {
				err = p.Shared.PutMessage(wctx, pl.User, pl.UIDValidity, &msg)
			}
			cancel()
			if err != nil {
				lastErr = err
				p.confirm(ctx, &writer.ConfirmRequest{Place: pl, Cancel: true})
				continue
			}
			p.confirm(ctx, &writer.ConfirmRequest{Place: pl, Message: msg})
			if confirmed != nil {
				confirmed(pl.User, msg)
			}
			stored[pl.User] = msg
			break
		}
	}
	return stored, nil
}

// write sends updates to their coordinator.
func (p *Proxy) write(ctx context.Context, coord cluster.NodeID, req *replica.WriteRequest) (*replica.WriteReply, error) {
	return p.Repl.On(coord).Write(ctx, req)
}

// writerCallTimeout bounds one call to a user's manager or writer on the
// delivery path (lookup, allocation, confirmation) and on the login path
// and POP3's. Without it a call took the session's whole deadline (SMTP's 2
// minutes) when the writer hung, paused or busy behind another operation
// of the user; 15 s covers a view load that waits on a few unreachable
// fragments (3 s each). It is longer than the membership takes to declare
// a dead manager dead (cluster.DetectionTime, 8.4 s on 3 nodes): a call
// to a manager that dies is cut short then and sent on to the next one
// (cluster.OnManager), so this deadline is only met by a manager that is
// alive but stuck. rpc.DefaultTimeout (5 s), which a call without a
// deadline of its own gets, would end such a call just before the
// membership has moved its bucket, as a temporary failure where a second
// more gives an answer.
const writerCallTimeout = 15 * time.Second

// storeCallTimeout bounds one store at a coordinator: it answers after its
// fsync and the pushes its write policy waits for (each bounded by the
// replication manager's push timeout, 5 s). A fault run saw a store wait
// the whole 2 minutes of the SMTP session for a connection to a node that
// had been paused; past this the message is placed on another set.
const storeCallTimeout = 15 * time.Second

// confirmRetry bounds how hard a proxy tries to tell the writer that a
// message was stored (or not): the writer may be paused or failing over
// (about 4 s of tries). If it never hears, the allocation expires and the
// writer loads the mailbox again from the fragments, which finds the
// message.
var confirmRetry = retry.Policy{Attempts: 4, Base: 500 * time.Millisecond, Factor: 2}

// confirm tells the writer the outcome of a store, retrying while the
// writer is unreachable. It does not end with the caller's context (a
// client that hangs up): an outcome the writer never hears holds back every
// later UID of the mailbox until the allocation expires; confirmRetry
// bounds it.
func (p *Proxy) confirm(ctx context.Context, c *writer.ConfirmRequest) {
	ctx = context.WithoutCancel(ctx)
	_ = retry.Do(ctx, confirmRetry, nil, func(ctx context.Context) error {
		cctx, cancel := context.WithTimeout(ctx, writerCallTimeout)
		defer cancel()
		return p.Writers.For(c.Place.User).Confirm(cctx, c)
	})
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

// Login authenticates a user for a retrieval session.
func (p *Proxy) Login(ctx context.Context, user, password string) (*userdb.Profile, error) {
	ctx, cancel := context.WithTimeout(ctx, writerCallTimeout)
	defer cancel()
	return p.Users.Authenticate(ctx, user, password)
}

// SCRAMKeys returns the SCRAM-SHA-256 keys of a user, kept in the profile
// since the password was last set; a user without them (unknown, deleted,
// or not logged in by password since SCRAM came) gives saslsrv.NotFound.
func (p *Proxy) SCRAMKeys(ctx context.Context, user string) (scram.StoredCredentials, error) {
	ctx, cancel := context.WithTimeout(ctx, writerCallTimeout)
	defer cancel()
	prof, _, err := p.Users.Lookup(ctx, userdb.Normalize(user))
	if errors.Is(err, userdb.ErrNotFound) || (err == nil && (prof.Deleted || prof.SCRAMSHA256 == "")) {
		return scram.StoredCredentials{}, fmt.Errorf("user %s: %w", user, saslsrv.NotFound)
	}
	if err != nil {
		return scram.StoredCredentials{}, err
	}
	return userdb.ParseSCRAM(prof.SCRAMSHA256)
}

// Proven returns the profile of a user who proved their password by SCRAM.
func (p *Proxy) Proven(ctx context.Context, user string) (*userdb.Profile, error) {
	ctx, cancel := context.WithTimeout(ctx, writerCallTimeout)
	defer cancel()
	prof, _, err := p.Users.Lookup(ctx, userdb.Normalize(user))
	if err == nil && prof.Deleted {
		err = fmt.Errorf("user %s: %w", user, userdb.ErrNotFound)
	}
	return prof, err
}

package queue

// The runner: each node attempts the entries it leads when they are due,
// records every attempt as a new state of the entry on its replicas, sends
// the DSNs the sender is owed, and retires entries with nothing left to
// do.

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"slices"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

// Defaults an operator can change (`quill serve` flags).
const (
	// DefaultLifetime is how long a message may stay in the queue before
	// its remaining recipients are reported failed (Postfix: 5 days).
	DefaultLifetime = 5 * 24 * time.Hour
	// DefaultWarnAfter is when the sender hears that a message is still
	// waiting (RFC 5321 §4.5.4.1 suggests a warning after 4 hours or so).
	DefaultWarnAfter = 4 * time.Hour
	// DefaultRetry is the wait after a first failed attempt; it doubles
	// with each further one (Backoff).
	DefaultRetry = 5 * time.Minute
	// DefaultWorkers bounds the entries a node attempts at once.
	DefaultWorkers = 16
)

const (
	// scanInterval is how often the runner looks for due entries when
	// nothing kicked it.
	scanInterval = time.Second
	// attemptTimeout bounds one attempt of one entry: each domain's
	// transaction has RFC 5321's own timeouts below it.
	attemptTimeout = 30 * time.Minute
	// writeTimeout bounds writing an entry's new state.
	writeTimeout = 30 * time.Second
	// dsnRetry is the wait before trying again to queue a DSN that could
	// not be queued (no replica set had room).
	dsnRetry = time.Minute
	// holdOff is how long a node just started waits before it leads
	// entries: its peers' update logs first bring it the states it missed
	// while it was away (delivered by another replica, deleted), so it
	// does not deliver again what was delivered meanwhile.
	holdOff = 5 * time.Second
	// sweepInterval is how often old tombstones are swept.
	sweepInterval = time.Minute
	// returnPathFmt is what final delivery adds to queued mail for a
	// local recipient (RFC 5321 §4.4).
	returnPathFmt = "Return-Path: <%s>\r\n"
)

// Local is what the queue needs of the node for recipients in domains it
// serves (a DSN to a local sender): proxy.Proxy.
type Local interface {
	// ServesDomain says whether the domain's mail stays here.
	ServesDomain(domain string) bool
	// Recipients says which users an address reaches (itself, an
	// alias's targets, ...), proxy.Proxy.Recipients.
	Recipients(ctx context.Context, addr string, size int64) (users, limited []string, err error)
	Deliver(ctx context.Context, rcpts []string, raw []byte) error
}

// Remote delivers to another domain's servers: *Dialer.
type Remote interface {
	Deliver(ctx context.Context, domain, from string, rcpts []string, body []byte) []Result
}

// Placer chooses nodes for new replicas (the load balancer), among those
// that may hold the state of a bucket's users (with islands: its island's).
type Placer interface {
	Replicas(bucket uint8, exclude []cluster.NodeID, n int) []cluster.NodeID
	May(bucket uint8, n cluster.NodeID) bool
}

// Config holds the runner's settings.
type Config struct {
	Hostname  string
	Lifetime  time.Duration
	WarnAfter time.Duration
	Retry     time.Duration
	Workers   int
	// Replicas and Policy are the cluster's defaults, for DSNs and for
	// users who set none.
	Replicas int
	Policy   replica.Policy
	// TombstoneAge is how long a finished entry's tombstone is kept (the
	// update log's maximum age).
	TombstoneAge time.Duration
}

// Queue is a node's part of the outbound queue: the entries as its
// Storage keeps them (Replicated on the native store, Shared on
// Cassandra) and the runner that delivers those it leads.
type Queue struct {
	Self    cluster.NodeID
	Storage Storage
	// Peers reaches the other nodes, to route an operator's action to an
	// entry's leader.
	Peers cluster.Conns
	// Alive lists the live nodes, this one included.
	Alive  func() []cluster.NodeID
	Local  Local
	Remote Remote
	Cfg    Config
	Log    *slog.Logger

	kick     chan struct{}
	stop     chan struct{}
	ctx      context.Context
	cancel   context.CancelFunc
	wg       sync.WaitGroup
	mu       sync.Mutex
	inflight map[string]bool
}

// Start runs the runner until Close.
func (q *Queue) Start() {
	if q.Log == nil {
		q.Log = slog.New(slog.DiscardHandler)
	}
	c := &q.Cfg
	if c.Lifetime <= 0 {
		c.Lifetime = DefaultLifetime
	}
	if c.Retry <= 0 {
		c.Retry = DefaultRetry
	}
	if c.Workers <= 0 {
		c.Workers = DefaultWorkers
	}
	if c.Replicas <= 0 {
		c.Replicas = 1
	}
	q.kick = make(chan struct{}, 1)
	q.stop = make(chan struct{})
	q.inflight = map[string]bool{}
	q.ctx, q.cancel = context.WithCancel(context.Background())
	q.Storage.SetOnChange(q.Kick)
	q.wg.Add(1)
	go q.loop()
}

// Close stops the runner: attempts in progress are cut short (their
// entries stay as they were and are tried again) and waited for.
func (q *Queue) Close() {
	if q.stop == nil {
		return
	}
	select {
	case <-q.stop:
	default:
		close(q.stop)
	}
	q.cancel()
	q.wg.Wait()
}

// Kick makes the runner look for due entries now.
func (q *Queue) Kick() {
	if q.kick == nil {
		return
	}
	select {
	case q.kick <- struct{}{}:
	default:
	}
}

func (q *Queue) loop() {
	defer q.wg.Done()
	select {
	case <-q.stop:
		return
	case <-time.After(holdOff):
	}
	t := time.NewTicker(scanInterval)
	defer t.Stop()
	sweep := time.NewTicker(sweepInterval)
	defer sweep.Stop()
	for {
		select {
		case <-q.stop:
			return
		case <-sweep.C:
			if q.Cfg.TombstoneAge > 0 {
				if n, err := q.Storage.Sweep(q.ctx, time.Now().Add(-q.Cfg.TombstoneAge)); err != nil {
					q.Log.Warn("queue: sweeping old tombstones failed", "err", err)
				} else if n > 0 {
					q.Log.Info("queue: old tombstones swept", "count", n)
				}
			}
			continue
		case <-t.C:
		case <-q.kick:
		}
		q.dispatch()
	}
}

func (q *Queue) aliveSet() map[cluster.NodeID]bool {
	alive := map[cluster.NodeID]bool{q.Self: true}
	if q.Alive != nil {
		for _, n := range q.Alive() {
			alive[n] = true
		}
	}
	return alive
}

// dispatch starts an attempt of each due entry this node leads, up to
// Workers at once.
func (q *Queue) dispatch() {
	alive := q.aliveSet()
	now := time.Now()
	var running int
	ids, held := q.Storage.Due(q.ctx, alive, func(e *Entry) bool {
		due, ok := Due(e)
		return !ok || !due.After(now)
	})
	metrics.QueueEntries.Set(float64(held))
	for _, id := range ids {
		q.mu.Lock()
		running = len(q.inflight)
		if q.inflight[id] || running >= q.Cfg.Workers {
			q.mu.Unlock()
			continue
		}
		q.inflight[id] = true
		q.mu.Unlock()
		q.wg.Add(1)
		go func(id string) {
			defer q.wg.Done()
			defer func() {
				q.mu.Lock()
				delete(q.inflight, id)
				q.mu.Unlock()
			}()
			q.attempt(id)
		}(id)
	}
}

// Add queues raw from from to rcpts for user, with want replicas under
// policy (the user's R and write policy; zero values take the cluster's),
// and returns the entry's id once policy's share of replicas hold it.
func (q *Queue) Add(ctx context.Context, user, from string, rcpts []string, raw []byte, want int, policy replica.Policy) (string, error) {
	if want <= 0 {
		want = q.Cfg.Replicas
	}
	if policy == "" {
		policy = q.Cfg.Policy
	}
	set, err := q.Storage.Place(user, want, policy)
	if err != nil {
		return "", err
	}
	now := time.Now()
	e := &Entry{ID: NewID(), User: user, From: from, Replicas: set, Want: want, Created: now, Size: int64(len(raw))}
	seen := map[string]bool{}
	for _, r := range rcpts {
		if !seen[r] {
			seen[r] = true
			e.Recipients = append(e.Recipients, Recipient{Address: r, State: Queued, NextTry: now})
		}
	}
	if err := q.Storage.Write(ctx, e, raw, policy); err != nil {
		return "", err
	}
	q.Log.Info("queued", "id", e.ID, "user", user, "from", from, "rcpts", len(e.Recipients), "size", len(raw), "replicas", set)
	metrics.Queued.Inc()
	q.Kick()
	return e.ID, nil
}

// attempt tries an entry's due recipients once and records the outcome.
func (q *Queue) attempt(id string) {
	ctx, cancel := context.WithTimeout(q.ctx, attemptTimeout)
	defer cancel()
	begun, err := q.get(ctx, id)
	if err != nil {
		if !errors.Is(err, ErrNotFound) {
			q.Log.Warn("queue: entry not read; trying again", "id", id, "err", err)
		}
		return
	}
	if q.Storage.Fresh(ctx, begun, q.aliveSet()) {
		return // the next round works from the newer state
	}
	now := time.Now()
	if due, ok := Due(begun); ok && due.After(now) {
		return // another node's attempt moved it on (a shared store's state is read fresh)
	}
	e := begun.Clone()
	body, err := q.Storage.Body(ctx, id)
	if err != nil {
		// The entry is here, its message is not (the update log brings
		// it: NeedContent), or a shared store did not answer. Try again
		// later.
		q.Log.Warn("queue: message of an entry not readable here; trying again", "id", id, "err", err)
		return
	}
	if !Expire(e, now, q.Cfg.Lifetime) {
		domains, by := DueRecipients(e, now)
		for _, d := range domains {
			if ctx.Err() != nil {
				// Shutting down, or the attempt ran out of time: what
				// was delivered so far is saved below all the same, so
				// it is not delivered again.
				break
			}
			res := q.deliverDomain(ctx, e.From, d, by[d], body)
			Step(e, res, time.Now(), q.Cfg.Retry, rand.Float64)
			for _, r := range res {
				q.Log.Info("queue delivery", "id", id, "rcpt", r.Rcpt, "delivered", r.Delivered, "permanent", r.Permanent,
					"reply", r.Reply(), "remote", r.Remote)
				switch {
				case r.Delivered:
					metrics.Outbound.WithLabelValues("delivered").Inc()
				case r.Permanent:
					metrics.Outbound.WithLabelValues("failed").Inc()
				default:
					metrics.Outbound.WithLabelValues("deferred").Inc()
				}
			}
		}
	}
	// The results' own times: a recipient refused just now is owed its
	// report now, not at the next round.
	q.report(ctx, e, body, time.Now())
	q.save(e, begun)
}

// report sends the DSNs an entry owes: a failure report for recipients
// refused for good or expired, and one delay warning.
func (q *Queue) report(ctx context.Context, e *Entry, body []byte, now time.Time) {
	var failed []int
	for i, r := range e.Recipients {
		if r.State == Failed && !r.NextTry.After(now) {
			failed = append(failed, i)
		}
	}
	if len(failed) > 0 {
		err := error(nil)
		if e.From != "" {
			d := DSN{Hostname: q.Cfg.Hostname, Entry: e, Message: body, Now: now}
			for _, i := range failed {
				d.Recipients = append(d.Recipients, e.Recipients[i])
			}
			var dsnID string
			dsnID, err = q.Add(ctx, "", "", []string{e.From}, d.Build(), 0, replica.One)
			if err == nil {
				q.Log.Info("queue: failure report queued", "id", e.ID, "to", e.From, "report", dsnID, "recipients", len(failed))
			}
		}
		for _, i := range failed {
			if err != nil {
				e.Recipients[i].NextTry = now.Add(dsnRetry)
			} else {
				e.Recipients[i].State = Reported
			}
		}
		if err != nil {
			q.Log.Warn("queue: failure report could not be queued; trying again", "id", e.ID, "to", e.From, "err", err, "in", dsnRetry)
		}
	}
	if NeedsWarning(e, now, q.Cfg.WarnAfter) {
		d := DSN{Hostname: q.Cfg.Hostname, Entry: e, Message: body, Now: now, Delayed: true,
			RetryUntil: e.Created.Add(q.Cfg.Lifetime)}
		for _, r := range e.Recipients {
			if r.State == Queued {
				d.Recipients = append(d.Recipients, r)
			}
		}
		if dsnID, err := q.Add(ctx, "", "", []string{e.From}, d.Build(), 0, replica.One); err == nil {
			e.Warned = true
			q.Log.Info("queue: delay warning queued", "id", e.ID, "to", e.From, "report", dsnID)
		} else {
			q.Log.Warn("queue: delay warning could not be queued; trying again", "id", e.ID, "err", err)
		}
	}
}

// save writes an attempt's outcome as the entry's new state on its
// replicas, merged with what an operator changed meanwhile; an entry with
// nothing left becomes a tombstone.
func (q *Queue) save(done, begun *Entry) {
	ctx, cancel := context.WithTimeout(context.Background(), writeTimeout)
	defer cancel()
	cur, held, err := q.Storage.Lookup(ctx, done.ID)
	if err != nil {
		// The outcome goes onto the state the attempt began from: an
		// operator's change meanwhile may be lost, a delivery is not.
		q.Log.Warn("queue: entry's state not read before saving an attempt; saving onto the one it began from", "id", done.ID, "err", err)
		cur, held = begun, true
	}
	ok := held && !cur.Deleted
	if !ok {
		t := cur
		if !held || len(t.Replicas) == 0 || slices.Contains(t.Replicas, q.Self) {
			return // done or deleted meanwhile
		}
		// The repair moved the entry away during the attempt: the
		// outcome goes to its new replicas, or the new leader would
		// deliver again what was delivered here.
		cur = done.Clone()
		cur.Replicas = t.Replicas
		q.Log.Info("queue: entry moved away during an attempt; outcome handed to its new replicas", "id", done.ID, "replicas", t.Replicas)
	}
	e := done
	switch {
	case cur.Stamp == begun.Stamp:
	case !ok:
		e = cur // the outcome, bound for the new replica set
	default:
		// Changed meanwhile (an operator's retry, a re-homing): the
		// attempt's outcome goes onto the current state.
		e = Merge(cur, begun, done)
	}
	var body []byte
	if Done(e) {
		e.Deleted = true
		q.Log.Info("queue entry done", "id", e.ID)
	}
	if err := q.Storage.Write(ctx, e, body, replica.One); err != nil {
		// Not even this node took it: the attempt is made again (the
		// remote may get the message twice, never zero times).
		q.Log.Warn("queue: state after an attempt not saved", "id", e.ID, "err", err)
	}
}

// deliverDomain delivers to one domain's recipients: through the node's
// own delivery for domains it serves, else to the domain's servers.
func (q *Queue) deliverDomain(ctx context.Context, from, domain string, rcpts []string, body []byte) []Result {
	if q.Local != nil && q.Local.ServesDomain(domain) {
		return q.deliverLocal(ctx, from, rcpts, body)
	}
	if q.Remote == nil {
		return each(rcpts, Result{Status: "4.4.0", Text: "no outbound delivery configured on this node"})
	}
	return q.Remote.Deliver(ctx, domain, from, rcpts, body)
}

func (q *Queue) deliverLocal(ctx context.Context, from string, rcpts []string, body []byte) []Result {
	out := make([]Result, len(rcpts))
	var ok []int
	var to []string
	for i, r := range rcpts {
		out[i].Rcpt, out[i].Remote = r, q.Cfg.Hostname
		users, _, err := q.Local.Recipients(ctx, r, int64(len(body)))
		switch {
		case err == nil:
			ok = append(ok, i)
			to = append(to, users...) // Deliver gives each user one copy
		case errors.Is(err, userdb.ErrQuotaFinal):
			out[i].Permanent, out[i].Status, out[i].Text = true, "5.2.2", "mailbox full"
		case errors.Is(err, userdb.ErrOverQuota):
			out[i].Status, out[i].Text = "4.2.2", "mailbox full"
		case errors.Is(err, userdb.ErrNotFound):
			out[i].Permanent, out[i].Status, out[i].Text = true, "5.1.1", "no such user here"
		default:
			out[i].Status, out[i].Text = "4.3.0", "recipient lookup failed for now"
		}
	}
	if len(ok) == 0 {
		return out
	}
	raw := append([]byte(fmt.Sprintf(returnPathFmt, from)), body...)
	err := q.Local.Deliver(ctx, to, raw)
	for _, i := range ok {
		if err != nil {
			out[i].Status, out[i].Text = "4.3.0", "local delivery failed for now"
			q.Log.Warn("queue: local delivery failed", "rcpt", rcpts[i], "err", err)
		} else {
			out[i].Delivered, out[i].Status, out[i].Text = true, "2.0.0", "delivered here"
		}
	}
	return out
}

// Retry makes every queued recipient of an entry held here due now.
func (q *Queue) Retry(ctx context.Context, id string) (*Entry, error) {
	e, err := q.get(ctx, id)
	if err != nil {
		return nil, err
	}
	now := time.Now()
	for i := range e.Recipients {
		if e.Recipients[i].State == Queued {
			e.Recipients[i].NextTry = now
		}
	}
	if err := q.Storage.Write(ctx, e, nil, replica.One); err != nil {
		return nil, err
	}
	q.Kick()
	return e, nil
}

// Delete removes an entry held here without telling its sender.
func (q *Queue) Delete(ctx context.Context, id string) error {
	e, err := q.get(ctx, id)
	if err != nil {
		return err
	}
	e.Deleted = true
	if err := q.Storage.Write(ctx, e, nil, replica.One); err != nil {
		return err
	}
	q.Log.Info("queue entry deleted by an operator", "id", id, "from", e.From, "rcpts", len(e.Recipients))
	return nil
}

// get returns an entry's state (not a tombstone), or an error wrapping
// ErrNotFound.
func (q *Queue) get(ctx context.Context, id string) (*Entry, error) {
	e, ok, err := q.Storage.Lookup(ctx, id)
	if err != nil {
		return nil, err
	}
	if !ok || e.Deleted {
		return nil, fmt.Errorf("queue entry %s: %w", id, ErrNotFound)
	}
	return e, nil
}

// Rehome gives entries held here new replica sets (the repair found them
// short of replicas): on the native store only, whose replicas the repair
// mends.
func (q *Queue) Rehome(ctx context.Context, moves []replica.Move) error {
	r, ok := q.Storage.(*Replicated)
	if !ok {
		return nil
	}
	return r.Rehome(ctx, moves)
}

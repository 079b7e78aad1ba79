package usermgr

// What a domain's users take together, for a domain quota. Each user's
// usage is counted by their writer, which runs on the manager of their
// bucket (Porcupine §3.3: soft state per bucket), so each node sums the
// users of the buckets it manages (DomainPart) and a node that needs the
// domain's figure asks every live node for its part at once (DomainUsage).
// Both are cached: a domain's usage is a figure that may lag by
// domainUsageTTL, so a domain can pass its limit by what arrives in that
// time; the user's own quota is checked against the writer's exact count.

import (
	"context"
	"fmt"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/writer"
)

// domainUsageTTL is how long a domain's summed usage (and each node's part
// of it) is used before it is counted again.
const domainUsageTTL = 30 * time.Second

// partialTTL is how long a partial figure (a node or a user's writer did
// not answer) or a failed count is used: long enough that RCPTs during an
// outage do not each wait for a count of their own, short enough that the
// whole figure is back soon after.
const partialTTL = 5 * time.Second

// domainPartTimeout bounds one node's answer with its part.
const domainPartTimeout = 3 * time.Second

// DomainUsage is what a domain's users take: bytes and messages, over how
// many users; Partial says some node did not answer, so it may be short.
type DomainUsage struct {
	Storage  int64     `json:"storage"`
	Messages int64     `json:"messages"`
	Users    int       `json:"users"`
	Partial  bool      `json:"partial,omitempty"`
	At       time.Time `json:"at"`
}

// usageCache keeps domain figures (domainUsageTTL; a partial one or a
// failure partialTTL); one count per domain runs at a time, and those who
// asked meanwhile get its result.
type usageCache struct {
	mu sync.Mutex
	at map[string]counted
	// busy is the count in progress per domain; done closes when its
	// result is in counted.
	busy map[string]*counting
}

type counted struct {
	u   DomainUsage
	err error
	at  time.Time
}

type counting struct {
	done chan struct{}
	res  counted
}

func (c counted) fresh(now time.Time) bool {
	ttl := domainUsageTTL
	if c.err != nil || c.u.Partial {
		ttl = partialTTL
	}
	return now.Sub(c.at) < ttl
}

func (c *usageCache) get(ctx context.Context, dom string, count func(context.Context) (DomainUsage, error)) (DomainUsage, error) {
	c.mu.Lock()
	if c.at == nil {
		c.at, c.busy = map[string]counted{}, map[string]*counting{}
	}
	if r, ok := c.at[dom]; ok && r.fresh(time.Now()) {
		c.mu.Unlock()
		return r.u, r.err
	}
	if run, ok := c.busy[dom]; ok {
		c.mu.Unlock()
		select {
		case <-run.done:
			return run.res.u, run.res.err
		case <-ctx.Done():
			return DomainUsage{}, fmt.Errorf("domain %s: usage: %w", dom, ctx.Err())
		}
	}
	run := &counting{done: make(chan struct{})}
	c.busy[dom] = run
	c.mu.Unlock()
	u, err := count(ctx)
	run.res = counted{u: u, err: err, at: time.Now()}
	c.mu.Lock()
	delete(c.busy, dom)
	c.at[dom] = run.res
	c.mu.Unlock()
	close(run.done)
	return u, err
}

// DomainPart sums what the users of dom whose buckets this node manages
// take, asking their writers (here). A bucket whose soft state is not
// rebuilt yet, or a user whose writer does not answer, makes it partial.
func (m *Manager) DomainPart(ctx context.Context, dom string) (DomainUsage, error) {
	return m.parts.get(ctx, dom, func(ctx context.Context) (DomainUsage, error) {
		u := DomainUsage{At: time.Now()}
		var users []string
		m.mu.RLock()
		for _, bk := range m.buckets {
			if bk == nil {
				continue
			}
			select {
			case <-bk.ready:
			default:
				u.Partial = true
			}
			for a, p := range bk.profiles {
				if !p.Deleted && userdb.Domain(a) == dom {
					users = append(users, a)
				}
			}
		}
		m.mu.RUnlock()
		for _, a := range users {
			rep, err := m.writers.For(a).Mailboxes(ctx, &writer.MailboxRequest{User: a, UsageAll: true})
			if err != nil {
				m.log.Warn("domain usage: a user's part is missing", "domain", dom, "user", a, "err", err)
				u.Partial = true
				continue
			}
			u.Storage += rep.Usage.Storage
			u.Messages += rep.Usage.Messages
			u.Users++
		}
		return u, nil
	})
}

// DomainUsage sums every live node's part of what dom's users take. A node
// that does not answer in domainPartTimeout leaves its part out and marks
// the figure partial (which is not cached).
func (m *Manager) DomainUsage(ctx context.Context, dom string) (DomainUsage, error) {
	dom = userdb.Normalize(dom)
	return m.totals.get(ctx, dom, func(ctx context.Context) (DomainUsage, error) {
		alive := m.peers.Alive()
		var mu sync.Mutex
		var wg sync.WaitGroup
		sum := DomainUsage{At: time.Now()}
		for _, a := range alive {
			wg.Add(1)
			go func(n cluster.NodeID) {
				defer wg.Done()
				cctx, cancel := context.WithTimeout(ctx, domainPartTimeout)
				defer cancel()
				u, err := m.on(n).DomainUsage(cctx, dom)
				mu.Lock()
				defer mu.Unlock()
				if err != nil {
					m.log.Warn("domain usage: a node's part is missing", "domain", dom, "node", n, "err", err)
					sum.Partial = true
					return
				}
				sum.Storage += u.Storage
				sum.Messages += u.Messages
				sum.Users += u.Users
				sum.Partial = sum.Partial || u.Partial
			}(a.ID)
		}
		wg.Wait()
		return sum, nil
	})
}

func domainUsageToPB(u DomainUsage) *nodepb.DomainUsageReply {
	return &nodepb.DomainUsageReply{Storage: u.Storage, Messages: u.Messages, Users: int32(u.Users), Partial: u.Partial}
}

func domainUsageFromPB(p *nodepb.DomainUsageReply) DomainUsage {
	return DomainUsage{Storage: p.Storage, Messages: p.Messages, Users: int(p.Users), Partial: p.Partial}
}

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

// usageCache keeps domain figures for domainUsageTTL; one count per domain
// runs at a time, the others wait for it.
type usageCache struct {
	mu   sync.Mutex
	at   map[string]DomainUsage
	busy map[string]chan struct{}
}

func (c *usageCache) get(ctx context.Context, dom string, count func(context.Context) (DomainUsage, error)) (DomainUsage, error) {
	for {
		c.mu.Lock()
		if c.at == nil {
			c.at, c.busy = map[string]DomainUsage{}, map[string]chan struct{}{}
		}
		if u, ok := c.at[dom]; ok && time.Since(u.At) < domainUsageTTL {
			c.mu.Unlock()
			return u, nil
		}
		wait, running := c.busy[dom]
		if !running {
			done := make(chan struct{})
			c.busy[dom] = done
			c.mu.Unlock()
			u, err := count(ctx)
			c.mu.Lock()
			delete(c.busy, dom)
			if err == nil && !u.Partial {
				c.at[dom] = u
			}
			c.mu.Unlock()
			close(done)
			return u, err
		}
		c.mu.Unlock()
		select {
		case <-wait:
		case <-ctx.Done():
			return DomainUsage{}, fmt.Errorf("domain %s: usage: %w", dom, ctx.Err())
		}
	}
}

// DomainPart sums what the users of dom whose buckets this node manages
// take, asking their writers (here).
func (m *Manager) DomainPart(ctx context.Context, dom string) (DomainUsage, error) {
	return m.parts.get(ctx, dom, func(ctx context.Context) (DomainUsage, error) {
		var users []string
		m.mu.RLock()
		for _, bk := range m.buckets {
			if bk == nil {
				continue
			}
			for a, p := range bk.profiles {
				if !p.Deleted && userdb.Domain(a) == dom {
					users = append(users, a)
				}
			}
		}
		m.mu.RUnlock()
		u := DomainUsage{At: time.Now()}
		for _, a := range users {
			rep, err := m.writers.For(a).Mailboxes(ctx, &writer.MailboxRequest{User: a, UsageAll: true})
			if err != nil {
				return DomainUsage{}, fmt.Errorf("domain %s: usage of %s: %w", dom, a, err)
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
			}(a.ID)
		}
		wg.Wait()
		return sum, nil
	})
}

func domainUsageToPB(u DomainUsage) *nodepb.DomainUsageReply {
	return &nodepb.DomainUsageReply{Storage: u.Storage, Messages: u.Messages, Users: int32(u.Users)}
}

func domainUsageFromPB(p *nodepb.DomainUsageReply) DomainUsage {
	return DomainUsage{Storage: p.Storage, Messages: p.Messages, Users: int(p.Users)}
}

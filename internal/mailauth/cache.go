package mailauth

import (
	"context"
	"net"
	"sync"
	"time"
)

// The checks of one message ask for the same few records as the last
// message from the same sender: the SPF record of its domain, _dmarc of
// its From: domain, its DKIM key. Go's resolver keeps nothing, so the
// answers (and the "no such name" ones) are kept here for a minute, a
// small share of the TTLs such records carry.
const (
	cacheTTL = time.Minute
	// cacheMax bounds the names kept; past it the cache starts afresh.
	cacheMax = 10000
)

type txtAnswer struct {
	txt     []string
	err     error
	expires time.Time
}

// txtCache is a resolver whose TXT answers are cached; the other lookups
// SPF makes (A, MX, PTR) go to the resolver.
type txtCache struct {
	*net.Resolver
	mu sync.Mutex
	m  map[string]txtAnswer
}

func newTXTCache(r *net.Resolver) *txtCache { return &txtCache{Resolver: r, m: map[string]txtAnswer{}} }

// LookupTXT answers from the cache, or asks and keeps the answer unless
// the failure was temporary.
func (c *txtCache) LookupTXT(ctx context.Context, name string) ([]string, error) {
	now := time.Now()
	c.mu.Lock()
	a, ok := c.m[name]
	c.mu.Unlock()
	if ok && now.Before(a.expires) {
		return a.txt, a.err
	}
	txt, err := c.Resolver.LookupTXT(ctx, name)
	if dnsErr, ok := err.(*net.DNSError); err != nil && (!ok || dnsErr.IsTemporary || dnsErr.IsTimeout) {
		return txt, err
	}
	c.mu.Lock()
	if len(c.m) >= cacheMax {
		c.m = map[string]txtAnswer{}
	}
	c.m[name] = txtAnswer{txt: txt, err: err, expires: now.Add(cacheTTL)}
	c.mu.Unlock()
	return txt, err
}

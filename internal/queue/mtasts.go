package queue

// MTA-STS (RFC 8461): a domain that publishes a TXT record at
// _mta-sts.<domain> and a policy at https://mta-sts.<domain>/.well-known/
// mta-sts.txt asks senders to deliver only to the MX hosts it names, over
// TLS with a valid certificate (mode enforce), or to report what would
// have failed (mode testing). Policies are kept for their max_age, and
// fetched again when the TXT record's id changes (§5.1). Written here:
// the policy format is a handful of key: value lines, and no Go library
// for it is kept up.

import (
	"bufio"
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"
)

const (
	// stsFetchTimeout bounds fetching a policy (§3.3 suggests a minute or
	// more at most; the attempt waits on it).
	stsFetchTimeout = 30 * time.Second
	// stsMaxPolicy bounds a policy's size (§3.2: 64 KB).
	stsMaxPolicy = 64 << 10
	// stsMaxAge caps max_age at the RFC's one year (§3.2).
	stsMaxAge = 31557600 * time.Second
	// stsCacheMax bounds the domains whose policy is kept.
	stsCacheMax = 10000
)

// stsPolicy is a domain's fetched policy.
type stsPolicy struct {
	ID      string
	Mode    string // enforce, testing or none
	MX      []string
	MaxAge  time.Duration
	Fetched time.Time
}

func (p *stsPolicy) fresh(now time.Time) bool { return now.Before(p.Fetched.Add(p.MaxAge)) }

// matches reports whether an MX host is one the policy names: the same
// name, or one label under a "*." pattern (§4.1).
func (p *stsPolicy) matches(host string) bool {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	for _, m := range p.MX {
		m = strings.ToLower(strings.TrimSuffix(m, "."))
		if rest, ok := strings.CutPrefix(m, "*."); ok {
			if label, parent, found := strings.Cut(host, "."); found && label != "" && parent == rest {
				return true
			}
		} else if host == m {
			return true
		}
	}
	return false
}

// parseSTSPolicy reads a policy's text (§3.2).
func parseSTSPolicy(text string) (*stsPolicy, error) {
	p := &stsPolicy{}
	version := ""
	sc := bufio.NewScanner(strings.NewReader(text))
	for sc.Scan() {
		k, v, ok := strings.Cut(sc.Text(), ":")
		if !ok {
			continue
		}
		v = strings.TrimSpace(v)
		switch strings.TrimSpace(k) {
		case "version":
			version = v
		case "mode":
			p.Mode = v
		case "mx":
			p.MX = append(p.MX, v)
		case "max_age":
			n, err := strconv.ParseUint(v, 10, 32)
			if err != nil {
				return nil, fmt.Errorf("MTA-STS policy: max_age %q: %w", v, err)
			}
			p.MaxAge = min(time.Duration(n)*time.Second, stsMaxAge)
		}
	}
	switch {
	case version != "STSv1":
		return nil, fmt.Errorf("MTA-STS policy: version %q, want STSv1", version)
	case p.Mode != "enforce" && p.Mode != "testing" && p.Mode != "none":
		return nil, fmt.Errorf("MTA-STS policy: mode %q", p.Mode)
	case p.Mode != "none" && len(p.MX) == 0:
		return nil, errors.New("MTA-STS policy: no mx")
	}
	return p, nil
}

// stsRecordID returns the id of a domain's _mta-sts TXT record, "" when
// it has none (§3.1: exactly one record starting v=STSv1).
func stsRecordID(txts []string) string {
	id, n := "", 0
	for _, t := range txts {
		if !strings.HasPrefix(t, "v=STSv1") {
			continue
		}
		n++
		for _, f := range strings.Split(t, ";") {
			if k, v, ok := strings.Cut(strings.TrimSpace(f), "="); ok && k == "id" {
				id = v
			}
		}
	}
	if n != 1 {
		return ""
	}
	return id
}

type stsCache struct {
	mu sync.Mutex
	m  map[string]*stsPolicy
}

// policy returns a domain's MTA-STS policy, nil when it has none or none
// can be had (the message then goes as to any domain, §5.1): the cached
// one while its id is current and its max_age not over, else a new fetch.
func (d *Dialer) policy(ctx context.Context, domain string) *stsPolicy {
	now := time.Now()
	d.sts.mu.Lock()
	cached := d.sts.m[domain]
	d.sts.mu.Unlock()
	if cached != nil && !cached.fresh(now) {
		cached = nil
	}
	lctx, cancel := context.WithTimeout(ctx, dnsTimeout)
	txts, err := d.resolver().LookupTXT(lctx, "_mta-sts."+domain)
	cancel()
	id := stsRecordID(txts)
	if err != nil || id == "" || (cached != nil && cached.ID == id) {
		// No record (or no answer): a policy still fresh stands (§5.1).
		return cached
	}
	p, err := d.fetchPolicy(ctx, domain)
	if err != nil {
		return cached
	}
	p.ID, p.Fetched = id, now
	d.sts.mu.Lock()
	if d.sts.m == nil || len(d.sts.m) >= stsCacheMax {
		d.sts.m = map[string]*stsPolicy{}
	}
	d.sts.m[domain] = p
	d.sts.mu.Unlock()
	return p
}

// fetchPolicy gets https://mta-sts.<domain>/.well-known/mta-sts.txt: a
// valid certificate, no redirects, 200, text/plain (§3.3).
func (d *Dialer) fetchPolicy(ctx context.Context, domain string) (*stsPolicy, error) {
	host := "mta-sts." + domain
	if d.STSPort != 0 && d.STSPort != 443 {
		host += ":" + strconv.Itoa(d.STSPort)
	}
	client := &http.Client{
		Timeout: stsFetchTimeout,
		Transport: &http.Transport{
			TLSClientConfig: &tls.Config{RootCAs: d.RootCAs, MinVersion: tls.VersionTLS12},
			DialContext:     d.dialVia,
			Proxy:           nil,
			// One fetch per policy change: no idle connection kept (a
			// policy server that never closes one would hold it).
			DisableKeepAlives: true,
		},
		CheckRedirect: func(*http.Request, []*http.Request) error {
			return errors.New("MTA-STS policy: redirects are not followed")
		},
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "https://"+host+"/.well-known/mta-sts.txt", nil)
	if err != nil {
		return nil, err
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("MTA-STS policy of %s: HTTP %d", domain, resp.StatusCode)
	}
	if ct := resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/plain") {
		return nil, fmt.Errorf("MTA-STS policy of %s: content type %q", domain, ct)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, stsMaxPolicy+1))
	if err != nil {
		return nil, err
	}
	if len(b) > stsMaxPolicy {
		return nil, fmt.Errorf("MTA-STS policy of %s: over %d bytes", domain, stsMaxPolicy)
	}
	return parseSTSPolicy(string(b))
}

// dialVia connects with the names resolved by the Dialer's resolver
// (--dns), as the MX lookups are.
func (d *Dialer) dialVia(ctx context.Context, network, addr string) (net.Conn, error) {
	return (&net.Dialer{Timeout: DefaultConnectTimeout, Resolver: d.resolver()}).DialContext(ctx, network, addr)
}

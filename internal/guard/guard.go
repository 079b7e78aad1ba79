// Package guard keeps abusive clients from exhausting a node: it caps the
// connections a node holds in all and per client address, optionally the
// rate of new connections per address, and it slows and then stops password
// guessing (a delay that grows with each failure of an address or an
// account, and a temporary lockout of an address after repeated failures).
//
// SNS §3 asks that a component never be overwhelmed by its clients (its
// front ends shed load rather than fall over); this is that for the
// protocol listeners of a Quill node. Written by hand because the decisions
// are a few lines over counters (which Go's x/net/netutil.LimitListener
// does not make per address), and they are pure functions (admit,
// failDelay) tested without sockets; the Guard holds the state and the
// clock.
package guard

import (
	"errors"
	"log/slog"
	"net"
	"net/netip"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quillmail/quill/internal/metrics"
)

// Limits are a node's connection and login limits; zero fields take the
// default in their comment.
type Limits struct {
	// MaxConns caps the client connections of all listeners together,
	// below the file-descriptor limit. Default 10,000.
	MaxConns int
	// MaxConnsPerIP caps one address's connections (Postfix's
	// smtpd_client_connection_count_limit is 50 per service; one address
	// here speaks three protocols). Default 150.
	MaxConnsPerIP int
	// RatePerIP caps one address's new connections per minute; 0, the
	// default (as Postfix's smtpd_client_connection_rate_limit), is no cap.
	RatePerIP int
	// AuthFailDelay is the delay after a first failed login; each further
	// failure of the same address or account within AuthWindow doubles it,
	// up to AuthMaxDelay. Defaults 1s, 15m and 16s.
	AuthFailDelay time.Duration
	AuthWindow    time.Duration
	AuthMaxDelay  time.Duration
	// LockoutAfter failed logins from one address within AuthWindow lock
	// the address out of logging in for LockoutFor (other addresses, and
	// the account from them, are not affected: a lockout of the account
	// would let anyone lock a user out). Defaults 20 and 15m.
	LockoutAfter int
	LockoutFor   time.Duration
}

func (l Limits) withDefaults() Limits {
	if l.MaxConns <= 0 {
		l.MaxConns = 10000
	}
	if l.MaxConnsPerIP <= 0 {
		l.MaxConnsPerIP = 150
	}
	if l.AuthFailDelay == 0 {
		l.AuthFailDelay = time.Second
	}
	if l.AuthWindow <= 0 {
		l.AuthWindow = 15 * time.Minute
	}
	if l.AuthMaxDelay <= 0 {
		l.AuthMaxDelay = 16 * time.Second
	}
	if l.LockoutAfter <= 0 {
		l.LockoutAfter = 20
	}
	if l.LockoutFor <= 0 {
		l.LockoutFor = 15 * time.Minute
	}
	return l
}

// Logins is what a protocol server asks about logins (a *Guard).
type Logins interface {
	// LoginAllowed says whether a login from remote may be checked.
	LoginAllowed(remote net.Addr) error
	// LoginFailed records a wrong password and says how long to wait
	// before answering.
	LoginFailed(remote net.Addr, account string) time.Duration
	// LoginSucceeded records a right one.
	LoginSucceeded(remote net.Addr)
}

// ErrLockedOut is a login refused without a check because its address
// failed too often.
var ErrLockedOut = errors.New("too many failed logins from this address; try again later")

// Guard holds the counters of one node.
type Guard struct {
	lim Limits
	log *slog.Logger
	now func() time.Time

	// OnLockout, if set, hears of every lockout this node decides, to
	// tell the other nodes (LockOut applies theirs here). Called with the
	// guard's lock held: it must not block.
	OnLockout func(ip netip.Addr, until time.Time)

	// logins and loginFailures count this node's logins since it
	// started, for the console's rates.
	logins, loginFailures atomic.Uint64

	mu       sync.Mutex
	total    int
	ips      map[netip.Addr]*ipState
	accounts map[string]*failures
}

type ipState struct {
	conns  int
	tokens float64   // for RatePerIP
	filled time.Time // when tokens was last topped up
	fails  failures
	locked time.Time // locked out until
}

// failures counts failed logins within a window.
type failures struct {
	n     int
	first time.Time
}

// New returns a Guard with the given limits.
func New(lim Limits, log *slog.Logger) *Guard {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Guard{lim: lim.withDefaults(), log: log, now: time.Now,
		ips: map[netip.Addr]*ipState{}, accounts: map[string]*failures{}}
}

// Limits returns the limits in force (defaults filled in).
func (g *Guard) Limits() Limits { return g.lim }

// addrOf is the client address of a connection, IPv4 in its 4-byte form.
func addrOf(a net.Addr) netip.Addr {
	if ta, ok := a.(*net.TCPAddr); ok {
		if ip, ok := netip.AddrFromSlice(ta.IP); ok {
			return ip.Unmap()
		}
	}
	if ap, err := netip.ParseAddrPort(a.String()); err == nil {
		return ap.Addr().Unmap()
	}
	return netip.Addr{}
}

// refusal says why a connection is not admitted ("" admits it).
type refusal string

const (
	tooManyTotal  refusal = "the server has too many connections"
	tooManyFromIP refusal = "too many connections from your address"
	tooFastFromIP refusal = "too many new connections from your address"
)

// limitLabel names each refusal's limit in quill_connections_refused_total.
var limitLabel = map[refusal]string{tooManyTotal: "total", tooManyFromIP: "per_address", tooFastFromIP: "rate_per_address"}

// admit decides whether a new connection from an address with state st
// may be taken, with total connections open, and refills the address's
// rate tokens. It changes st's tokens; the caller counts the connection.
func admit(lim Limits, st *ipState, total int, now time.Time) refusal {
	if total >= lim.MaxConns {
		return tooManyTotal
	}
	if st.conns >= lim.MaxConnsPerIP {
		return tooManyFromIP
	}
	if lim.RatePerIP > 0 {
		if st.filled.IsZero() {
			st.tokens, st.filled = float64(lim.RatePerIP), now
		}
		st.tokens += now.Sub(st.filled).Minutes() * float64(lim.RatePerIP)
		st.tokens = min(st.tokens, float64(lim.RatePerIP))
		st.filled = now
		if st.tokens < 1 {
			return tooFastFromIP
		}
		st.tokens--
	}
	return ""
}

// open counts a connection from ip, or says why it is refused.
func (g *Guard) open(ip netip.Addr) refusal {
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.stateLocked(ip)
	if r := admit(g.lim, st, g.total, g.now()); r != "" {
		return r
	}
	st.conns++
	g.total++
	return ""
}

// stateLocked returns the state of ip, making it if new. g.mu is held.
func (g *Guard) stateLocked(ip netip.Addr) *ipState {
	st := g.ips[ip]
	if st == nil {
		st = &ipState{}
		g.ips[ip] = st
	}
	return st
}

func (g *Guard) close(ip netip.Addr) {
	g.mu.Lock()
	defer g.mu.Unlock()
	g.total--
	if st := g.ips[ip]; st != nil {
		st.conns--
		g.forgetLocked(ip, st)
	}
}

// forgetLocked drops an address's state once nothing in it matters.
func (g *Guard) forgetLocked(ip netip.Addr, st *ipState) {
	now := g.now()
	if st.conns == 0 && now.After(st.locked) && (st.fails.n == 0 || now.Sub(st.fails.first) > g.lim.AuthWindow) &&
		(g.lim.RatePerIP == 0 || st.tokens+now.Sub(st.filled).Minutes()*float64(g.lim.RatePerIP) >= float64(g.lim.RatePerIP)) {
		delete(g.ips, ip)
	}
}

// Open returns the number of client connections open and the number of
// addresses they come from.
func (g *Guard) Open() (conns, addrs int) {
	g.mu.Lock()
	defer g.mu.Unlock()
	for _, st := range g.ips {
		if st.conns > 0 {
			addrs++
		}
	}
	return g.total, addrs
}

// Listener wraps l so that every connection it hands out is counted, and
// one over a limit is answered refuse (the protocol's "try again later"
// line, nil for none: on an implicit-TLS port nothing can be said before
// the handshake) and closed without reaching the server.
func (g *Guard) Listener(proto string, l net.Listener, refuse func(reason string) []byte) net.Listener {
	for _, limit := range limitLabel {
		metrics.ConnectionsRefused.WithLabelValues(proto, limit) // 0 until the first refusal
	}
	return &listener{Listener: l, g: g, proto: proto, refuse: refuse}
}

type listener struct {
	net.Listener
	g      *Guard
	proto  string
	refuse func(reason string) []byte
}

// refuseTimeout bounds the write of a refusal, so a client that does not
// read cannot hold the goroutine.
const refuseTimeout = 2 * time.Second

func (l *listener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		ip := addrOf(c.RemoteAddr())
		r := l.g.open(ip)
		if r == "" {
			return &conn{Conn: c, g: l.g, ip: ip}, nil
		}
		l.g.log.Warn("connection refused", "proto", l.proto, "remote", ip.String(), "reason", string(r))
		metrics.ConnectionsRefused.WithLabelValues(l.proto, limitLabel[r]).Inc()
		go func() {
			if l.refuse != nil {
				c.SetWriteDeadline(time.Now().Add(refuseTimeout))
				c.Write(l.refuse(string(r)))
			}
			c.Close()
		}()
	}
}

type conn struct {
	net.Conn
	g    *Guard
	ip   netip.Addr
	once sync.Once
}

func (c *conn) Close() error {
	c.once.Do(func() { c.g.close(c.ip) })
	return c.Conn.Close()
}

// SyscallConn gives hangup.Watch the socket under the guard's wrapper:
// without it a command's work went on to its deadline after the client
// hung up, on every connection the guard let in.
func (c *conn) SyscallConn() (syscall.RawConn, error) {
	sc, ok := c.Conn.(syscall.Conn)
	if !ok {
		return nil, errors.New("guard: connection has no socket")
	}
	return sc.SyscallConn()
}

// failDelay is the delay after the n-th failed login (n ≥ 1) of an address
// or account: base doubled for each failure before it, up to max.
func failDelay(n int, base, max time.Duration) time.Duration {
	if base <= 0 || n <= 0 {
		return 0
	}
	d := base
	for i := 1; i < n && d < max; i++ {
		d *= 2
	}
	return min(d, max)
}

// count adds a failure at now to f, starting a new window when the last
// one is over, and returns the count.
func (f *failures) count(now time.Time, window time.Duration) int {
	if f.n == 0 || now.Sub(f.first) > window {
		f.n, f.first = 0, now
	}
	f.n++
	return f.n
}

// Logins returns the logins that succeeded and failed on this node since
// it started (every protocol's logins pass the guard).
func (g *Guard) Logins() (ok, failed uint64) {
	return g.logins.Load(), g.loginFailures.Load()
}

// LoginCounts returns the logins that succeeded and failed on this node since
// it started (every protocol's logins pass the guard).
func (g *Guard) LoginCounts() (ok, failed uint64) {
	return g.logins.Load(), g.loginFailures.Load()
}

// LoginAllowed says whether a login from remote may be checked at all: an
// address locked out gets ErrLockedOut, before any password is hashed.
func (g *Guard) LoginAllowed(remote net.Addr) error {
	ip := addrOf(remote)
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.ips[ip]; st != nil && g.now().Before(st.locked) {
		return ErrLockedOut
	}
	return nil
}

// LoginFailed records a failed login of account from remote and returns
// how long to wait before answering it.
func (g *Guard) LoginFailed(remote net.Addr, account string) time.Duration {
	g.loginFailures.Add(1)
	ip := addrOf(remote)
	now := g.now()
	g.mu.Lock()
	defer g.mu.Unlock()
	st := g.stateLocked(ip)
	nIP := st.fails.count(now, g.lim.AuthWindow)
	if nIP >= g.lim.LockoutAfter && now.After(st.locked) {
		st.locked = now.Add(g.lim.LockoutFor)
		g.log.Warn("address locked out of logging in", "remote", ip.String(), "failures", nIP, "for", g.lim.LockoutFor)
		if g.OnLockout != nil {
			g.OnLockout(ip, st.locked)
		}
	}
	if len(g.ips) > maxAccounts {
		for a, ast := range g.ips {
			g.forgetLocked(a, ast)
		}
	}
	f := g.accounts[account]
	if f == nil {
		f = &failures{}
		g.accounts[account] = f
	}
	nAcct := f.count(now, g.lim.AuthWindow)
	// Accounts seen once and long ago are dropped as others fail, so
	// guessing at many names cannot grow the map without bound.
	if len(g.accounts) > maxAccounts {
		for a, af := range g.accounts {
			if now.Sub(af.first) > g.lim.AuthWindow {
				delete(g.accounts, a)
			}
		}
	}
	return failDelay(max(nIP, nAcct), g.lim.AuthFailDelay, g.lim.AuthMaxDelay)
}

// maxLockout bounds a lockout another node asks for: a peer's clock or a
// corrupt message must not lock an address out for good.
const maxLockout = 24 * time.Hour

// LockOut applies a lockout another node decided: the address may not log
// in here either until then, so once one node locks an address out, no
// node lets it guess. (The failure counts stay per node: before the first
// lockout, N nodes take up to N times LockoutAfter failures.) It never
// shortens a lockout. Peers are trusted as the whole gossip is.
func (g *Guard) LockOut(ip netip.Addr, until time.Time) {
	now := g.now()
	if !ip.IsValid() || !until.After(now) {
		return
	}
	if limit := now.Add(maxLockout); until.After(limit) {
		until = limit
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.ips[ip.Unmap()] == nil && len(g.ips) >= maxAccounts {
		return // a flood of peers' lockouts must not grow the table without bound
	}
	st := g.stateLocked(ip.Unmap())
	if until.After(st.locked) {
		st.locked = until
		g.log.Warn("address locked out of logging in, as another node decided", "remote", ip.String(), "until", until.Format(time.RFC3339))
	}
}

// maxAccounts is the number of accounts (and of addresses) with failures
// kept before old ones are swept.
const maxAccounts = 10000

// LoginSucceeded clears the failures of remote's address (not the
// account's: a right password from one address says nothing of others).
func (g *Guard) LoginSucceeded(remote net.Addr) {
	g.logins.Add(1)
	ip := addrOf(remote)
	g.mu.Lock()
	defer g.mu.Unlock()
	if st := g.ips[ip]; st != nil {
		st.fails = failures{}
	}
}

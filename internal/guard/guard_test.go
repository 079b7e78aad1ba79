package guard

import (
	"bufio"
	"context"
	"net"
	"net/netip"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/hangup"
)

func TestAdmitCapsTotalPerAddressAndRate(t *testing.T) {
	lim := Limits{MaxConns: 10, MaxConnsPerIP: 3, RatePerIP: 2}.withDefaults()
	now := time.Unix(1000, 0)
	st := &ipState{}
	if r := admit(lim, st, 10, now); r != tooManyTotal {
		t.Errorf("at the total cap: %q", r)
	}
	st.conns = 3
	if r := admit(lim, st, 5, now); r != tooManyFromIP {
		t.Errorf("at the per-address cap: %q", r)
	}
	st.conns = 0
	for i := 0; i < 2; i++ {
		if r := admit(lim, st, 0, now); r != "" {
			t.Fatalf("connection %d within the rate: %q", i, r)
		}
	}
	if r := admit(lim, st, 0, now); r != tooFastFromIP {
		t.Errorf("third connection in the same instant at 2/min: %q", r)
	}
	if r := admit(lim, st, 0, now.Add(30*time.Second)); r != "" {
		t.Errorf("after half a minute (one token back): %q", r)
	}
}

func TestFailDelayDoublesUpToTheMax(t *testing.T) {
	for n, want := range map[int]time.Duration{0: 0, 1: time.Second, 2: 2 * time.Second, 3: 4 * time.Second, 5: 16 * time.Second, 50: 16 * time.Second} {
		if got := failDelay(n, time.Second, 16*time.Second); got != want {
			t.Errorf("failDelay(%d) = %v, want %v", n, got, want)
		}
	}
}

func addr(s string) net.Addr { a, _ := net.ResolveTCPAddr("tcp", s); return a }

func TestLockoutIsPerAddressAndEnds(t *testing.T) {
	g := New(Limits{LockoutAfter: 3, LockoutFor: time.Minute, AuthFailDelay: time.Millisecond}, nil)
	now := time.Unix(1000, 0)
	g.now = func() time.Time { return now }
	bad, other := addr("192.0.2.1:1000"), addr("192.0.2.2:1000")
	var d time.Duration
	for i := 0; i < 3; i++ {
		if err := g.LoginAllowed(bad); err != nil {
			t.Fatalf("failure %d: locked out early", i)
		}
		d = g.LoginFailed(bad, "alice@example.org")
	}
	if d != 4*time.Millisecond {
		t.Errorf("third failure delay %v, want 4ms", d)
	}
	if err := g.LoginAllowed(bad); err != ErrLockedOut {
		t.Fatalf("after 3 failures: %v, want ErrLockedOut", err)
	}
	if err := g.LoginAllowed(other); err != nil {
		t.Fatalf("another address is locked out too: %v", err)
	}
	// The account's failures slow a failure from another address, but a
	// right password from there is not delayed (no call) nor refused.
	if d := g.LoginFailed(other, "alice@example.org"); d != 8*time.Millisecond {
		t.Errorf("the account's fourth failure from elsewhere waits %v, want 8ms", d)
	}
	now = now.Add(time.Minute + time.Second)
	if err := g.LoginAllowed(bad); err != nil {
		t.Fatalf("after the lockout: %v", err)
	}
}

func TestListenerRefusesOverTheCapWithTheProtocolsLine(t *testing.T) {
	g := New(Limits{MaxConnsPerIP: 2}, nil)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := g.Listener("pop3", raw, func(reason string) []byte { return []byte("-ERR [SYS/TEMP] " + reason + "\r\n") })
	defer l.Close()
	accepted := make(chan net.Conn, 10)
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			accepted <- c
		}
	}()
	var clients []net.Conn
	for i := 0; i < 3; i++ {
		c, err := net.Dial("tcp", raw.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		clients = append(clients, c)
	}
	s1, s2 := <-accepted, <-accepted
	clients[2].SetReadDeadline(time.Now().Add(5 * time.Second))
	line, _ := bufio.NewReader(clients[2]).ReadString('\n')
	if !strings.HasPrefix(line, "-ERR [SYS/TEMP] too many connections from your address") {
		t.Fatalf("third connection got %q", line)
	}
	if n, _ := g.Open(); n != 2 {
		t.Fatalf("%d connections counted, want 2", n)
	}
	s1.Close()
	s1.Close() // counted once
	if n, _ := g.Open(); n != 1 {
		t.Fatalf("%d connections counted after a close, want 1", n)
	}
	c, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	select {
	case s3 := <-accepted:
		s3.Close()
	case <-time.After(5 * time.Second):
		t.Fatal("a connection under the cap again was not accepted")
	}
	s2.Close()
}

// TestLockoutSharedWithPeers: a lockout decided here is told (OnLockout),
// and one a peer decided is applied here, never shortened, at most a day.
func TestLockoutSharedWithPeers(t *testing.T) {
	a := New(Limits{LockoutAfter: 2, LockoutFor: time.Minute, AuthFailDelay: time.Millisecond}, nil)
	b := New(Limits{LockoutAfter: 2, LockoutFor: time.Minute, AuthFailDelay: time.Millisecond}, nil)
	now := time.Unix(1000, 0)
	a.now = func() time.Time { return now }
	b.now = a.now
	a.OnLockout = b.LockOut // the cluster's gossip, without the network
	bad := addr("[::ffff:192.0.2.1]:1000")
	a.LoginFailed(bad, "x@example.org")
	a.LoginFailed(bad, "x@example.org")
	if err := b.LoginAllowed(addr("192.0.2.1:2000")); err != ErrLockedOut {
		t.Fatalf("peer after the lockout: %v, want ErrLockedOut", err)
	}
	ip := netip.MustParseAddr("192.0.2.1")
	b.LockOut(ip, now.Add(time.Second)) // shorter: ignored
	now = now.Add(30 * time.Second)
	if b.LoginAllowed(bad) != ErrLockedOut {
		t.Error("a shorter lockout from a peer shortened the one in force")
	}
	now = now.Add(time.Minute)
	if b.LoginAllowed(bad) != nil {
		t.Error("the shared lockout did not end")
	}
	b.LockOut(ip, now.Add(1000*time.Hour))
	now = now.Add(25 * time.Hour)
	if b.LoginAllowed(bad) != nil {
		t.Error("a peer's lockout lasted more than a day")
	}
	b.LockOut(netip.Addr{}, now.Add(time.Hour)) // garbage: ignored
}

// A connection the guard let in still shows its socket, so a command's
// work is cancelled when the client resets it (hangup.Watch): the guard's
// wrapper hid it, and the watch did nothing on every protocol listener.
func TestGuardedConnHangUpNoticed(t *testing.T) {
	g := New(Limits{MaxConnsPerIP: 2}, nil)
	raw, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	l := g.Listener("imap", raw, nil)
	defer l.Close()
	client, err := net.Dial("tcp", raw.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	server, err := l.Accept()
	if err != nil {
		t.Fatal(err)
	}
	defer server.Close()
	if _, ok := server.(syscall.Conn); !ok {
		t.Fatalf("guarded connection %T hides its socket", server)
	}
	ctx, stop := hangup.Watch(context.Background(), server)
	defer stop()
	client.(*net.TCPConn).SetLinger(0) // Close sends a reset
	client.Close()
	select {
	case <-ctx.Done():
	case <-time.After(3 * time.Second):
		t.Fatal("hang-up of a guarded connection not noticed")
	}
}

package cluster

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/rpc"
)

// hung is a Fragment service whose body reads never answer: a node that
// took a call and then stood still.
type hung struct {
	nodepb.UnimplementedFragmentServer
}

func (hung) Body(ctx context.Context, _ *nodepb.BodyRequest) (*nodepb.BodyReply, error) {
	<-ctx.Done()
	return nil, ctx.Err()
}

// A call in flight to a member ends as soon as the member leaves this
// node's live set, not at its deadline, with rpc.ErrNodeGone; a call to a
// node that is not live is not sent (ErrNotLive).
func TestCallEndsWhenItsNodeLeaves(t *testing.T) {
	srv := rpc.NewServer(func() rpc.Load { return rpc.Load{} })
	nodepb.RegisterFragmentServer(srv.Registrar(), hung{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go srv.Serve(l)
	defer srv.Stop()

	a, err := StartMembership(MembershipConfig{Self: "a", Boot: 1, Bind: freeAddr(t), RPC: "unused"})
	if err != nil {
		t.Fatal(err)
	}
	defer a.Shutdown()
	b, err := StartMembership(MembershipConfig{Self: "b", Boot: 1, Bind: freeAddr(t), RPC: l.Addr().String(),
		Seeds: []string{a.cfg.Bind}})
	if err != nil {
		t.Fatal(err)
	}
	waitFor(t, "a to see b", 10*time.Second, func() bool { return len(a.Alive()) == 2 })
	p := &Peers{RPC: rpc.NewClient()}
	defer p.RPC.Close()
	p.SetMembership(a)

	if _, err := p.Conn("nobody"); !errors.Is(err, ErrNotLive) || !errors.Is(err, rpc.ErrUnavailable) {
		t.Fatalf("conn to an unknown node: %v", err)
	}
	cc, err := p.Conn("b")
	if err != nil {
		t.Fatal(err)
	}
	const deadline = 30 * time.Second
	ctx, cancel := context.WithTimeout(context.Background(), deadline)
	defer cancel()
	done := make(chan error, 1)
	start := time.Now()
	go func() {
		_, err := nodepb.NewFragmentClient(cc).Body(ctx, &nodepb.BodyRequest{Id: "x"})
		done <- err
	}()
	time.Sleep(200 * time.Millisecond)
	b.Shutdown() // a graceful leave: a sees it at once
	select {
	case err := <-done:
		if !errors.Is(err, rpc.ErrNodeGone) || !errors.Is(err, rpc.ErrUnavailable) {
			t.Fatalf("call to a node that left ended with %v, want ErrNodeGone", err)
		}
		t.Logf("cut after %v: %v", time.Since(start).Round(time.Millisecond), err)
	case <-time.After(deadline / 2):
		t.Fatal("call to a node that left still running")
	}
	if _, err := p.Conn("b"); !errors.Is(err, ErrNotLive) {
		t.Fatalf("conn to a node that left: %v", err)
	}
}

// OnManager sends a call again after "not the manager" and "not live"
// (nothing was done), and after its node was declared dead only when the
// call is Idempotent.
func TestManagerRetryable(t *testing.T) {
	gone := fmt.Errorf("rpc Writer.Copy to n2: %w", rpc.ErrNodeGone)
	for _, c := range []struct {
		err    error
		repeat Repeat
		want   bool
	}{
		{fmt.Errorf("x: %w", rpc.ErrNotManager), Once, true},
		{fmt.Errorf("node n2: %w", ErrNotLive), Once, true},
		{gone, Idempotent, true},
		{gone, Once, false},
		// An ErrUnavailable the callee answered, or a broken connection:
		// the manager may still be there.
		{fmt.Errorf("push: %w", rpc.ErrUnavailable), Idempotent, false},
		{context.DeadlineExceeded, Idempotent, false},
		{errors.New("mailbox exists"), Idempotent, false},
	} {
		if got := managerRetryable(c.err, c.repeat); got != c.want {
			t.Errorf("managerRetryable(%v, %v) = %v, want %v", c.err, c.repeat, got, c.want)
		}
	}
}

// DetectionTime follows memberlist's LAN settings: on 3 nodes a probe
// round of 3 intervals, the probe, a suspicion of 4 intervals and two
// gossip intervals.
func TestDetectionTime(t *testing.T) {
	if got, want := DetectionTime(3), 8400*time.Millisecond; got != want {
		t.Fatalf("DetectionTime(3) = %v, want %v", got, want)
	}
	if DetectionTime(8) <= DetectionTime(3) {
		t.Fatalf("detection on 8 nodes (%v) not longer than on 3 (%v)", DetectionTime(8), DetectionTime(3))
	}
}

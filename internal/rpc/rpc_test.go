package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/nodepb"
)

// bodies is a Fragment service that only reads bodies: "slow" waits for
// its deadline, anything but "hi" is not found.
type bodies struct {
	nodepb.UnimplementedFragmentServer
}

func (bodies) Body(ctx context.Context, r *nodepb.BodyRequest) (*nodepb.BodyReply, error) {
	switch r.Id {
	case "hi":
		return &nodepb.BodyReply{Raw: []byte("echo " + r.User)}, nil
	case "full":
		return nil, fmt.Errorf("store: disk full: %w", ErrNoSpace)
	case "taken":
		return nil, fmt.Errorf("user %s mailbox %q: %w", r.User, "Lists", errTaken)
	case "slow":
		select {
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
		}
		return nil, ctx.Err()
	}
	return nil, fmt.Errorf("user %s message %s: %w", r.User, r.Id, ErrNotFound)
}

// errTaken stands for a sentinel of another package (mailbox.ErrMailboxExists).
var errTaken = errors.New("mailbox already exists")

func init() { Known(errTaken) }

func TestCallCarriesLoadAndErrors(t *testing.T) {
	s := NewServer(func() Load { return Load{Pending: 7, DiskFull: true} })
	nodepb.RegisterFragmentServer(s.Registrar(), bodies{})
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	go s.Serve(l)
	defer s.Stop()
	c := NewClient()
	defer c.Close()
	var got Load
	c.OnLoad = func(addr string, l Load) { got = l }
	conn, err := c.Conn(l.Addr().String())
	if err != nil {
		t.Fatal(err)
	}
	fc := nodepb.NewFragmentClient(conn)
	rep, err := fc.Body(context.Background(), &nodepb.BodyRequest{User: "bob", Id: "hi"})
	if err != nil {
		t.Fatal(err)
	}
	if string(rep.Raw) != "echo bob" || got.Pending != 7 || !got.DiskFull {
		t.Fatalf("reply %q load %+v", rep.Raw, got)
	}
	_, err = fc.Body(context.Background(), &nodepb.BodyRequest{User: "bob", Id: "gone"})
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("not found across the wire: %v", err)
	}
	if want := "rpc Fragment.Body to " + l.Addr().String(); err == nil || len(err.Error()) < len(want) || err.Error()[:len(want)] != want {
		t.Fatalf("error %q does not name the method and the node", err)
	}
	// A registered sentinel keeps its identity (IMAP's [ALREADYEXISTS]).
	if _, err = fc.Body(context.Background(), &nodepb.BodyRequest{User: "bob", Id: "taken"}); !errors.Is(err, errTaken) ||
		!strings.Contains(err.Error(), `user bob mailbox "Lists": mailbox already exists`) {
		t.Fatalf("known error across the wire: %v", err)
	}
	// A node out of disk space says so across the wire (SMTP's 452).
	if _, err = fc.Body(context.Background(), &nodepb.BodyRequest{Id: "full"}); !errors.Is(err, ErrNoSpace) {
		t.Fatalf("no space across the wire: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = fc.Body(ctx, &nodepb.BodyRequest{Id: "slow"})
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("deadline: %v after %v", err, time.Since(start))
	}
	if _, err := fc.Get(context.Background(), &nodepb.FragmentRequest{}); err == nil {
		t.Fatal("an unimplemented method succeeded")
	}
}

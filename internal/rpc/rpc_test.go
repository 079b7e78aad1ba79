package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"testing"
	"time"
)

type echoReq struct{ Text string }
type echoResp struct{ Text string }

func TestCallCarriesLoadAndErrors(t *testing.T) {
	s := NewServer(func() Load { return Load{Pending: 7, DiskFull: true} })
	s.Handle("Echo", Method(func(ctx context.Context, r *echoReq) (*echoResp, error) {
		return &echoResp{Text: "echo " + r.Text}, nil
	}))
	s.Handle("Missing", Method(func(ctx context.Context, r *echoReq) (*echoResp, error) {
		return nil, fmt.Errorf("user %s: %w", r.Text, ErrNotFound)
	}))
	s.Handle("Slow", Method(func(ctx context.Context, r *echoReq) (*echoResp, error) {
		select {
		case <-time.After(5 * time.Second):
		case <-ctx.Done():
		}
		return nil, ctx.Err()
	}))
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
	var resp echoResp
	if err := c.Call(context.Background(), l.Addr().String(), "Echo", &echoReq{Text: "hi"}, &resp); err != nil {
		t.Fatal(err)
	}
	if resp.Text != "echo hi" || got.Pending != 7 || !got.DiskFull {
		t.Fatalf("resp %+v load %+v", resp, got)
	}
	err = c.Call(context.Background(), l.Addr().String(), "Missing", &echoReq{Text: "bob"}, &resp)
	if !errors.Is(err, ErrNotFound) {
		t.Fatalf("not found across the wire: %v", err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	err = c.Call(ctx, l.Addr().String(), "Slow", &echoReq{}, &resp)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 2*time.Second {
		t.Fatalf("deadline: %v after %v", err, time.Since(start))
	}
	if err := c.Call(context.Background(), l.Addr().String(), "Nope", &echoReq{}, &resp); err == nil {
		t.Fatal("unknown method succeeded")
	}
}

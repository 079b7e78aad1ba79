// Package rpc is the RPC manager of Porcupine §2.2: node-to-node calls
// between the managers of different nodes. It runs on gRPC with a JSON codec
// and one hand-registered service, so the managers declare their methods as
// plain Go functions (no generated code), while transport, deadlines,
// connection management and status codes are gRPC's.
//
// Every call has a deadline (DefaultTimeout unless the caller's context has
// a shorter one), and every reply carries the callee's load in its header
// metadata — Porcupine §5 learns load "from RPC replies", so the caller's
// load balancer hears about a node each time it talks to it.
package rpc

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"strconv"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/encoding"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// DefaultTimeout bounds a call whose context has no earlier deadline. Node to
// node calls are local-network round trips plus at most one fsync.
const DefaultTimeout = 5 * time.Second

// Reconnection to a node that went away. gRPC's default backoff grows to
// two minutes, far longer than a node takes to restart; membership already
// tells callers which nodes are gone, so reconnecting quickly is cheap.
var reconnectBackoff = backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: time.Second}

// minConnectTimeout bounds one connection attempt.
const minConnectTimeout = 2 * time.Second

// serviceName is the one gRPC service every node exposes.
const serviceName = "quill.Node"

const loadKey = "x-quill-load"

// Load is what a reply says about the callee's load.
type Load struct {
	Pending  int  // pending disk operations
	DiskFull bool // no room for new mail
}

// jsonCodec lets gRPC carry JSON-encoded Go structs.
type jsonCodec struct{}

func (jsonCodec) Marshal(v any) ([]byte, error) {
	if r, ok := v.(*rawMsg); ok {
		return r.b, nil
	}
	return json.Marshal(v)
}
func (jsonCodec) Unmarshal(data []byte, v any) error {
	if r, ok := v.(*rawMsg); ok {
		r.b = append(r.b[:0], data...)
		return nil
	}
	return json.Unmarshal(data, v)
}
func (jsonCodec) Name() string { return "json" }

func init() { encoding.RegisterCodec(jsonCodec{}) }

type rawMsg struct{ b []byte }

// Handler serves one method: it decodes req into its own type and returns
// the reply value.
type Handler func(ctx context.Context, req json.RawMessage) (any, error)

// Method adapts a typed function to a Handler.
func Method[Req, Resp any](f func(ctx context.Context, req *Req) (*Resp, error)) Handler {
	return func(ctx context.Context, raw json.RawMessage) (any, error) {
		var req Req
		if err := json.Unmarshal(raw, &req); err != nil {
			return nil, status.Errorf(codes.InvalidArgument, "decode request: %v", err)
		}
		return f(ctx, &req)
	}
}

// Server serves this node's methods.
type Server struct {
	g       *grpc.Server
	load    func() Load
	mu      sync.RWMutex
	methods map[string]Handler

	// active counts handlers running; idle is signalled when it drops to
	// zero (Drain waits for it: gRPC's Stop cancels calls but does not
	// wait for their handlers to return).
	activeMu sync.Mutex
	active   int
	idle     *sync.Cond
}

// handlerExitWait bounds how long Drain waits, after cancelling the calls
// still running, for their handlers to notice and return.
const handlerExitWait = 5 * time.Second

// NewServer returns a server that reports load() on every reply.
func NewServer(load func() Load) *Server {
	s := &Server{load: load, methods: map[string]Handler{}}
	s.idle = sync.NewCond(&s.activeMu)
	s.g = grpc.NewServer(grpc.ForceServerCodec(jsonCodec{}), grpc.UnknownServiceHandler(s.dispatch))
	return s
}

// Handle registers a method.
func (s *Server) Handle(name string, h Handler) {
	s.mu.Lock()
	s.methods[name] = h
	s.mu.Unlock()
}

// Serve accepts calls on l until Stop.
func (s *Server) Serve(l net.Listener) error { return s.g.Serve(l) }

// Stop ends every call and closes the listener.
func (s *Server) Stop() { s.g.Stop() }

// Drain stops taking calls and lets the calls in progress finish until ctx
// is done; then it cancels the rest and waits (at most handlerExitWait) for
// their handlers to return, so that what they use can be closed after.
// It reports how many handlers were still running when it gave up.
func (s *Server) Drain(ctx context.Context) int {
	done := make(chan struct{})
	go func() { s.g.GracefulStop(); close(done) }()
	select {
	case <-done:
	case <-ctx.Done():
		s.g.Stop()
		<-done
	}
	deadline := time.Now().Add(handlerExitWait)
	t := time.AfterFunc(handlerExitWait, func() {
		s.activeMu.Lock()
		s.idle.Broadcast()
		s.activeMu.Unlock()
	})
	defer t.Stop()
	s.activeMu.Lock()
	defer s.activeMu.Unlock()
	for s.active > 0 && time.Now().Before(deadline) {
		s.idle.Wait()
	}
	return s.active
}

func (s *Server) dispatch(srv any, stream grpc.ServerStream) error {
	full, ok := grpc.MethodFromServerStream(stream)
	if !ok {
		return status.Error(codes.Internal, "no method name")
	}
	name := full[len("/"+serviceName+"/"):]
	if len(full) <= len(serviceName)+2 || full[:len(serviceName)+2] != "/"+serviceName+"/" {
		return status.Errorf(codes.Unimplemented, "unknown service in %s", full)
	}
	s.mu.RLock()
	h := s.methods[name]
	s.mu.RUnlock()
	if h == nil {
		return status.Errorf(codes.Unimplemented, "unknown method %s", name)
	}
	var req rawMsg
	if err := stream.RecvMsg(&req); err != nil {
		return err
	}
	s.activeMu.Lock()
	s.active++
	s.activeMu.Unlock()
	defer func() {
		s.activeMu.Lock()
		if s.active--; s.active == 0 {
			s.idle.Broadcast()
		}
		s.activeMu.Unlock()
	}()
	resp, err := h(stream.Context(), req.b)
	ld := s.load()
	stream.SetHeader(metadata.Pairs(loadKey, strconv.Itoa(ld.Pending)+","+strconv.FormatBool(ld.DiskFull)))
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return err
		}
		return status.Error(codeOf(err), err.Error())
	}
	return stream.SendMsg(resp)
}

// Errors that cross the wire keep their meaning through gRPC codes.
var (
	ErrNotFound    = errors.New("not found")
	ErrNotManager  = errors.New("not the manager of this bucket")
	ErrUnavailable = errors.New("node unavailable")
)

func codeOf(err error) codes.Code {
	switch {
	case errors.Is(err, ErrNotFound):
		return codes.NotFound
	case errors.Is(err, ErrNotManager):
		return codes.FailedPrecondition
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	default:
		return codes.Unknown
	}
}

// Client calls other nodes. Connections are made on first use and kept.
type Client struct {
	// OnLoad, if set, is told the load every reply carries.
	OnLoad func(addr string, l Load)
	mu     sync.Mutex
	conns  map[string]*grpc.ClientConn
}

// NewClient returns a client.
func NewClient() *Client { return &Client{conns: map[string]*grpc.ClientConn{}} }

func (c *Client) conn(addr string) (*grpc.ClientConn, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if cc, ok := c.conns[addr]; ok {
		return cc, nil
	}
	cc, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithConnectParams(grpc.ConnectParams{Backoff: reconnectBackoff, MinConnectTimeout: minConnectTimeout}),
		// A call to a node that is restarting waits, within its deadline,
		// for the connection instead of failing at once while gRPC backs
		// off between reconnects.
		grpc.WithDefaultCallOptions(grpc.ForceCodec(jsonCodec{}), grpc.WaitForReady(true)))
	if err != nil {
		return nil, err
	}
	c.conns[addr] = cc
	return cc, nil
}

// Call invokes method on the node at addr. The error says which node and
// method failed; errors.Is(err, ErrNotFound) etc. hold across the wire.
func (c *Client) Call(ctx context.Context, addr, method string, req, resp any) error {
	if _, ok := ctx.Deadline(); !ok {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
		defer cancel()
	}
	cc, err := c.conn(addr)
	if err != nil {
		return fmt.Errorf("rpc %s to %s: %w", method, addr, err)
	}
	var hdr metadata.MD
	err = cc.Invoke(ctx, "/"+serviceName+"/"+method, req, resp, grpc.Header(&hdr))
	if v := hdr.Get(loadKey); len(v) == 1 && c.OnLoad != nil {
		var l Load
		fmt.Sscanf(v[0], "%d,%t", &l.Pending, &l.DiskFull)
		c.OnLoad(addr, l)
	}
	if err != nil {
		return fmt.Errorf("rpc %s to %s: %w", method, addr, fromStatus(err))
	}
	return nil
}

func fromStatus(err error) error {
	st, ok := status.FromError(err)
	if !ok {
		return err
	}
	switch st.Code() {
	case codes.NotFound:
		return fmt.Errorf("%s: %w", st.Message(), ErrNotFound)
	case codes.FailedPrecondition:
		return fmt.Errorf("%s: %w", st.Message(), ErrNotManager)
	case codes.Unavailable:
		return fmt.Errorf("%s: %w", st.Message(), ErrUnavailable)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w", st.Message(), context.DeadlineExceeded)
	default:
		return errors.New(st.Message())
	}
}

// Close closes every connection.
func (c *Client) Close() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for a, cc := range c.conns {
		cc.Close()
		delete(c.conns, a)
	}
}

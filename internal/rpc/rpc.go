// Package rpc is the RPC manager of Porcupine §2.2: node-to-node calls
// between the managers of different nodes, on gRPC. The services themselves
// are declared once in Protocol Buffers (proto/quill/v1, generated into
// internal/nodepb), one per manager; each manager's package implements its
// service and converts its own types at the edge. This package adds what
// every call shares:
//
//   - a deadline on every call (DefaultTimeout unless the caller's context
//     has a shorter one);
//   - the callee's load on every reply, in the header metadata — Porcupine
//     §5 learns load "from RPC replies", so the caller's load balancer
//     hears about a node each time it talks to it;
//   - errors that keep their meaning across the wire (ErrNotFound,
//     ErrNotManager, ErrUnavailable, deadlines) through gRPC status codes,
//     and name the method and the callee on the caller's side;
//   - counters of calls and bytes per method (stats.go), and a drain that
//     waits for the handlers still running at shutdown.
package rpc

import (
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
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

// maxMessage bounds one call's message: a message body (the SMTP limit,
// 25 MB by default) plus its envelope. gRPC's default, 4 MB, would refuse
// to replicate a large message.
const maxMessage = 64 << 20

const loadKey = "x-quill-load"

// Load is what a reply says about the callee's load.
type Load struct {
	Pending  int  // pending disk operations
	DiskFull bool // no room for new mail
}

// Server serves this node's services.
type Server struct {
	g    *grpc.Server
	load func() Load

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
	s := &Server{load: load}
	s.idle = sync.NewCond(&s.activeMu)
	s.g = grpc.NewServer(grpc.UnaryInterceptor(s.intercept), grpc.StatsHandler(statsHandler{side: "server"}),
		grpc.MaxRecvMsgSize(maxMessage), grpc.MaxSendMsgSize(maxMessage))
	return s
}

// Registrar is where the managers register their services.
func (s *Server) Registrar() grpc.ServiceRegistrar { return s.g }

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

// intercept runs every handler: it counts it for Drain, puts this node's
// load in the reply's header, and turns a Go error into a status that keeps
// its meaning on the other side.
func (s *Server) intercept(ctx context.Context, req any, _ *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
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
	resp, err := h(ctx, req)
	ld := s.load()
	grpc.SetHeader(ctx, metadata.Pairs(loadKey, strconv.Itoa(ld.Pending)+","+strconv.FormatBool(ld.DiskFull)))
	if err != nil {
		if _, ok := status.FromError(err); ok {
			return nil, err
		}
		return nil, status.Error(codeOf(err), err.Error())
	}
	return resp, nil
}

// Errors that cross the wire keep their meaning through gRPC codes.
var (
	ErrNotFound    = errors.New("not found")
	ErrNotManager  = errors.New("not the manager of this bucket")
	ErrUnavailable = errors.New("node unavailable")
	// ErrNodeGone: the membership stopped counting the callee live (it
	// was declared dead, left, or came back with a new boot) while a call
	// to it was in flight, and the call was cut short then instead of at
	// its deadline (cluster.Peers). What the call did on that node, if
	// anything, is unknown. It is an ErrUnavailable.
	ErrNodeGone = fmt.Errorf("node gone from the cluster: %w", ErrUnavailable)
	// ErrNoSpace: the node has no disk space for the write (its store's
	// reserve, or a replica refusing content); SMTP says 452 4.3.1 for it
	// on whichever node the client reached.
	ErrNoSpace = errors.New("no disk space")
)

// known are the sentinel errors of other packages registered with Known.
var known struct {
	sync.RWMutex
	errs []error
}

// Known registers sentinel errors (a missing mailbox, a name taken) that
// must keep their identity across the wire, so a node answers a client
// the same whichever node ran the call. Their text is in the status
// message (wrapped with %w); the caller's side wraps the one it finds
// again.
func Known(errs ...error) {
	known.Lock()
	defer known.Unlock()
	known.errs = append(known.errs, errs...)
}

// asKnown wraps the registered sentinel msg holds, if any.
func asKnown(msg string) error {
	known.RLock()
	defer known.RUnlock()
	for _, e := range known.errs {
		if i := strings.LastIndex(msg, e.Error()); i >= 0 {
			return fmt.Errorf("%s%w%s", msg[:i], e, msg[i+len(e.Error()):])
		}
	}
	return errors.New(msg)
}

func codeOf(err error) codes.Code {
	switch {
	case errors.Is(err, ErrNotFound):
		return codes.NotFound
	case errors.Is(err, ErrNotManager):
		return codes.FailedPrecondition
	case errors.Is(err, ErrUnavailable):
		return codes.Unavailable
	case errors.Is(err, ErrNoSpace):
		return codes.ResourceExhausted
	case errors.Is(err, context.DeadlineExceeded):
		return codes.DeadlineExceeded
	case errors.Is(err, context.Canceled):
		return codes.Canceled
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

// Conn returns the connection to the node at addr, for a generated client.
// Calls on it get a deadline, report the callee's load and return errors
// that name the method and the node.
func (c *Client) Conn(addr string) (grpc.ClientConnInterface, error) {
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
		grpc.WithDefaultCallOptions(grpc.WaitForReady(true), grpc.MaxCallRecvMsgSize(maxMessage), grpc.MaxCallSendMsgSize(maxMessage)),
		grpc.WithUnaryInterceptor(c.intercept(addr)),
		grpc.WithStatsHandler(statsHandler{side: "client"}))
	if err != nil {
		return nil, fmt.Errorf("rpc to %s: %w", addr, err)
	}
	c.conns[addr] = cc
	return cc, nil
}

func (c *Client) intercept(addr string) grpc.UnaryClientInterceptor {
	return func(ctx context.Context, method string, req, reply any, cc *grpc.ClientConn, invoker grpc.UnaryInvoker, opts ...grpc.CallOption) error {
		if _, ok := ctx.Deadline(); !ok {
			var cancel context.CancelFunc
			ctx, cancel = context.WithTimeout(ctx, DefaultTimeout)
			defer cancel()
		}
		var hdr metadata.MD
		err := invoker(ctx, method, req, reply, cc, append(opts, grpc.Header(&hdr))...)
		if v := hdr.Get(loadKey); len(v) == 1 && c.OnLoad != nil {
			var l Load
			fmt.Sscanf(v[0], "%d,%t", &l.Pending, &l.DiskFull)
			c.OnLoad(addr, l)
		}
		if err != nil {
			return fmt.Errorf("rpc %s to %s: %w", shortMethod(method), addr, fromStatus(err))
		}
		return nil
	}
}

// shortMethod turns "/quill.v1.Writer/Alloc" into "Writer.Alloc".
func shortMethod(m string) string {
	i := strings.LastIndex(m, "/")
	svc, name := m[:max(i, 0)], m[i+1:]
	if j := strings.LastIndex(svc, "."); j >= 0 {
		svc = svc[j+1:]
	}
	return svc + "." + name
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
	case codes.ResourceExhausted:
		return fmt.Errorf("%s: %w", st.Message(), ErrNoSpace)
	case codes.DeadlineExceeded:
		return fmt.Errorf("%s: %w", st.Message(), context.DeadlineExceeded)
	case codes.Canceled:
		return fmt.Errorf("%s: %w", st.Message(), context.Canceled)
	default:
		return asKnown(st.Message())
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

package sns

import (
	"context"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/signal"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quillmail/quill/internal/mailauth"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/queue"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

// RelayClass is the class of the workers that deliver outbound mail.
const RelayClass = "relay"

// chooseTimeout bounds the wait for a worker (one being launched or
// restarted): a worker that cannot start fails the task for now rather
// than holding the queue's attempt.
const chooseTimeout = 3 * launchTimeout

// relayTimeout bounds one relay task: RFC 5321's timeouts of one
// transaction, with room.
const relayTimeout = 20 * time.Minute

// Relay makes the relay workers the outbound queue's way to other
// domains' servers (queue.Remote): this node's pool and, when the node
// takes part in the SNS manager's table (Manager set), the other nodes'
// pools too, reached over the node RPC (RegisterNode).
type Relay struct {
	Pool *Pool
	// Manager, when set, holds the other nodes' load reports; Conn
	// reaches a node's RPC. An overflow node (Manager.Overflow) takes
	// tasks on its own workers only when it has some (launched by the
	// manager) or no other node has any (SNS §3.3.4).
	Manager *Manager
	Conn    func(node string) (grpc.ClientConnInterface, error)
	// inflight counts the tasks sent to each other node since its last
	// report: the correction of §3.3.2 for remote workers.
	inflight *inflight
}

type inflight struct {
	mu sync.Mutex
	n  map[string]int
	at map[string]time.Time // the report the count runs from
}

// Deliver hands the delivery to a relay worker chosen by lottery: one of
// this node's, or another node's through its RPC. A worker that dies or
// cannot be had fails the task for now: the queue tries it again (SNS
// §3.4.2: tasks are restartable).
func (r Relay) Deliver(ctx context.Context, domain, from string, rcpts []string, body []byte) []queue.Result {
	if node := r.pickNode(time.Now(), rand.Float64()); node != "" {
		res, err := r.deliverRemote(ctx, node, &nodepb.RelayTask{Domain: domain, From: from, Rcpts: rcpts, Body: body})
		if err == nil && len(res) == len(rcpts) {
			r.Pool.mu.Lock()
			r.Pool.remote++
			r.Pool.mu.Unlock()
			return res
		}
		// The other node's workers could not be had: this node's then.
		r.Pool.cfg.Log.Warn("sns: relay task not taken by another node; delivering through this node's workers",
			"node", node, "domain", domain, "err", err)
	}
	return r.deliverLocal(ctx, domain, from, rcpts, body)
}

// pickNode draws the node for a task by lottery over every worker of the
// class the table knows ("" is this node): each worker holds tickets
// inversely proportional to its node's load per worker, corrected by the
// tasks sent there since its report.
func (r Relay) pickNode(now time.Time, draw float64) string {
	if r.Manager == nil || r.Conn == nil || r.inflight == nil {
		return ""
	}
	rows := r.Manager.Remote(r.Pool.cfg.Class, now)
	if len(rows) == 0 {
		return ""
	}
	mine := r.Pool.Report()
	var loads []int
	var owner []string
	if !r.Manager.Overflow || mine.Workers > 0 {
		n := max(mine.Workers, 1)
		for range n {
			loads = append(loads, ceilDiv(mine.Pending, n))
			owner = append(owner, "")
		}
	}
	r.inflight.mu.Lock()
	for _, row := range rows {
		if !r.inflight.at[row.Node].Equal(row.At) {
			r.inflight.at[row.Node], r.inflight.n[row.Node] = row.At, 0
		}
		l := ceilDiv(row.Pending+r.inflight.n[row.Node], row.Workers)
		for range row.Workers {
			loads = append(loads, l)
			owner = append(owner, row.Node)
		}
	}
	node := owner[Pick(loads, draw)]
	if node != "" {
		r.inflight.n[node]++
	}
	r.inflight.mu.Unlock()
	return node
}

// acquire picks a worker for a task (waiting at most chooseTimeout for
// one being launched or restarted) and returns it with its client.
func (p *Pool) acquire(ctx context.Context) (*worker, nodepb.WorkerClient, error) {
	cctx, cancel := context.WithTimeout(ctx, chooseTimeout)
	w, err := p.choose(cctx)
	cancel()
	if err != nil {
		return nil, nil, err
	}
	p.mu.Lock()
	c := w.client
	p.mu.Unlock()
	if c == nil {
		return nil, nil, fmt.Errorf("worker %d ended before the task reached it", w.id)
	}
	return w, c, nil
}

func ceilDiv(a, b int) int { return (a + b - 1) / max(b, 1) }

// deliverRemote hands the task to another node's pool.
func (r Relay) deliverRemote(ctx context.Context, node string, t *nodepb.RelayTask) ([]queue.Result, error) {
	conn, err := r.Conn(node)
	if err != nil {
		return nil, err
	}
	rctx, cancel := context.WithTimeout(ctx, relayTimeout)
	defer cancel()
	rep, err := nodepb.NewWorkerClient(conn).Relay(rctx, t)
	if err != nil {
		return nil, err
	}
	return results(rep), nil
}

func results(rep *nodepb.RelayResults) []queue.Result {
	out := make([]queue.Result, 0, len(rep.Results))
	for _, x := range rep.Results {
		out = append(out, queue.Result{Rcpt: x.Rcpt, Delivered: x.Delivered, Permanent: x.Permanent, Code: int(x.Code),
			Status: x.Status, Text: x.Text, Remote: x.Remote})
	}
	return out
}

// deliverLocal hands the delivery to one of this node's workers.
func (r Relay) deliverLocal(ctx context.Context, domain, from string, rcpts []string, body []byte) []queue.Result {
	fail := func(err error) []queue.Result {
		out := make([]queue.Result, len(rcpts))
		for i, rc := range rcpts {
			out[i] = queue.Result{Rcpt: rc, Status: "4.4.0", Text: "relay worker: " + err.Error()}
		}
		return out
	}
	w, c, err := r.Pool.acquire(ctx)
	if err != nil {
		return fail(err)
	}
	rctx, rcancel := context.WithTimeout(ctx, relayTimeout)
	defer rcancel()
	rep, err := c.Relay(rctx, &nodepb.RelayTask{Domain: domain, From: from, Rcpts: rcpts, Body: body})
	if err != nil {
		// The cause (a gRPC error naming the socket) goes to the log,
		// not into the entry and the sender's DSN.
		r.Pool.cfg.Log.Warn("sns: relay task failed on its worker", "worker", w.id, "domain", domain, "err", err)
		return fail(fmt.Errorf("worker %d ended mid-delivery; tried again later", w.id))
	}
	out := results(rep)
	if len(out) != len(rcpts) {
		return fail(fmt.Errorf("worker %d answered for %d of %d recipients", w.id, len(out), len(rcpts)))
	}
	return out
}

// NewClusterRelay is a Relay over this node's pool and the other nodes'
// that the manager's table knows.
func NewClusterRelay(pool *Pool, m *Manager, conn func(node string) (grpc.ClientConnInterface, error)) Relay {
	return Relay{Pool: pool, Manager: m, Conn: conn,
		inflight: &inflight{n: map[string]int{}, at: map[string]time.Time{}}}
}

// NodeService serves this node's pool to the other nodes on the node's
// RPC server: a task that arrives there goes to this node's workers only.
// It is registered when the RPC server is made and given its pool when the
// node starts its queue; until then it answers Unavailable.
type NodeService struct{ pool atomic.Pointer[Pool] }

// Register adds the service to the node's RPC server.
func (s *NodeService) Register(reg grpc.ServiceRegistrar) {
	nodepb.RegisterWorkerServer(reg, nodeServer{s: s})
}

// SetPool gives the service its pool.
func (s *NodeService) SetPool(p *Pool) { s.pool.Store(p) }

// Pool returns the service's pool (nil until SetPool).
func (s *NodeService) Pool() *Pool { return s.pool.Load() }

type nodeServer struct {
	nodepb.UnimplementedWorkerServer
	s *NodeService
}

func (n nodeServer) Relay(ctx context.Context, t *nodepb.RelayTask) (*nodepb.RelayResults, error) {
	p := n.s.pool.Load()
	if p == nil {
		return nil, status.Error(codes.Unavailable, "no relay workers on this node")
	}
	return resultsPB(Relay{Pool: p}.deliverLocal(ctx, t.Domain, t.From, t.Rcpts, t.Body)), nil
}

// resultsPB is the wire form of results (the inverse of results).
func resultsPB(res []queue.Result) *nodepb.RelayResults {
	out := &nodepb.RelayResults{}
	for _, r := range res {
		out.Results = append(out.Results, &nodepb.RelayResult{Rcpt: r.Rcpt, Delivered: r.Delivered, Permanent: r.Permanent,
			Code: int32(r.Code), Status: r.Status, Text: r.Text, Remote: r.Remote})
	}
	return out
}

func (n nodeServer) Load(ctx context.Context, _ *nodepb.Empty) (*nodepb.WorkerLoad, error) {
	p := n.s.pool.Load()
	if p == nil {
		return &nodepb.WorkerLoad{}, nil
	}
	return &nodepb.WorkerLoad{Pending: int32(p.Report().Pending)}, nil
}

// worker side

type relayServer struct {
	nodepb.UnimplementedWorkerServer
	remote  queue.Remote      // class relay
	checker *mailauth.Checker // class filter
	pending atomic.Int32
	done    atomic.Int64
}

func (s *relayServer) Relay(ctx context.Context, t *nodepb.RelayTask) (*nodepb.RelayResults, error) {
	if s.remote == nil {
		return nil, status.Error(codes.Unimplemented, "not a relay worker")
	}
	s.pending.Add(1)
	defer s.pending.Add(-1)
	defer s.done.Add(1)
	return resultsPB(s.remote.Deliver(ctx, t.Domain, t.From, t.Rcpts, t.Body)), nil
}

func (s *relayServer) Filter(ctx context.Context, t *nodepb.FilterTask) (*nodepb.FilterVerdict, error) {
	if s.checker == nil {
		return nil, status.Error(codes.Unimplemented, "not a filter worker")
	}
	s.pending.Add(1)
	defer s.pending.Add(-1)
	defer s.done.Add(1)
	return verdictPB(s.checker.Check(ctx, net.IP(t.Ip), t.Helo, t.MailFrom, t.Rcpts, t.Message)), nil
}

func (s *relayServer) Load(ctx context.Context, _ *nodepb.Empty) (*nodepb.WorkerLoad, error) {
	return &nodepb.WorkerLoad{Pending: s.pending.Load(), Done: s.done.Load()}, nil
}

// gracefulWait bounds a worker's clean stop (its node kills it at
// stopWait).
const gracefulWait = 3 * time.Second

// maxTask bounds a task's size on the socket: the largest message and
// its envelope.
const maxTask = 64 << 20

// ServeRelay is `quill worker --class relay`: it serves relay tasks on the
// socket until SIGTERM (finishing the tasks in progress) or its node's
// death (the kernel kills it: Pdeathsig).
func ServeRelay(socket string, remote queue.Remote) error {
	return serveWorker(socket, &relayServer{remote: remote}, RelayClass)
}

// ServeFilter is `quill worker --class filter`: it checks inbound
// messages (SPF, DKIM, DMARC, rspamd) on the socket, as ServeRelay.
func ServeFilter(socket string, checker *mailauth.Checker) error {
	return serveWorker(socket, &relayServer{checker: checker}, FilterClass)
}

func serveWorker(socket string, ws *relayServer, class string) error {
	os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("%s worker: listen on %s: %w", class, socket, err)
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(maxTask))
	nodepb.RegisterWorkerServer(srv, ws)
	sig := make(chan os.Signal, 1)
	signal.Notify(sig, syscall.SIGTERM, syscall.SIGINT)
	go func() {
		<-sig
		// Tasks in progress may finish; a client that keeps its
		// connection open does not hold the worker past gracefulWait.
		t := time.AfterFunc(gracefulWait, srv.Stop)
		srv.GracefulStop()
		t.Stop()
	}()
	return srv.Serve(l)
}

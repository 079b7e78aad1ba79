package sns

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/signal"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/queue"
	"google.golang.org/grpc"
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

// Relay makes a pool of relay workers the outbound queue's way to other
// domains' servers (queue.Remote).
type Relay struct{ Pool *Pool }

// Deliver hands the delivery to a relay worker chosen by lottery. A worker
// that dies or cannot be had fails the task for now: the queue tries it
// again (SNS §3.4.2: tasks are restartable).
func (r Relay) Deliver(ctx context.Context, domain, from string, rcpts []string, body []byte) []queue.Result {
	fail := func(err error) []queue.Result {
		out := make([]queue.Result, len(rcpts))
		for i, rc := range rcpts {
			out[i] = queue.Result{Rcpt: rc, Status: "4.4.0", Text: "relay worker: " + err.Error()}
		}
		return out
	}
	cctx, cancel := context.WithTimeout(ctx, chooseTimeout)
	w, err := r.Pool.choose(cctx)
	cancel()
	if err != nil {
		return fail(err)
	}
	r.Pool.mu.Lock()
	c := w.client
	r.Pool.mu.Unlock()
	if c == nil {
		return fail(fmt.Errorf("worker %d ended before the task reached it", w.id))
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
	out := make([]queue.Result, 0, len(rep.Results))
	for _, x := range rep.Results {
		out = append(out, queue.Result{Rcpt: x.Rcpt, Delivered: x.Delivered, Permanent: x.Permanent, Code: int(x.Code),
			Status: x.Status, Text: x.Text, Remote: x.Remote})
	}
	if len(out) != len(rcpts) {
		return fail(fmt.Errorf("worker %d answered for %d of %d recipients", w.id, len(out), len(rcpts)))
	}
	return out
}

// worker side

type relayServer struct {
	nodepb.UnimplementedWorkerServer
	remote  queue.Remote
	pending atomic.Int32
	done    atomic.Int64
}

func (s *relayServer) Relay(ctx context.Context, t *nodepb.RelayTask) (*nodepb.RelayResults, error) {
	s.pending.Add(1)
	defer s.pending.Add(-1)
	defer s.done.Add(1)
	res := s.remote.Deliver(ctx, t.Domain, t.From, t.Rcpts, t.Body)
	out := &nodepb.RelayResults{}
	for _, r := range res {
		out.Results = append(out.Results, &nodepb.RelayResult{Rcpt: r.Rcpt, Delivered: r.Delivered, Permanent: r.Permanent,
			Code: int32(r.Code), Status: r.Status, Text: r.Text, Remote: r.Remote})
	}
	return out, nil
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
	os.Remove(socket)
	l, err := net.Listen("unix", socket)
	if err != nil {
		return fmt.Errorf("relay worker: listen on %s: %w", socket, err)
	}
	srv := grpc.NewServer(grpc.MaxRecvMsgSize(maxTask))
	nodepb.RegisterWorkerServer(srv, &relayServer{remote: remote})
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

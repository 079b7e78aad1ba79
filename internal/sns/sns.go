// Package sns is the worker substrate of SNS (Chawathe and Brewer, §2–3):
// work that can fail or stall on its own — the delivery of outbound mail
// to other domains' servers (class "relay") and the checks of inbound
// mail (class "filter") — runs in
// separate worker processes (`quill worker --class NAME`) that the node
// launches, balances and restarts by itself.
//
// What is built of the paper:
//   - the SNS manager (§3.1–3.3, manager.go): one node, elected by
//     beacons on the cluster's gossip, holds the launch table of the
//     nodes' load reports, orders launches where the cluster needs
//     workers (dedicated nodes first, the overflow pool of --overflow
//     nodes last) and reaps overflow workers first;
//   - on-demand launch (§3.2): a class's first task on a node starts its
//     first worker; without a manager, auto-launch (§3.3.3) starts another
//     when every worker's load has passed a threshold, then holds off
//     further launches for a while so the load can settle; idle workers
//     are reaped;
//   - load balancing by lottery scheduling (§3.3.2) over every worker of
//     the class in the cluster: each holds tickets inversely proportional
//     to its load (its pending tasks, as its last report said) plus a
//     correction for the tasks dispatched to it since that report, which
//     the next report resets; another node's workers are reached through
//     its RPC (relay.go);
//   - starfish fault tolerance (§3.4.2): the node supervises its workers
//     and restarts a dead one after a short randomized delay; a dead
//     manager is replaced by the next node to stand; a task in flight on
//     a worker that died fails with a temporary error and the queue tries
//     it again (tasks are restartable);
//   - randomized timers (§3.5) for reports, beacons, elections and
//     restarts.
//
// Two classes: relay (outbound delivery, relay.go) and filter (the
// inbound checks of internal/mailauth, filter.go).
//
// Written by hand: the supervisor, the manager election and the lottery
// are the paper's mechanisms and a few hundred lines over os/exec, gRPC
// and the gossip layer's broadcasts; no library implements them (a Raft
// library would elect a leader, but SNS's manager is soft state that any
// node may rebuild, and the paper's beacons are what it describes).
package sns

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"sync"
	"syscall"
	"time"

	"github.com/quillmail/quill/internal/nodepb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Timings of the pool. Each is deliberate:
const (
	// reportInterval is how often each worker's load is asked for
	// (±20%): often next to the seconds a delivery takes, rarely next to
	// the microseconds a report costs.
	reportInterval = 500 * time.Millisecond
	// launchTimeout bounds a new worker's start until it answers.
	launchTimeout = 10 * time.Second
	// restartDelay is the wait before a dead worker is started again
	// (±50%): soon (the issue asks for a restart within 2 s), but not in
	// a tight loop if it dies at once every time.
	restartDelay = 400 * time.Millisecond
	// maxRestartDelay caps the doubling of restartDelay for a worker
	// that keeps dying within crashWindow of its start.
	maxRestartDelay = 30 * time.Second
	crashWindow     = 10 * time.Second
	// holdOff disables auto-launch for a class after a launch (§3.3.3).
	holdOff = 5 * time.Second
	// idleReap is how long a worker may have nothing to do before it is
	// stopped (the class keeps one worker).
	idleReap = 5 * time.Minute
	// stopWait bounds a worker's clean exit before it is killed.
	stopWait = 5 * time.Second
)

// Config describes one class of workers on this node.
type Config struct {
	Class string
	// Max bounds the class's workers on this node.
	Max int
	// Threshold is the load (pending tasks) every worker must have
	// passed for auto-launch to start another.
	Threshold int
	// Command returns the command that starts a worker listening on the
	// socket.
	Command func(socket string) *exec.Cmd
	// Dir holds the workers' sockets.
	Dir string
	Log *slog.Logger
	// NoCorrection leaves out the correction of §3.3.2 (the experiment of
	// docs/benchmarks.md compares with and without it).
	NoCorrection bool
	// ReportInterval overrides reportInterval (the experiment slows the
	// reports down to make their staleness visible).
	ReportInterval time.Duration
	// Managed leaves launches past the first worker to the SNS manager
	// (manager.go): the node does not auto-launch on its own.
	Managed bool
}

// worker is one worker process and the soft state about it.
type worker struct {
	id      int
	socket  string
	cmd     *exec.Cmd
	conn    *grpc.ClientConn
	client  nodepb.WorkerClient
	started time.Time
	// alive: the process runs and answered; ready closes when it first
	// answers (or the launch fails).
	alive bool
	ready chan struct{}
	// load is the last report's pending tasks; correction the tasks
	// dispatched since (§3.3.2).
	load       int
	correction int
	lastBusy   time.Time
	restarts   int
	stopping   bool
	// launchErr is why the last start failed before the worker answered
	// (nil once it answers): tasks do not wait on a worker that cannot
	// start, they fail at once and their caller falls back or retries.
	launchErr error
}

// Pool is one class's workers on this node: it launches, balances,
// supervises and reaps them.
type Pool struct {
	cfg Config

	mu         sync.Mutex
	workers    []*worker
	nextID     int
	lastLaunch time.Time
	launches   int
	restarts   int
	remote     int // tasks handed to other nodes' workers (relay.go)
	closed     bool

	stop chan struct{}
	wg   sync.WaitGroup
}

// NewPool returns an empty pool; workers start with the first task.
func NewPool(cfg Config) *Pool {
	if cfg.Max <= 0 {
		cfg.Max = 1
	}
	if cfg.Threshold <= 0 {
		cfg.Threshold = 4
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	p := &Pool{cfg: cfg, stop: make(chan struct{})}
	p.wg.Add(1)
	go p.reportLoop()
	return p
}

// jitter spreads d by ±share (SNS §3.5: no timers in step).
func jitter(d time.Duration, share float64) time.Duration {
	return time.Duration(float64(d) * (1 - share + 2*share*rand.Float64()))
}

// ErrClosed: the pool is shutting down.
var ErrClosed = errors.New("worker pool closed")

// launchLocked starts a new worker; p.mu is held.
func (p *Pool) launchLocked(why string) *worker {
	p.nextID++
	w := &worker{id: p.nextID, socket: filepath.Join(p.cfg.Dir, fmt.Sprintf("%s-%d.sock", p.cfg.Class, p.nextID)),
		ready: make(chan struct{}), lastBusy: time.Now()}
	p.workers = append(p.workers, w)
	p.lastLaunch = time.Now()
	p.launches++
	p.wg.Add(1)
	go p.supervise(w, why)
	return w
}

// supervise runs a worker's process for as long as the pool wants it:
// start, wait for it to answer, wait for it to exit, and start it again
// (starfish restart) unless it was stopped on purpose.
func (p *Pool) supervise(w *worker, why string) {
	defer p.wg.Done()
	delay := restartDelay
	for {
		started := time.Now()
		err := p.runOnce(w, why)
		p.mu.Lock()
		w.alive = false
		if w.conn != nil {
			w.conn.Close()
			w.conn, w.client = nil, nil
		}
		stopping := w.stopping || p.closed
		// Tasks waiting for this worker wait for its next start.
		w.ready = make(chan struct{})
		p.mu.Unlock()
		if stopping {
			p.remove(w)
			return
		}
		if time.Since(started) < crashWindow {
			delay = min(delay*2, maxRestartDelay)
		} else {
			delay = restartDelay
		}
		d := jitter(delay/2, 0.5)
		p.cfg.Log.Warn("sns: worker ended; restarting it", "class", p.cfg.Class, "worker", w.id, "err", err, "in", d.Round(time.Millisecond))
		select {
		case <-p.stop:
			p.remove(w)
			return
		case <-time.After(d):
		}
		p.mu.Lock()
		w.restarts++
		p.restarts++
		p.mu.Unlock()
		why = "restart"
	}
}

// runOnce starts the worker's process, connects to it, and returns when
// the process exits.
func (p *Pool) runOnce(w *worker, why string) error {
	os.Remove(w.socket)
	cmd := p.cfg.Command(w.socket)
	// The worker dies with the node, whatever kills the node.
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	p.mu.Lock()
	ready := w.ready
	p.mu.Unlock()
	if err := cmd.Start(); err != nil {
		err = fmt.Errorf("start %s worker: %w", p.cfg.Class, err)
		p.failedLaunch(w, err)
		close(ready)
		return err
	}
	p.mu.Lock()
	w.cmd, w.started = cmd, time.Now()
	stopping := w.stopping || p.closed
	p.mu.Unlock()
	if stopping {
		// Stopped while it was being started: Close did not see it.
		terminate(cmd)
	}
	p.cfg.Log.Info("sns: worker started", "class", p.cfg.Class, "worker", w.id, "pid", cmd.Process.Pid, "why", why)
	exited := make(chan error, 1)
	go func() { exited <- cmd.Wait() }()
	if err := p.connect(w, exited); err != nil {
		p.failedLaunch(w, err)
		close(ready)
		cmd.Process.Kill()
		<-exited
		return err
	}
	close(ready)
	return <-exited
}

func (p *Pool) failedLaunch(w *worker, err error) {
	p.mu.Lock()
	w.launchErr = err
	p.mu.Unlock()
}

// connect dials the worker's socket until it answers a load report.
func (p *Pool) connect(w *worker, exited chan error) error {
	deadline := time.Now().Add(launchTimeout)
	for time.Now().Before(deadline) {
		select {
		case err := <-exited:
			exited <- err
			return fmt.Errorf("%s worker exited before it answered: %v", p.cfg.Class, err)
		case <-time.After(20 * time.Millisecond):
		}
		if _, err := os.Stat(w.socket); err != nil {
			continue
		}
		conn, err := grpc.NewClient("unix://"+w.socket, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return err
		}
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		_, err = nodepb.NewWorkerClient(conn).Load(ctx, &nodepb.Empty{})
		cancel()
		if err != nil {
			conn.Close()
			continue
		}
		p.mu.Lock()
		w.conn, w.client, w.alive, w.load, w.correction = conn, nodepb.NewWorkerClient(conn), true, 0, 0
		w.launchErr = nil
		p.mu.Unlock()
		return nil
	}
	return fmt.Errorf("%s worker did not answer within %v", p.cfg.Class, launchTimeout)
}

func (p *Pool) remove(w *worker) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for i, x := range p.workers {
		if x == w {
			p.workers = append(p.workers[:i], p.workers[i+1:]...)
			break
		}
	}
	os.Remove(w.socket)
}

// reportLoop asks every live worker for its load (the paper's workers
// report to the manager; here the node that launched them asks), resets
// their corrections, and reaps idle ones.
func (p *Pool) reportLoop() {
	defer p.wg.Done()
	for {
		select {
		case <-p.stop:
			return
		case <-time.After(jitter(p.reportEvery(), 0.2)):
		}
		p.mu.Lock()
		var ws []*worker
		for _, w := range p.workers {
			if w.alive {
				ws = append(ws, w)
			}
		}
		p.mu.Unlock()
		for _, w := range ws {
			p.mu.Lock()
			c := w.client
			p.mu.Unlock()
			if c == nil {
				continue
			}
			ctx, cancel := context.WithTimeout(context.Background(), p.reportEvery())
			rep, err := c.Load(ctx, &nodepb.Empty{})
			cancel()
			if err != nil {
				continue
			}
			p.mu.Lock()
			w.load, w.correction = int(rep.Pending), 0
			if rep.Pending > 0 {
				w.lastBusy = time.Now()
			}
			p.mu.Unlock()
		}
		p.reap()
	}
}

func (p *Pool) reportEvery() time.Duration {
	if p.cfg.ReportInterval > 0 {
		return p.cfg.ReportInterval
	}
	return reportInterval
}

// reap stops workers idle for idleReap, keeping one.
func (p *Pool) reap() {
	p.mu.Lock()
	defer p.mu.Unlock()
	live := p.keptLocked()
	for _, w := range p.workers {
		if live <= 1 {
			return
		}
		if !w.stopping && w.alive && w.load == 0 && w.correction == 0 && time.Since(w.lastBusy) > idleReap {
			w.stopping = true
			live--
			p.cfg.Log.Info("sns: reaping an idle worker", "class", p.cfg.Class, "worker", w.id)
			go terminate(w.cmd)
		}
	}
}

// keptLocked counts the workers not being stopped; p.mu is held.
func (p *Pool) keptLocked() int {
	n := 0
	for _, w := range p.workers {
		if !w.stopping {
			n++
		}
	}
	return n
}

// terminate asks a worker to stop (SIGTERM: it finishes its tasks) and
// kills it if it has not within stopWait; its supervisor sees the exit.
func terminate(cmd *exec.Cmd) {
	if cmd == nil || cmd.Process == nil {
		return
	}
	cmd.Process.Signal(syscall.SIGTERM)
	time.AfterFunc(stopWait, func() { cmd.Process.Kill() })
}

// choose picks the worker for a task: launching the first on demand and
// another when all are past the threshold (auto-launch), then by lottery
// among the live ones; it counts the task in the chosen one's
// correction.
func (p *Pool) choose(ctx context.Context) (*worker, error) {
	for {
		p.mu.Lock()
		if p.closed {
			p.mu.Unlock()
			return nil, ErrClosed
		}
		var live []*worker
		var waitOn chan struct{}
		var launchErr error
		for _, w := range p.workers {
			switch {
			case w.stopping:
			case w.alive:
				live = append(live, w)
			case w.launchErr != nil:
				launchErr = w.launchErr // being restarted after a failed start
			default:
				waitOn = w.ready
			}
		}
		loads := make([]int, len(live))
		busy := len(live) > 0
		for i, w := range live {
			loads[i] = w.load
			if !p.cfg.NoCorrection {
				loads[i] += w.correction
			}
			busy = busy && loads[i] >= p.cfg.Threshold
		}
		starting := len(p.workers) - len(live)
		auto := busy && starting == 0 && len(p.workers) < p.cfg.Max && time.Since(p.lastLaunch) > holdOff && !p.cfg.Managed
		if len(p.workers) == 0 || auto {
			why := "on demand"
			if len(p.workers) > 0 {
				why = fmt.Sprintf("auto launch: every worker has %d or more tasks", p.cfg.Threshold)
			}
			w := p.launchLocked(why)
			waitOn = w.ready
		}
		if len(live) > 0 {
			w := live[Pick(loads, rand.Float64())]
			w.correction++
			p.mu.Unlock()
			return w, nil
		}
		p.mu.Unlock()
		if waitOn == nil && launchErr != nil {
			return nil, fmt.Errorf("no %s worker: %w", p.cfg.Class, launchErr)
		}
		if waitOn == nil {
			return nil, fmt.Errorf("no %s worker", p.cfg.Class)
		}
		select {
		case <-waitOn:
		case <-ctx.Done():
			return nil, fmt.Errorf("waiting for a %s worker: %w", p.cfg.Class, ctx.Err())
		}
	}
}

// Launch starts another worker if the pool has room for one (an order of
// the SNS manager); it reports whether it did.
func (p *Pool) Launch(why string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.closed || p.keptLocked() >= p.cfg.Max {
		return false
	}
	p.launchLocked(why)
	return true
}

// ReapOne stops the least loaded worker, even the last (an order of the
// SNS manager to an overflow node); it reports whether there was one.
func (p *Pool) ReapOne(why string) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	var pick *worker
	for _, w := range p.workers {
		if !w.stopping && (pick == nil || w.load+w.correction < pick.load+pick.correction) {
			pick = w
		}
	}
	if pick == nil || p.closed {
		return false
	}
	pick.stopping = true
	p.cfg.Log.Info("sns: reaping a worker", "class", p.cfg.Class, "worker", pick.id, "why", why)
	go terminate(pick.cmd)
	return true
}

// Report is the pool's load for the SNS manager: its workers (those
// starting count: a launch is under way), its maximum, and the tasks its
// live workers hold.
func (p *Pool) Report() Report {
	p.mu.Lock()
	defer p.mu.Unlock()
	r := Report{Class: p.cfg.Class, Max: p.cfg.Max}
	for _, w := range p.workers {
		if w.stopping {
			continue
		}
		r.Workers++
		r.Pending += w.load + w.correction
	}
	return r
}

// Live reports whether the pool has a worker that answers.
func (p *Pool) Live() bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, w := range p.workers {
		if w.alive && !w.stopping {
			return true
		}
	}
	return false
}

// Status is what the admin API shows of a pool.
type Status struct {
	Class    string `json:"class"`
	Max      int    `json:"max"`
	Launches int    `json:"launches"`
	Restarts int    `json:"restarts"`
	// Remote counts the tasks of this node handed to other nodes'
	// workers.
	Remote  int            `json:"sent_to_other_nodes"`
	Workers []WorkerStatus `json:"workers"`
}

// WorkerStatus is one worker as the admin API shows it.
type WorkerStatus struct {
	ID       int       `json:"id"`
	PID      int       `json:"pid"`
	Alive    bool      `json:"alive"`
	Load     int       `json:"load"`
	Started  time.Time `json:"started"`
	Restarts int       `json:"restarts"`
}

// Status returns the pool's workers.
func (p *Pool) Status() Status {
	p.mu.Lock()
	defer p.mu.Unlock()
	st := Status{Class: p.cfg.Class, Max: p.cfg.Max, Launches: p.launches, Restarts: p.restarts, Remote: p.remote}
	for _, w := range p.workers {
		ws := WorkerStatus{ID: w.id, Alive: w.alive, Load: w.load + w.correction, Started: w.started, Restarts: w.restarts}
		if w.cmd != nil && w.cmd.Process != nil {
			ws.PID = w.cmd.Process.Pid
		}
		st.Workers = append(st.Workers, ws)
	}
	return st
}

// Close stops every worker and waits for them.
func (p *Pool) Close() {
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		return
	}
	p.closed = true
	ws := append([]*worker(nil), p.workers...)
	p.mu.Unlock()
	close(p.stop)
	for _, w := range ws {
		p.mu.Lock()
		w.stopping = true
		cmd := w.cmd
		if w.conn != nil {
			// The worker's graceful stop waits for its clients to go.
			w.conn.Close()
			w.conn, w.client = nil, nil
		}
		p.mu.Unlock()
		terminate(cmd)
	}
	p.wg.Wait()
}

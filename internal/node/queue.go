package node

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/sns"
	"google.golang.org/grpc"
)

// dnsDialTimeout bounds reaching the --dns server for one lookup.
const dnsDialTimeout = 5 * time.Second

// startQueue starts the outbound queue's runner: local recipients go
// through the node's own delivery, others to their domain's servers.
func (n *Node) startQueue() {
	cfg := n.cfg
	q := n.Queue
	q.Local = n.Proxy
	q.Remote = &queue.Dialer{Resolver: Resolver(cfg.DNS), Port: cfg.OutboundPort, STSPort: cfg.MTASTSPort, Hostname: cfg.Hostname}
	if cfg.RelayWorkers > 0 {
		// Delivery runs in relay worker processes (SNS): launched with
		// the first task, balanced by lottery, restarted when they die.
		exe, err := os.Executable()
		if err == nil {
			dir := filepath.Join(cfg.DataDir, "sns")
			if err = os.MkdirAll(dir, 0o700); err == nil {
				n.relays = sns.NewPool(sns.Config{Class: sns.RelayClass, Max: cfg.RelayWorkers, Dir: dir, Log: cfg.Logger,
					Managed: true,
					Command: func(socket string) *exec.Cmd {
						return exec.Command(exe, "worker", "--class", sns.RelayClass, "--socket", socket, "--hostname", cfg.Hostname,
							"--dns", cfg.DNS, "--outbound-port", strconv.Itoa(cfg.OutboundPort), "--mta-sts-port", strconv.Itoa(cfg.MTASTSPort))
					}})
				n.startSNSManager()
				q.Remote = sns.NewClusterRelay(n.relays, n.snsMgr, func(node string) (grpc.ClientConnInterface, error) {
					return n.Peers.Conn(cluster.NodeID(node))
				})
			}
		}
		if err != nil {
			cfg.Logger.Warn("sns: relay workers not available; the node delivers itself", "err", err)
		}
	}
	q.Cfg.Hostname = cfg.Hostname
	q.Cfg.Lifetime, q.Cfg.WarnAfter, q.Cfg.Retry, q.Cfg.Workers = cfg.QueueLifetime, cfg.QueueWarn, cfg.QueueRetry, cfg.QueueWorkers
	q.Start()
}

// Resolver returns the resolver of --dns: every lookup goes to that
// server (UDP, TCP for truncated answers); empty is the system's.
func Resolver(server string) *net.Resolver {
	if server == "" {
		return net.DefaultResolver
	}
	return &net.Resolver{PreferGo: true, Dial: func(ctx context.Context, network, _ string) (net.Conn, error) {
		d := net.Dialer{Timeout: dnsDialTimeout}
		return d.DialContext(ctx, network, server)
	}}
}

// queueSubmitter puts a submission's recipients in other domains into the
// outbound queue under the user's replicas and write policy.
type queueSubmitter struct{ n *Node }

func (s queueSubmitter) Enqueue(ctx context.Context, user, from string, rcpts []string, raw []byte) error {
	p, _, err := s.n.Users.Lookup(ctx, user)
	if err != nil {
		return err
	}
	policy, _ := replica.ParsePolicy(p.WritePolicy)
	// Signed once, here: every replica holds, and every retry sends, the
	// same signed message.
	signed, err := s.n.dkimSign(raw, from)
	if err != nil {
		return err
	}
	_, err = s.n.Queue.Add(ctx, user, from, rcpts, signed, p.Replicas, policy)
	return err
}

// queueDeferrer puts a received message whose local recipients cannot all
// take it now (a mailbox too full, smtp.Config.Defer) into the queue,
// unsigned: the queue's local delivery gives it to each recipient once they
// have room. Its 250 must be as durable as a delivery to every recipient
// would have been, so the entry gets the most replicas and the strictest
// write policy among the recipients'.
type queueDeferrer struct{ n *Node }

func (d queueDeferrer) Enqueue(ctx context.Context, user, from string, rcpts []string, raw []byte) error {
	cfg := d.n.Queue.Cfg
	want := cfg.Replicas
	policies := make([]replica.Policy, 0, len(rcpts))
	for _, r := range rcpts {
		p, _, err := d.n.Users.Lookup(ctx, r)
		if err != nil {
			return err
		}
		want = max(want, p.Replicas)
		pol, _ := replica.ParsePolicy(p.WritePolicy) // "": the cluster's
		policies = append(policies, pol)
	}
	policy := replica.Strictest(want, cfg.Policy, policies...)
	_, err := d.n.Queue.Add(ctx, user, from, rcpts, raw, want, policy)
	return err
}

// snsTick is how often the node advances its part in the SNS manager: well
// under the beacon interval, so beacons and orders go out on time.
const snsTick = 100 * time.Millisecond

// startSNSManager starts this node's part in the SNS manager election: its
// reports and (while it is manager) beacons go out on the gossip as
// notices, and the orders for this node launch or reap its relay workers.
func (n *Node) startSNSManager() {
	n.relaySvc.SetPool(n.relays)
	n.snsStop = make(chan struct{})
	stop := n.snsStop
	go func() {
		t := time.NewTicker(snsTick)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case now := <-t.C:
				out, acts := n.snsMgr.Tick(now, []sns.Report{n.relays.Report()})
				for _, msg := range out {
					n.broadcast(notice{SNS: &msg}, "sns message", msg.From)
				}
				n.carryOut(acts)
			}
		}
	}()
}

// carryOut applies the SNS manager's orders for this node.
func (n *Node) carryOut(acts []sns.Action) {
	pool := n.relaySvc.Pool()
	for _, a := range acts {
		if a.Class != sns.RelayClass || pool == nil {
			continue
		}
		if a.Reap {
			pool.ReapOne("the SNS manager gives back an overflow worker")
		} else if pool.Launch("the SNS manager launches one: the cluster's workers are past the threshold") {
			n.cfg.Logger.Info("sns: worker launched on the manager's order", "class", a.Class)
		}
	}
}

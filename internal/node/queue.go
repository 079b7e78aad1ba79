package node

import (
	"context"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"time"

	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/sns"
)

// dnsDialTimeout bounds reaching the --dns server for one lookup.
const dnsDialTimeout = 5 * time.Second

// startQueue starts the outbound queue's runner: local recipients go
// through the node's own delivery, others to their domain's servers.
func (n *Node) startQueue() {
	cfg := n.cfg
	q := n.Queue
	q.Local = n.Proxy
	q.Remote = &queue.Dialer{Resolver: Resolver(cfg.DNS), Port: cfg.OutboundPort, Hostname: cfg.Hostname}
	if cfg.RelayWorkers > 0 {
		// Delivery runs in relay worker processes (SNS): launched with
		// the first task, balanced by lottery, restarted when they die.
		exe, err := os.Executable()
		if err == nil {
			dir := filepath.Join(cfg.DataDir, "sns")
			if err = os.MkdirAll(dir, 0o700); err == nil {
				n.relays = sns.NewPool(sns.Config{Class: sns.RelayClass, Max: cfg.RelayWorkers, Dir: dir, Log: cfg.Logger,
					Command: func(socket string) *exec.Cmd {
						return exec.Command(exe, "worker", "--class", sns.RelayClass, "--socket", socket, "--hostname", cfg.Hostname,
							"--dns", cfg.DNS, "--outbound-port", strconv.Itoa(cfg.OutboundPort))
					}})
				q.Remote = sns.Relay{Pool: n.relays}
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

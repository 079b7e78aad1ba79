// Package node is one running Quill node: the managers of internal/core
// (Porcupine Fig. 2) with the protocol servers — SMTP delivery proxy, POP3
// and IMAP retrieval proxies — and the admin API on top. Every node runs the
// same modules; a single node is a cluster of one.
package node

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"time"

	gosmtp "github.com/emersion/go-smtp"
	"github.com/quillmail/quill/internal/admin"
	"github.com/quillmail/quill/internal/core"
	"github.com/quillmail/quill/internal/imap"
	"github.com/quillmail/quill/internal/pop3"
	"github.com/quillmail/quill/internal/proxy"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/smtp"
	"github.com/quillmail/quill/internal/usermgr"
)

// Config is everything an operator can set on a node. Each field is a flag
// of `quill serve` and a key of its config file.
type Config struct {
	DataDir  string // --data: hard state lives here
	SMTPAddr string // --smtp
	POP3Addr string // --pop3
	IMAPAddr string // --imap
	HTTPAddr string // --http: admin API and dashboard
	// ClusterAddr is the gossip address (--cluster); empty runs a cluster
	// of one without gossip. Node-to-node RPC listens on the same host, on
	// a port of its own that is gossiped to the others.
	ClusterAddr string
	// Join lists gossip addresses of other nodes (--join); they are retried
	// for as long as the node runs.
	Join     []string
	Hostname string // --hostname: name in greetings and Received headers
	// MaxMessageBytes is the SMTP SIZE limit (--max-message-size).
	MaxMessageBytes int64
	// AuthFailDelay is how long a wrong password waits before its error,
	// slowing password guessing (--auth-fail-delay).
	AuthFailDelay time.Duration
	// MinFree is the free disk space under which the node takes no new
	// mail (--min-free).
	MinFree int64
	// Replicas and WritePolicy are the cluster defaults for users who set
	// none (--replicas, --write-policy).
	Replicas    int
	WritePolicy string
	// ReplaceAfter is how long a node may be away before its messages get
	// replicas elsewhere (--replace-after); LogMaxAge how long the update
	// log waits for an absent node (--log-max-age).
	ReplaceAfter time.Duration
	LogMaxAge    time.Duration
	// ClockSkew shifts this node's clock (--clock-skew, for tests).
	ClockSkew time.Duration
	// AuditInterval is how often the writers' anti-entropy audit runs
	// (--audit-interval; 0 turns it off).
	AuditInterval time.Duration
	Logger        *slog.Logger
}

// DefaultConfig is a single node on loopback with the ports of the README.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	if host == "" {
		host = "localhost"
	}
	return Config{
		DataDir:         "quill-data",
		SMTPAddr:        "127.0.0.1:2525",
		POP3Addr:        "127.0.0.1:1110",
		IMAPAddr:        "127.0.0.1:1143",
		HTTPAddr:        "127.0.0.1:8025",
		Hostname:        host,
		MaxMessageBytes: 25 << 20,
		AuthFailDelay:   time.Second,
		MinFree:         256 << 20,
		Replicas:        core.DefaultReplicas,
		WritePolicy:     string(replica.One),
		ReplaceAfter:    replica.DefaultReplaceAfter,
		LogMaxAge:       replica.DefaultMaxAge,
		AuditInterval:   usermgr.DefaultAuditInterval,
		Logger:          slog.Default(),
	}
}

// Node is a running node.
type Node struct {
	*core.Core
	cfg     Config
	started time.Time

	smtp  *gosmtp.Server
	pop3  *pop3.Server
	imap  *imap.Server
	http  *http.Server
	addrs map[string]string
	wg    sync.WaitGroup
}

// Start opens the node's storage, starts the managers and the listeners.
// It returns once every listener accepts connections.
func Start(cfg Config) (*Node, error) {
	policy, err := replica.ParsePolicy(cfg.WritePolicy)
	if err != nil {
		return nil, err
	}
	c, err := core.New(core.Options{DataDir: cfg.DataDir, ClusterAddr: cfg.ClusterAddr, Join: cfg.Join, Log: cfg.Logger,
		MinFree: cfg.MinFree, Replicas: cfg.Replicas, WritePolicy: policy, ReplaceAfter: cfg.ReplaceAfter,
		LogMaxAge: cfg.LogMaxAge, ClockSkew: cfg.ClockSkew, AuditInterval: auditInterval(cfg.AuditInterval)})
	if err != nil {
		return nil, err
	}
	n := &Node{Core: c, cfg: cfg, started: time.Now(), addrs: map[string]string{}}
	if cfg.ClusterAddr != "" {
		n.addrs["cluster"] = cfg.ClusterAddr
		n.addrs["rpc"] = c.RPCAddr()
	}
	if err := n.startListeners(); err != nil {
		n.Shutdown(context.Background())
		return nil, err
	}
	return n, nil
}

// auditInterval maps the flag (0: off) to core's option (0: default).
func auditInterval(d time.Duration) time.Duration {
	if d <= 0 {
		return -1
	}
	return d
}

func (n *Node) listen(proto, addr string, serve func(net.Listener) error) error {
	l, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s listener on %s: %w", proto, addr, err)
	}
	n.addrs[proto] = l.Addr().String()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		if err := serve(l); err != nil && !isClosed(err) {
			n.cfg.Logger.Error("listener stopped", "proto", proto, "addr", addr, "err", err)
		}
	}()
	return nil
}

func isClosed(err error) bool {
	return errors.Is(err, net.ErrClosed) || errors.Is(err, http.ErrServerClosed) || errors.Is(err, gosmtp.ErrServerClosed) || errors.Is(err, pop3.ErrServerClosed)
}

func (n *Node) startListeners() error {
	cfg := n.cfg
	sc := smtp.DefaultConfig()
	sc.Hostname = cfg.Hostname
	sc.MaxMessageBytes = cfg.MaxMessageBytes
	sc.Logger = cfg.Logger
	n.smtp = smtp.New(n.Proxy, sc)
	if err := n.listen("smtp", cfg.SMTPAddr, n.smtp.Serve); err != nil {
		return err
	}

	pc := pop3.Config{}
	pc.Hostname = cfg.Hostname
	pc.AuthFailDelay = cfg.AuthFailDelay
	pc.Logger = cfg.Logger
	n.pop3 = pop3.New(proxy.POP3{P: n.Proxy, Log: cfg.Logger}, pc)
	if err := n.listen("pop3", cfg.POP3Addr, n.pop3.Serve); err != nil {
		return err
	}

	n.imap = imap.New(&proxy.IMAPStore{P: n.Proxy}, proxy.IMAPAuth{P: n.Proxy}, imap.Config{AuthFailDelay: cfg.AuthFailDelay,
		MaxMessageBytes: cfg.MaxMessageBytes, Logger: cfg.Logger})
	if err := n.listen("imap", cfg.IMAPAddr, n.imap.Serve); err != nil {
		return err
	}

	token := ""
	if admin.RequireToken(cfg.HTTPAddr) {
		t, err := admin.LoadToken(cfg.DataDir)
		if err != nil {
			return err
		}
		token = t
	}
	as := &admin.Server{Users: n.Users, Token: token, Logger: cfg.Logger, Node: admin.NodeInfo{
		ID: n.ID, Started: n.started, Addrs: n.addrs, Load: n.Boxes.Pending,
		UserMap: n.Members.UserMap, Members: n.Members.Members,
		Replication: func() admin.ReplicationStatus {
			return admin.ReplicationStatus{Node: n.ID, Replicas: n.Opts.Replicas, WritePolicy: string(n.Opts.WritePolicy),
				LogStats: n.Repl.Stats(), RepairStats: n.Repl.RepairStats()}
		},
	}}
	n.http = &http.Server{Handler: as.Handler(), ReadHeaderTimeout: 10 * time.Second}
	return n.listen("http", cfg.HTTPAddr, n.http.Serve)
}

// Addr returns the bound address of a listener ("smtp", "pop3", "imap",
// "http").
func (n *Node) Addr(proto string) string { return n.addrs[proto] }

// Shutdown stops accepting, lets sessions finish until ctx is done, closes
// the rest and then the store.
func (n *Node) Shutdown(ctx context.Context) error {
	var wg sync.WaitGroup
	stop := func(f func(context.Context) error) {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	if n.smtp != nil {
		stop(func(ctx context.Context) error {
			err := n.smtp.Shutdown(ctx)
			if err != nil {
				n.smtp.Close()
			}
			return err
		})
	}
	if n.pop3 != nil {
		stop(n.pop3.Shutdown)
	}
	if n.imap != nil {
		stop(n.imap.Shutdown)
	}
	if n.http != nil {
		stop(n.http.Shutdown)
	}
	wg.Wait()
	n.wg.Wait()
	return n.Core.Close()
}

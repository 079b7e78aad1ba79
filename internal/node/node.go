// Package node is one running Quill node: the managers of internal/core
// (Porcupine Fig. 2) with the protocol servers — SMTP delivery proxy, POP3
// and IMAP retrieval proxies — and the admin API on top. Every node runs the
// same modules; a single node is a cluster of one.
package node

import (
	"context"
	"errors"
	"fmt"
	"github.com/quillmail/quill/internal/domain"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync"
	"syscall"
	"time"

	gosmtp "github.com/emersion/go-smtp"
	"github.com/quillmail/quill/internal/acmecert"
	"github.com/quillmail/quill/internal/admin"
	"github.com/quillmail/quill/internal/backup"
	"github.com/quillmail/quill/internal/balance"
	"github.com/quillmail/quill/internal/cassandra"
	"github.com/quillmail/quill/internal/core"
	"github.com/quillmail/quill/internal/guard"
	"github.com/quillmail/quill/internal/hangup"
	"github.com/quillmail/quill/internal/imap"
	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/pop3"
	"github.com/quillmail/quill/internal/proxy"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/rebalance"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/saslsrv"
	"github.com/quillmail/quill/internal/smtp"
	"github.com/quillmail/quill/internal/sns"
	"github.com/quillmail/quill/internal/telemetry"
	"github.com/quillmail/quill/internal/tlscert"
	"github.com/quillmail/quill/internal/writer"
	"google.golang.org/grpc"
)

// Config is everything an operator can set on a node. Each tagged field is
// a flag of `quill serve`, a QUILL_* environment variable and a key of the
// TOML config file (internal/config); DefaultConfig holds the defaults, and
// docs/configuration.md is generated from both.
type Config struct {
	DataDir  string `flag:"data" help:"data directory: the node's hard state"`
	SMTPAddr string `flag:"smtp" help:"SMTP listen address (mail from other servers)"`
	POP3Addr string `flag:"pop3" help:"POP3 listen address"`
	IMAPAddr string `flag:"imap" help:"IMAP listen address"`
	HTTPAddr string `flag:"http" help:"admin API, dashboard and /metrics listen address (every call but /healthz needs the token in DATA/admin.token)"`
	// Pprof serves Go's profiler on the admin listener.
	Pprof bool `flag:"pprof" help:"serve Go's profiler under /debug/pprof/ on the admin listener (behind the token)"`
	// Implicit TLS listeners (RFC 8314 §3.3); empty turns one off.
	SMTPSAddr string `flag:"smtps" help:"SMTP with implicit TLS (RFC 8314, submissions) listen address; empty: none"`
	// SubmissionAddr is message submission (RFC 6409): STARTTLS, AUTH
	// required, the sender must be the user's own.
	SubmissionAddr string `flag:"submission" help:"message submission (RFC 6409, port 587) listen address: STARTTLS, AUTH required; empty: none"`
	IMAPSAddr      string `flag:"imaps" help:"IMAP with implicit TLS (IMAPS) listen address; empty: none"`
	POP3SAddr      string `flag:"pop3s" help:"POP3 with implicit TLS (POP3S) listen address; empty: none"`
	// TLSCert and TLSKey are PEM files, in pairs; without them the node
	// serves a self-signed certificate it keeps in DATA/tls.
	TLSCert []string `flag:"tls-cert" help:"certificate chain PEM file (several, comma-separated, for several domains: chosen by SNI); re-read when it changes or on SIGHUP" doc:"none: a self-signed certificate made in DATA/tls"`
	TLSKey  []string `flag:"tls-key" help:"private key PEM file of each --tls-cert, in the same order"`
	// ACME (internal/acmecert): with an e-mail address, the cluster gets
	// and renews a certificate for ACMEDomains from ACMEDirectory.
	ACMEEmail     string   `flag:"acme-email" help:"get the cluster's certificate from an ACME CA (Let's Encrypt by default) with this contact address; empty: no ACME"`
	ACMEDirectory string   `flag:"acme-directory" help:"directory URL of the ACME CA"`
	ACMEDomains   []string `flag:"acme-domains" help:"host names the ACME certificate covers (comma-separated)" doc:"--hostname"`
	ACMEHTTP      string   `flag:"acme-http" help:"listen address answering the CA's HTTP-01 challenges (port 80 as the CA sees it), with --acme-email"`
	ACMECA        string   `flag:"acme-ca" help:"PEM file of the root certificates to trust for the ACME CA's HTTPS (a test CA); empty: the system's"`
	// Limits of the guard (internal/guard): connections in all and per
	// client address, new connections per address, failed logins.
	MaxConns         int           `flag:"max-conns" help:"client connections of all listeners together; 0: 10,000, or fewer to stay below the open-file limit" doc:"0"`
	MaxConnsPerIP    int           `flag:"max-conns-per-ip" help:"client connections from one address"`
	ConnRatePerIP    int           `flag:"conn-rate-per-ip" help:"new connections per minute from one address (0: no limit, as Postfix)"`
	AuthLockoutAfter int           `flag:"auth-lockout-after" help:"failed logins from one address (within 15 minutes) after which it may not log in for --auth-lockout-for"`
	AuthLockoutFor   time.Duration `flag:"auth-lockout-for" help:"how long an address that failed too often may not log in"`
	// AllowPlaintextAuth lets clients anywhere send passwords without TLS;
	// loopback clients always may.
	AllowPlaintextAuth bool `flag:"allow-plaintext-auth" help:"accept passwords without TLS from any address (test rigs only; loopback always may)"`
	// ClusterAddr is the gossip address; empty runs a cluster of one
	// without gossip. Node-to-node RPC listens on the same host, on a port
	// of its own that is gossiped to the others.
	ClusterAddr string `flag:"cluster" help:"gossip address of this node (host:port); empty runs a cluster of one"`
	// Join lists gossip addresses of other nodes; they are retried for as
	// long as the node runs.
	Join     []string `flag:"join" help:"gossip addresses of other nodes to join (host:port,...), retried until they answer"`
	Hostname string   `flag:"hostname" help:"host name used in greetings and Received headers" doc:"the machine's host name"`
	// LogFormat, LogFile and LogLevel shape the node's log (quill serve
	// builds Logger from them).
	LogFormat string `flag:"log-format" help:"log format: text (key=value) or json"`
	LogFile   string `flag:"log-file" help:"write the log to FILE (reopened on SIGHUP, for logrotate) instead of standard error"`
	LogLevel  string `flag:"log-level" help:"least level logged: debug, info, warn or error"`
	// SubaddressSeparator splits user+tag@ (RFC 5233): mail for it goes
	// to user@ when no user or alias has the whole address.
	SubaddressSeparator string `flag:"subaddress-separator" help:"separator of sub-addresses (user+tag@ reaches user@); empty: none"`
	// MaxMessageBytes is the SMTP SIZE limit.
	MaxMessageBytes int64 `flag:"max-message-size" help:"largest message accepted, in bytes"`
	// AuthFailDelay is how long a wrong password waits before its error,
	// slowing password guessing; it doubles with each further failure of
	// the address or account, up to 16 s.
	AuthFailDelay time.Duration `flag:"auth-fail-delay" help:"delay before answering a first failed login; each further failure of the address or account doubles it, up to --auth-max-delay"`
	AuthMaxDelay  time.Duration `flag:"auth-max-delay" help:"longest delay before answering a failed login"`
	// MinFree is the free disk space under which the node takes no new
	// mail; under half of it, not even replica copies.
	MinFree int64 `flag:"min-free" help:"free disk bytes under which the node takes no new mail (under half of it, not even replica copies)"`
	// Replicas and WritePolicy are the cluster defaults for users who set
	// none.
	Replicas    int    `flag:"replicas" help:"copies of each message, for users who set none"`
	WritePolicy string `flag:"write-policy" help:"replicas that must hold a message before SMTP says 250, for users who set none: one, quorum or all"`
	// Spread is over how many nodes a user's mail may spread, for users
	// who set none (Porcupine §5: a new message goes to the least loaded
	// of the nodes already holding the user's mail plus random others up
	// to the spread; at least the replica count).
	Spread int `flag:"spread" help:"nodes a user's mail may spread over, for users who set none (native store; at least --replicas)"`
	// Island is the Archipelago island the node belongs to (internal/
	// island): a user's state stays on the nodes of the island owning the
	// user's bucket, so losing an island touches only its users.
	Island string `flag:"island" help:"island this node belongs to (a-z, 0-9, '.', '-', '_'); a user's mail, profile, queue entries and writer stay within one island; every node in one island is the cluster without islands"`
	// Placement and DiskDelay are for experiments only (Porcupine §6.3,
	// docs/benchmarks.md): they make a node place mail as a statically
	// partitioned or load-blind server would, or write to a slow disk.
	Placement string        `flag:"placement" help:"EXPERIMENTAL, for benchmarks: how new mail is placed: dynamic (Porcupine's load-aware choice within the spread; the only setting for real use), random (the same candidates, blind to load) or static (fixed nodes: the first of the rank order of the user's bucket)"`
	DiskDelay time.Duration `flag:"disk-delay" help:"EXPERIMENTAL, for benchmarks: delay every sync of the store's write-ahead log, so every durable write, by this much (a slow disk; native store; 0: none)"`
	// Store says where the hard state of mail and users lives: the native
	// Porcupine store, or Apache Cassandra (issue 15, docs/cassandra.md).
	Store          string   `flag:"store" help:"where mail and profiles live: native (the nodes' data directories, replicated among them) or cassandra (the keyspace --keyspace of --cassandra)"`
	Cassandra      []string `flag:"cassandra" help:"with --store cassandra: some of the Cassandra cluster's nodes (host[:port],...; port 9042)"`
	Keyspace       string   `flag:"keyspace" help:"with --store cassandra: the keyspace of Quill's tables, made (and migrated) by Quill if missing"`
	CassandraRF    string   `flag:"cassandra-rf" help:"with --store cassandra: the keyspace's replication when Quill makes it: a factor (3: SimpleStrategy) or data centres with factors (dc1:3,dc2:2)"`
	CassandraRead  string   `flag:"cassandra-read" help:"with --store cassandra: consistency level of reads: ONE, QUORUM, ALL or LOCAL_QUORUM"`
	CassandraWrite string   `flag:"cassandra-write" help:"with --store cassandra: consistency level of writes: ONE, QUORUM, ALL or LOCAL_QUORUM"`
	// ReplaceAfter is how long a node may be away before its messages get
	// replicas elsewhere; LogMaxAge how long the update log waits for an
	// absent node.
	ReplaceAfter time.Duration `flag:"replace-after" help:"how long a node may be away before its messages get replicas on other nodes"`
	// RebalanceRate paces the moving of existing mail to under-full nodes
	// (internal/rebalance).
	RebalanceRate int           `flag:"rebalance-rate" help:"messages per second this node moves to under-full nodes (a node that joined or came back empty) while some node's bytes are more than 20% from the mean (native store; 0: never)"`
	LogMaxAge     time.Duration `flag:"log-max-age" help:"how long update log entries wait for an absent node; a node away longer rejoins as a new node"`
	// AuditInterval is how often the writers' anti-entropy audit runs (0
	// turns it off).
	AuditInterval time.Duration `flag:"audit-interval" help:"how often each bucket manager audits its mailbox views and mail map against the fragments (0: never)"`
	// TextIndexDelay is how long a stored message waits for the text
	// index (mailbox.DefaultTextIndexDelay).
	TextIndexDelay time.Duration `flag:"text-index-delay" help:"how long a delivered message waits before the search index reads it: mail deleted sooner (POP3) is never indexed, and a SEARCH first indexes its user's waiting mail (0: at once)"`
	// MemoryLimit is the Go runtime's soft memory limit, which `quill
	// serve` sets (process-wide, so not in Start: tests run several nodes
	// in one process).
	MemoryLimit int64 `flag:"memory-limit" help:"soft limit in bytes on the memory the Go runtime holds (heap, stacks; not Pebble's memtables and block cache): garbage is collected sooner as it nears, trading CPU for resident memory; 0: none (GOMEMLIMIT in the environment still applies)"`
	// CheckInbound checks SPF, DKIM and DMARC of mail from other servers
	// (internal/mailauth).
	CheckInbound bool `flag:"check-inbound" help:"check SPF, DKIM and DMARC of mail from other servers, record the results in Authentication-Results, and refuse what the sender domain's DMARC policy says to reject"`
	// Limits on what a user submits.
	SubmitRecipients int `flag:"submit-max-recipients" help:"recipients of one message a user submits"`
	SubmitPerHour    int `flag:"submit-max-per-hour" help:"messages one user may submit per hour, counted across the cluster (0: no limit)"`
	// The outbound queue (internal/queue) and its delivery to other
	// domains.
	DNS           string        `flag:"dns" help:"DNS server (host:port) for outbound mail's MX and address lookups; empty: the system's resolver"`
	OutboundPort  int           `flag:"outbound-port" help:"port other domains' mail servers listen on (25; another only for test rigs)"`
	MTASTSPort    int           `flag:"mta-sts-port" help:"port other domains' MTA-STS policy servers listen on (443; another only for test rigs)"`
	QueueLifetime time.Duration `flag:"queue-lifetime" help:"how long a message may wait in the outbound queue before the sender gets a failure report"`
	QueueWarn     time.Duration `flag:"queue-warn" help:"how long a message waits in the outbound queue before the sender is warned of the delay (0: never)"`
	QueueRetry    time.Duration `flag:"queue-retry" help:"wait after a first failed delivery attempt; doubled after each further one, up to 12 times"`
	QueueWorkers  int           `flag:"queue-workers" help:"outbound deliveries a node makes at once"`
	// FilterWorkers bounds the SNS filter worker processes.
	FilterWorkers int `flag:"filter-workers" help:"filter worker processes (SNS) a node may run for the inbound checks (SPF, DKIM, DMARC, rspamd), launched on demand and restarted when they die; 0: the node checks itself"`
	// Rspamd is the base URL of an rspamd normal worker.
	Rspamd string `flag:"rspamd" help:"base URL of an rspamd worker (http://127.0.0.1:11333) that scores inbound mail for spam: reject refuses, soft reject defers, add header sends to Junk; empty: no spam scoring"`
	// Overflow makes the node part of the SNS overflow pool.
	Overflow bool `flag:"overflow" help:"SNS overflow node: it runs relay workers only when the dedicated nodes have their maximum, and gives them back first"`
	// RelayWorkers bounds the SNS relay worker processes (internal/sns).
	RelayWorkers int `flag:"relay-workers" help:"relay worker processes (SNS) a node may run for outbound delivery, launched on demand and restarted when they die; 0: the node delivers itself"`
	// ClockSkew shifts this node's clock (tests).
	ClockSkew time.Duration `flag:"clock-skew" help:"shift this node's clock (for testing clock skew)"`
	Logger    *slog.Logger
}

// DefaultConfig is a single node on loopback with the ports of the README.
func DefaultConfig() Config {
	host, _ := os.Hostname()
	if host == "" {
		host = "localhost"
	}
	return Config{
		DataDir:             "quill-data",
		SMTPAddr:            "127.0.0.1:2525",
		POP3Addr:            "127.0.0.1:1110",
		IMAPAddr:            "127.0.0.1:1143",
		HTTPAddr:            "127.0.0.1:8025",
		SMTPSAddr:           "127.0.0.1:1465",
		SubmissionAddr:      "127.0.0.1:1587",
		IMAPSAddr:           "127.0.0.1:1993",
		POP3SAddr:           "127.0.0.1:1995",
		Hostname:            host,
		SubaddressSeparator: domain.DefaultSeparator,
		LogFormat:           "text",
		LogLevel:            "info",
		MaxMessageBytes:     25 << 20,
		AuthFailDelay:       time.Second,
		AuthMaxDelay:        16 * time.Second,
		MaxConnsPerIP:       150,
		AuthLockoutAfter:    20,
		AuthLockoutFor:      15 * time.Minute,
		MinFree:             256 << 20,
		Replicas:            core.DefaultReplicas,
		WritePolicy:         string(replica.One),
		Spread:              balance.DefaultSpread,
		Island:              island.Default,
		Placement:           string(balance.Dynamic),
		Store:               "native",
		Keyspace:            cassandra.DefaultKeyspace,
		CassandraRF:         "1",
		CassandraRead:       "QUORUM",
		CassandraWrite:      "QUORUM",
		ReplaceAfter:        replica.DefaultReplaceAfter,
		LogMaxAge:           replica.DefaultMaxAge,
		RebalanceRate:       rebalance.DefaultRate,
		AuditInterval:       writer.DefaultAuditInterval,
		TextIndexDelay:      mailbox.DefaultTextIndexDelay,
		ACMEDirectory:       acmecert.LetsEncrypt,
		ACMEHTTP:            ":80",
		OutboundPort:        25,
		MTASTSPort:          443,
		CheckInbound:        true,
		SubmitRecipients:    100,
		SubmitPerHour:       500,
		QueueLifetime:       queue.DefaultLifetime,
		QueueWarn:           queue.DefaultWarnAfter,
		QueueRetry:          queue.DefaultRetry,
		QueueWorkers:        queue.DefaultWorkers,
		RelayWorkers:        2,
		FilterWorkers:       2,
		Logger:              slog.Default(),
	}
}

// cassandraConfig reads the --store settings: nil for the native store.
func cassandraConfig(cfg Config) (*cassandra.Config, error) {
	switch cfg.Store {
	case "", "native":
		return nil, nil
	case "cassandra":
	default:
		return nil, fmt.Errorf("--store %q: want native or cassandra", cfg.Store)
	}
	if len(cfg.Cassandra) == 0 {
		return nil, errors.New("--store cassandra: give some of the cluster's nodes with --cassandra host[:port],...")
	}
	rf, err := cassandra.ParseReplication(cfg.CassandraRF)
	if err != nil {
		return nil, fmt.Errorf("--cassandra-rf: %w", err)
	}
	read, err := cassandra.ParseConsistency(cfg.CassandraRead)
	if err != nil {
		return nil, fmt.Errorf("--cassandra-read: %w", err)
	}
	write, err := cassandra.ParseConsistency(cfg.CassandraWrite)
	if err != nil {
		return nil, fmt.Errorf("--cassandra-write: %w", err)
	}
	return &cassandra.Config{Hosts: cfg.Cassandra, Keyspace: cfg.Keyspace, Replication: rf, Read: read, Write: write, Log: cfg.Logger}, nil
}

// Node is a running node.
type Node struct {
	*core.Core
	cfg     Config
	started time.Time

	// Certs are the certificates every TLS listener presents.
	Certs *tlscert.Store
	// Guard counts client connections and failed logins.
	Guard *guard.Guard
	// sends counts what each user submitted in the last hour.
	sends sharedSends
	// relays are the SNS relay workers (nil: the node delivers itself);
	// relaySvc serves them to the other nodes; snsMgr is this node's part
	// in the SNS manager (sns/manager.go), stopped by snsStop.
	relays   *sns.Pool
	filters  *sns.Pool // the SNS filter workers (nil: the node checks itself)
	relaySvc *sns.NodeService
	// reporter makes this node's telemetry report (served to every
	// node's console); view gathers every member's for this node's.
	reporter *telemetry.Reporter
	view     *telemetry.View
	snsMgr   *sns.Manager
	snsStop  chan struct{}
	stop     context.CancelFunc // ends the certificate watcher

	smtp  *smtp.Server
	smtps *smtp.Server // implicit TLS (submissions), with AUTH
	// submission is the message submission agent (RFC 6409).
	submission *smtp.Server
	pop3       *pop3.Server
	imap       *imap.Server
	http       *http.Server
	// saltOnce makes the cluster's fake-salt key once (fakeSaltKey).
	saltOnce sync.Once
	// certsMu serialises loadClusterCerts.
	certsMu sync.Mutex
	// acmeHTTP answers HTTP-01 challenges (--acme-email).
	acmeHTTP *http.Server
	addrs    map[string]string
	wg       sync.WaitGroup
	// unmetrics takes the node's state out of /metrics (metrics.AddNode).
	unmetrics func()
}

// Start opens the node's storage, starts the managers and the listeners.
// It returns once every listener accepts connections.
func Start(cfg Config) (*Node, error) {
	policy, err := replica.ParsePolicy(cfg.WritePolicy)
	if err != nil {
		return nil, err
	}
	if cfg.RebalanceRate < 0 {
		return nil, fmt.Errorf("--rebalance-rate %d: a rate of messages per second is 0 (off) or more", cfg.RebalanceRate)
	}
	placement, err := balance.ParsePolicy(cfg.Placement)
	if err != nil {
		return nil, fmt.Errorf("--placement: %w", err)
	}
	if cfg.DiskDelay < 0 {
		return nil, fmt.Errorf("--disk-delay %v: a delay is 0 or more", cfg.DiskDelay)
	}
	if cfg.Spread < 1 {
		return nil, fmt.Errorf("--spread %d: a user's mail needs at least one node", cfg.Spread)
	}
	if err := island.ValidName(cfg.Island); err != nil {
		return nil, fmt.Errorf("--island: %w", err)
	}
	cass, err := cassandraConfig(cfg)
	if err != nil {
		return nil, err
	}
	relaySvc := &sns.NodeService{}
	var self *Node
	reporter := newReporter(&self)
	c, err := core.New(core.Options{DataDir: cfg.DataDir, ClusterAddr: cfg.ClusterAddr, Join: cfg.Join, Log: cfg.Logger,
		MinFree: cfg.MinFree, Replicas: cfg.Replicas, WritePolicy: policy, Spread: cfg.Spread, ReplaceAfter: cfg.ReplaceAfter,
		LogMaxAge: cfg.LogMaxAge, RebalanceRate: cfg.RebalanceRate, ClockSkew: cfg.ClockSkew, AuditInterval: auditInterval(cfg.AuditInterval),
		TextIndexDelay: cfg.TextIndexDelay, Island: cfg.Island, Placement: placement, DiskDelay: cfg.DiskDelay,
		Register: func(r grpc.ServiceRegistrar) {
			relaySvc.Register(r)
			reporter.Register(r)
		}, SubaddressSeparator: cfg.SubaddressSeparator, Cassandra: cass})
	if err != nil {
		return nil, err
	}
	n := &Node{Core: c, cfg: cfg, started: time.Now(), addrs: map[string]string{}, relaySvc: relaySvc, reporter: reporter}
	self = n
	n.view = n.newView()
	if len(cfg.TLSCert) != len(cfg.TLSKey) {
		n.Shutdown(context.Background())
		return nil, fmt.Errorf("tls: %d --tls-cert file(s) but %d --tls-key file(s): give one key per certificate", len(cfg.TLSCert), len(cfg.TLSKey))
	}
	pairs := make([]tlscert.Pair, len(cfg.TLSCert))
	for i := range pairs {
		pairs[i] = tlscert.Pair{Cert: cfg.TLSCert[i], Key: cfg.TLSKey[i]}
	}
	n.Certs, err = tlscert.Open(tlscert.Options{Pairs: pairs, DataDir: cfg.DataDir, Hostname: cfg.Hostname, Log: cfg.Logger})
	if err != nil {
		n.Shutdown(context.Background())
		return nil, err
	}
	n.Guard = guard.New(guard.Limits{MaxConns: maxConns(cfg.MaxConns, cfg.Logger), MaxConnsPerIP: cfg.MaxConnsPerIP,
		RatePerIP: cfg.ConnRatePerIP, AuthFailDelay: cfg.AuthFailDelay, AuthMaxDelay: cfg.AuthMaxDelay, LockoutAfter: cfg.AuthLockoutAfter,
		LockoutFor: cfg.AuthLockoutFor}, cfg.Logger)
	n.sends = sharedSends{Sends: guard.NewSends(cfg.SubmitPerHour), n: n}
	if cfg.RelayWorkers > 0 {
		// Made before the notices are heard; it takes part once the
		// queue starts (startSNSManager).
		n.snsMgr = sns.NewManager(string(n.ID), cfg.Overflow, 0, time.Now())
	}
	n.shareNotices()
	saslsrv.SetFakeKey(n.fakeSaltKey)
	n.serveClusterCerts()
	var watch context.Context
	watch, n.stop = context.WithCancel(context.Background())
	go n.Certs.Watch(watch, tlscert.DefaultPollInterval)
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		n.reporter.Run(watch.Done())
	}()
	n.wg.Add(1)
	go func() {
		// The cluster's fake-salt key is made once membership has
		// settled (a node just started may not see its peers' yet).
		defer n.wg.Done()
		select {
		case <-watch.Done():
		case <-time.After(saltKeyAfter):
			n.fakeSaltKey(nil)
		}
	}()
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		t := time.NewTicker(tlscert.DefaultPollInterval)
		defer t.Stop()
		for {
			select {
			case <-watch.Done():
				return
			case <-t.C:
				n.loadClusterCerts()
			}
		}
	}()
	if cfg.ClusterAddr != "" {
		n.addrs["cluster"] = cfg.ClusterAddr
		n.addrs["rpc"] = c.RPCAddr()
	}
	n.startQueue()
	if err := n.startListeners(); err != nil {
		n.Shutdown(context.Background())
		return nil, err
	}
	if err := n.startACME(watch); err != nil {
		n.Shutdown(context.Background())
		return nil, err
	}
	n.unmetrics = metrics.AddNode(string(n.ID), n.metricsState())
	return n, nil
}

// metricsState is the core's state for /metrics with the listeners' and
// the SNS pools'.
func (n *Node) metricsState() metrics.NodeState {
	st := n.MetricsState()
	st.Connections = func() int { conns, _ := n.Guard.Open(); return conns }
	st.Workers = func() []metrics.WorkerPool {
		var out []metrics.WorkerPool
		for _, p := range []*sns.Pool{n.relays, n.filters} {
			if p == nil {
				continue
			}
			s := p.Status()
			wp := metrics.WorkerPool{Class: s.Class, Max: s.Max, Launches: s.Launches, Restarts: s.Restarts, RemoteTasks: s.Remote}
			for _, w := range s.Workers {
				if w.Alive {
					wp.Alive++
					wp.Load += w.Load
				}
			}
			out = append(out, wp)
		}
		return out
	}
	return st
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

// listenClients is listen for a protocol's clients: every connection
// passes the guard, which answers one over a limit with refuse's line.
func (n *Node) listenClients(proto, addr string, refuse func(string) []byte, serve func(net.Listener) error) error {
	return n.listen(proto, addr, func(l net.Listener) error {
		return serve(n.Guard.Listener(proto, l, refuse))
	})
}

// listenTLS is listenClients with implicit TLS (RFC 8314 §3.3): the
// handshake comes first, bounded by handshakeTimeout; a refusal can say
// nothing before it, so the connection is just closed.
func (n *Node) listenTLS(proto, addr string, serve func(net.Listener) error) error {
	if addr == "" {
		return nil
	}
	return n.listen(proto, addr, func(l net.Listener) error {
		return serve(tlscert.Listener(n.Guard.Listener(proto, l, nil), n.Certs.Config(), handshakeTimeout))
	})
}

// The lines a refused connection gets, in each protocol's words for "try
// again later" (RFC 5321 §3.8, RFC 3206 SYS/TEMP, RFC 5530 UNAVAILABLE).
func refuseSMTP(host string) func(string) []byte {
	return func(reason string) []byte {
		return []byte("421 4.7.0 " + host + " " + reason + ", try again later\r\n")
	}
}

func refusePOP3(reason string) []byte {
	return []byte("-ERR [SYS/TEMP] " + reason + ", try again later\r\n")
}

func refuseIMAP(reason string) []byte {
	return []byte("* BYE [UNAVAILABLE] " + reason + ", try again later\r\n")
}

// fdReserve is the open files kept for everything but client connections:
// Pebble's files, node-to-node RPC, gossip, the admin API.
const fdReserve = 1024

// maxConns is the client connection cap: the flag, or 10,000, lowered to
// stay fdReserve below the open-file limit (Go raises the soft limit to
// the hard one at start).
func maxConns(flag int, log *slog.Logger) int {
	want := flag
	if want <= 0 {
		want = 10000
	}
	var rl syscall.Rlimit
	if err := syscall.Getrlimit(syscall.RLIMIT_NOFILE, &rl); err == nil && rl.Cur < uint64(want+fdReserve) {
		limit := max(int(rl.Cur)-fdReserve, int(rl.Cur)/2)
		log.Warn("connection cap lowered below the open-file limit", "max_conns", limit, "nofile", rl.Cur)
		return limit
	}
	return want
}

// handshakeTimeout bounds a TLS handshake on an implicit-TLS listener, so
// a client that connects and sends nothing cannot hold a session.
const handshakeTimeout = 30 * time.Second

// plaintextAuth says whether a connection not under TLS may carry a
// password: from loopback, or anywhere with --allow-plaintext-auth.
func (n *Node) plaintextAuth(c net.Conn) bool {
	return n.cfg.AllowPlaintextAuth || tlscert.IsLoopback(c.RemoteAddr())
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
	sc.TLSConfig = n.Certs.Config()
	if cfg.CheckInbound {
		sc.Checker = n.originChecker()
		sc.Sealer = n
		sc.Policy = n
	}
	sc.Defer = queueDeferrer{n}
	n.smtp = smtp.New(n.Proxy, sc)
	if err := n.listenClients("smtp", cfg.SMTPAddr, refuseSMTP(cfg.Hostname), n.smtp.Serve); err != nil {
		return err
	}
	// The implicit-TLS port is submissions (RFC 8314): it offers AUTH;
	// the port for other servers' mail does not (as Postfix by default).
	ssc := sc
	ssc.AuthConfig = smtp.AuthConfig{Auth: n.Proxy, Logins: n.Guard, PlaintextAuth: n.plaintextAuth}
	ssc.Queue = queueSubmitter{n}
	ssc.SubmitRecipients, ssc.Sends = cfg.SubmitRecipients, n.sends
	n.smtps = smtp.New(n.Proxy, ssc)
	if err := n.listenTLS("smtps", cfg.SMTPSAddr, n.smtps.Serve); err != nil {
		return err
	}
	// Submission (RFC 6409): STARTTLS, then AUTH before any MAIL.
	msa := ssc
	msa.Submission = true
	n.submission = smtp.New(n.Proxy, msa)
	if cfg.SubmissionAddr != "" {
		if err := n.listenClients("submission", cfg.SubmissionAddr, refuseSMTP(cfg.Hostname), n.submission.Serve); err != nil {
			return err
		}
	}

	pc := pop3.Config{}
	pc.Hostname = cfg.Hostname
	pc.AuthFailDelay = cfg.AuthFailDelay
	pc.Logger = cfg.Logger
	pc.CommandContext = hangup.Watch
	pc.TLSConfig = n.Certs.Config()
	pc.PlaintextAuth = n.plaintextAuth
	pc.Logins = n.Guard
	n.pop3 = pop3.New(proxy.POP3{P: n.Proxy, Log: cfg.Logger}, pc)
	if err := n.listenClients("pop3", cfg.POP3Addr, refusePOP3, n.pop3.Serve); err != nil {
		return err
	}
	if err := n.listenTLS("pop3s", cfg.POP3SAddr, n.pop3.Serve); err != nil {
		return err
	}

	n.imap = imap.New(&proxy.IMAPStore{P: n.Proxy}, proxy.IMAPAuth{P: n.Proxy}, imap.Config{AuthFailDelay: cfg.AuthFailDelay,
		MaxMessageBytes: cfg.MaxMessageBytes, Logger: cfg.Logger, TLSConfig: n.Certs.Config(), PlaintextAuth: n.plaintextAuth,
		Logins: n.Guard})
	if err := n.listenClients("imap", cfg.IMAPAddr, refuseIMAP, n.imap.Serve); err != nil {
		return err
	}
	if err := n.listenTLS("imaps", cfg.IMAPSAddr, n.imap.Serve); err != nil {
		return err
	}

	// The token is asked for on loopback too: any local account could
	// otherwise list users and set passwords.
	token, err := admin.LoadToken(cfg.DataDir)
	if err != nil {
		return err
	}
	as := &admin.Server{Users: n.Users, TLS: n, Queue: n.Queue, DKIM: n, Policies: n, Domains: n.Core, Islands: nodeIslands{n}, Token: token, Pprof: cfg.Pprof, Logger: cfg.Logger, Node: admin.NodeInfo{
		ID: n.ID, Started: n.started, Addrs: n.addrs, Load: n.Boxes.Pending, TLS: n.Certs.Info,
		UserMap: n.Members.UserMap, Members: n.Members.Members,
		Replication: func() admin.ReplicationStatus {
			return admin.ReplicationStatus{Node: n.ID, Replicas: n.Opts.Replicas, WritePolicy: string(n.Opts.WritePolicy),
				LogStats: n.Repl.Stats(), RepairStats: n.Repl.RepairStats(), Rebalance: n.rebalanceStatus()}
		},
		Workers: func() []sns.Status {
			var out []sns.Status
			for _, p := range []*sns.Pool{n.relays, n.filters} {
				if p != nil {
					out = append(out, p.Status())
				}
			}
			return out
		},
		SNSManager: func() *sns.ManagerStatus {
			if n.snsMgr == nil {
				return nil
			}
			st := n.snsMgr.Status(time.Now())
			return &st
		},
	}}
	// The console: admin users sign in through the same login check as
	// every protocol; the cluster picture comes from every member.
	as.Verifier, as.Logins, as.View, as.Hostname = n.Proxy, n.Guard, n.view, cfg.Hostname
	// The mail API (quill import, export) stores through the IMAP path.
	as.Mail, as.MaxMessageBytes = &proxy.IMAPStore{P: n.Proxy}, cfg.MaxMessageBytes
	as.Backup = &backup.Nodes{Local: n.Core.Backup, Conns: n.Peers}
	n.http = &http.Server{Handler: as.Handler(), ReadHeaderTimeout: 10 * time.Second}
	return n.listen("http", cfg.HTTPAddr, n.http.Serve)
}

// Addr returns the bound address of a listener ("smtp", "pop3", "imap",
// "http").
func (n *Node) Addr(proto string) string { return n.addrs[proto] }

// Shutdown stops accepting, lets sessions finish until ctx is done, closes
// the rest and then the store.
func (n *Node) Shutdown(ctx context.Context) error {
	if n.unmetrics != nil {
		n.unmetrics()
	}
	var wg sync.WaitGroup
	stop := func(f func(context.Context) error) {
		wg.Add(1)
		go func() { defer wg.Done(); f(ctx) }()
	}
	for _, srv := range []*smtp.Server{n.smtp, n.smtps, n.submission} {
		if srv != nil {
			stop(func(ctx context.Context) error {
				err := srv.Shutdown(ctx)
				if err != nil {
					srv.Close()
				}
				return err
			})
		}
	}
	if n.pop3 != nil {
		stop(n.pop3.Shutdown)
	}
	if n.imap != nil {
		stop(n.imap.Shutdown)
	}
	if n.acmeHTTP != nil {
		stop(n.acmeHTTP.Shutdown)
	}
	if n.http != nil {
		stop(n.http.Shutdown)
	}
	wg.Wait()
	// Deliveries in progress are cut short before the store closes:
	// their entries stay as they were and are tried again.
	n.Queue.Close()
	if n.snsStop != nil {
		close(n.snsStop)
		n.snsStop = nil
	}
	if n.filters != nil {
		n.filters.Close()
	}
	if n.relays != nil {
		n.relays.Close()
	}
	if n.stop != nil {
		n.stop() // the certificate watchers and ACME end with it
	}
	n.wg.Wait()
	return n.Core.Close()
}

// rebalanceStatus is the rebalancer's progress (nil on Cassandra).
func (n *Node) rebalanceStatus() *rebalance.Status {
	if n.Rebal == nil {
		return nil
	}
	st := n.Rebal.Status()
	return &st
}

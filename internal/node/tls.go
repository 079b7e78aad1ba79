package node

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"fmt"
	"net/http"
	"net/netip"
	"os"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/acmecert"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/clusterwide"
	"github.com/quillmail/quill/internal/guard"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/sns"
	"github.com/quillmail/quill/internal/tlscert"
	"google.golang.org/protobuf/proto"
)

// The cluster's certificates are clusterwide objects named tlsPrefix +
// the first name the certificate covers: every node serves them
// (issue 11: a certificate given to one node is served by all).
const tlsPrefix = "tls/"

// serveClusterCerts follows the clusterwide certificates: those there at
// start and every change after.
func (n *Node) serveClusterCerts() {
	n.Wide.OnChange(func(o clusterwide.Object) {
		if strings.HasPrefix(o.Name, tlsPrefix) {
			n.loadClusterCerts()
		}
	})
	n.loadClusterCerts()
}

// loadClusterCerts puts the cluster's certificates in service. Calls are
// serialised so that the last to run, which read the newest set, wins; it
// also runs on the certificate watcher's timer, so a certificate that
// ends (or one not yet valid here at first) is looked at again.
func (n *Node) loadClusterCerts() {
	n.certsMu.Lock()
	defer n.certsMu.Unlock()
	var pems []tlscert.ClusterPEM
	for _, o := range n.Wide.List(tlsPrefix) {
		var c nodepb.Certificate
		if err := proto.Unmarshal(o.Data, &c); err != nil {
			n.cfg.Logger.Error("tls: cluster certificate unreadable", "name", o.Name, "err", err)
			continue
		}
		pems = append(pems, tlscert.ClusterPEM{Name: o.Name, Chain: c.ChainPem, Key: c.KeyPem, Source: c.Source})
	}
	n.Certs.SetCluster(pems)
}

// SetCertificate checks a certificate chain and key and makes them the
// cluster's certificate for the names it covers, replacing the one of the
// same first name. It returns once this node holds it durably, with the
// nodes that acknowledged it; the others get it from the update log or
// from anti-entropy within seconds of being reachable.
func (n *Node) SetCertificate(ctx context.Context, chain, key []byte, source string) (tlscert.Info, []cluster.NodeID, error) {
	_, info, err := tlscert.Parse(chain, key, time.Now())
	if err != nil {
		return tlscert.Info{}, nil, err
	}
	if len(info.Names) == 0 {
		return tlscert.Info{}, nil, fmt.Errorf("%w: the certificate names no host", tlscert.ErrBadCertificate)
	}
	info.Cluster, info.Source = tlsPrefix+strings.ToLower(info.Names[0]), source
	data, err := proto.Marshal(&nodepb.Certificate{ChainPem: chain, KeyPem: key, Source: source})
	if err != nil {
		return tlscert.Info{}, nil, err
	}
	acked, err := n.Wide.Put(ctx, n.Repl, n.AliveIDs(), info.Cluster, data, false, replica.One)
	if err != nil {
		return tlscert.Info{}, acked, err
	}
	n.cfg.Logger.Info("tls: cluster certificate set", "object", info.Cluster, "names", info.Names,
		"not_after", info.NotAfter.Format(time.DateOnly), "acked_by", acked)
	return info, acked, nil
}

// DeleteCertificate stops the cluster serving a certificate (by its
// object name, "tls/<name>", or the name alone).
func (n *Node) DeleteCertificate(ctx context.Context, name string) error {
	if !strings.HasPrefix(name, tlsPrefix) {
		name = tlsPrefix + strings.ToLower(name)
	}
	_, err := n.Wide.Put(ctx, n.Repl, n.AliveIDs(), name, nil, true, replica.One)
	if err == nil {
		n.cfg.Logger.Info("tls: cluster certificate deleted", "object", name)
	}
	return err
}

// startACME starts getting the cluster's certificate from the ACME CA, if
// --acme-email is set: the HTTP-01 listener on every node, and the
// manager, which orders only on the node responsible for the names.
func (n *Node) startACME(ctx context.Context) error {
	cfg := n.cfg
	if cfg.ACMEEmail == "" {
		return nil
	}
	names := cfg.ACMEDomains
	if len(names) == 0 {
		names = []string{cfg.Hostname}
	}
	client := &http.Client{Timeout: time.Minute}
	if cfg.ACMECA != "" {
		pem, err := os.ReadFile(cfg.ACMECA)
		if err != nil {
			return fmt.Errorf("acme: --acme-ca: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return fmt.Errorf("acme: --acme-ca %s: no PEM certificate in it", cfg.ACMECA)
		}
		client.Transport = &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool}}
	}
	m, err := acmecert.New(acmecert.Config{Email: cfg.ACMEEmail, Directory: cfg.ACMEDirectory, Names: names,
		HTTPClient: client, Log: cfg.Logger}, acmeCluster{n})
	if err != nil {
		return err
	}
	srv := &http.Server{Handler: acmecert.ChallengeHandler(acmeCluster{n}.Get), ReadHeaderTimeout: 10 * time.Second}
	if err := n.listen("acme-http", cfg.ACMEHTTP, srv.Serve); err != nil {
		return fmt.Errorf("acme: %w (the CA asks port 80 for HTTP-01 answers: run with the right to bind it, or forward it)", err)
	}
	n.acmeHTTP = srv
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		m.Run(ctx)
	}()
	return nil
}

// acmeCluster is the node as the ACME manager sees it.
type acmeCluster struct{ n *Node }

// acmeSettle is how long membership must stay unchanged before a node
// decides it is the one to order: a node that has just started, alone
// for a moment before its peers' gossip reaches it, must not order a
// certificate that the node really ranked first orders too.
const acmeSettle = 10 * time.Second

// Responsible: the live node ranked highest for the name's bucket orders,
// once membership has settled. (Not waiting for members that are away: a
// dead node must not stop renewals. Two sides of a partition may both
// order; the newer certificate wins everywhere once it heals.)
func (a acmeCluster) Responsible(name string) bool {
	m := a.n.Members
	if time.Since(m.ChangedAt()) < acmeSettle {
		return false
	}
	var members []cluster.Member
	for _, mi := range a.n.Members.Alive() {
		members = append(members, mi.Member)
	}
	ranked := cluster.Ranked(cluster.Bucket("acme:"+strings.ToLower(name)), members)
	return len(ranked) == 0 || ranked[0].ID == a.n.ID
}

func (a acmeCluster) Certificates() []acmecert.Cert {
	var out []acmecert.Cert
	for _, o := range a.n.Wide.List(tlsPrefix) {
		var c nodepb.Certificate
		if proto.Unmarshal(o.Data, &c) != nil {
			continue
		}
		cert, _, err := tlscert.Parse(c.ChainPem, c.KeyPem, time.Now())
		if err != nil {
			continue
		}
		out = append(out, acmecert.Cert{Names: cert.Leaf.DNSNames, NotBefore: cert.Leaf.NotBefore, NotAfter: cert.Leaf.NotAfter})
	}
	return out
}

func (a acmeCluster) Install(ctx context.Context, chain, key []byte) error {
	_, _, err := a.n.SetCertificate(ctx, chain, key, "acme")
	return err
}

func (a acmeCluster) Put(ctx context.Context, name string, data []byte) error {
	// An HTTP-01 answer must be on every live node before the CA is told
	// to look (it may ask any of them): written with policy all.
	policy := replica.One
	if strings.HasPrefix(name, acmecert.ChallengePrefix) && data != nil {
		policy = replica.All
	}
	_, err := a.n.Wide.Put(ctx, a.n.Repl, a.n.AliveIDs(), name, data, data == nil, policy)
	return err
}

func (a acmeCluster) Get(name string) ([]byte, bool) {
	o, ok := a.n.Wide.Get(name)
	return o.Data, ok
}

// notice is a message a node broadcasts to the others.
type notice struct {
	// Lockout shares a lockout of an address (internal/guard) with the
	// cluster, so guesses spread over the nodes are counted as one.
	Lockout *lockoutNotice `json:"lockout,omitempty"`
	// Sent shares a message a user submitted (guard.Sends), so that
	// the hourly limit counts what they sent through every node.
	Sent *sentNotice `json:"sent,omitempty"`
	// SNS carries the SNS manager's beacons and the nodes' load reports
	// (sns/manager.go).
	SNS *sns.Message `json:"sns,omitempty"`
}

type sentNotice struct {
	User string `json:"user"`
	At   int64  `json:"at"` // Unix milliseconds
}

type lockoutNotice struct {
	IP    string `json:"ip"`
	Until int64  `json:"until"` // Unix milliseconds
}

// shareLockouts makes the guard's lockouts cluster-wide: each one decided
// here is broadcast, and each one heard is applied here.
func (n *Node) shareNotices() {
	n.Guard.OnLockout = func(ip netip.Addr, until time.Time) {
		n.broadcast(notice{Lockout: &lockoutNotice{IP: ip.String(), Until: until.UnixMilli()}}, "lockout", ip.String())
	}
	n.SetNoticeHandler(func(b []byte) {
		var msg notice
		if json.Unmarshal(b, &msg) != nil {
			return
		}
		if msg.Lockout != nil {
			if ip, err := netip.ParseAddr(msg.Lockout.IP); err == nil {
				n.Guard.LockOut(ip, time.UnixMilli(msg.Lockout.Until))
			}
		}
		if msg.Sent != nil {
			n.sends.Note(msg.Sent.User, time.UnixMilli(msg.Sent.At))
		}
		if msg.SNS != nil && n.snsMgr != nil {
			n.carryOut(n.snsMgr.Hear(*msg.SNS, time.Now()))
		}
	})
}

func (n *Node) broadcast(msg notice, what, about string) {
	b, _ := json.Marshal(msg)
	if err := n.Members.Broadcast(b); err != nil {
		n.cfg.Logger.Warn(what+" not shared with the cluster", "about", about, "err", err)
	}
}

// sharedSends counts what users submit (guard.Sends) on every node: each
// message is told to the others as a notice.
type sharedSends struct {
	*guard.Sends
	n *Node
}

// Sent implements smtp.SendLimit: the message, counted here by Take, is
// told to the other nodes.
func (s sharedSends) Sent(user string, at time.Time) {
	if s.Limit() > 0 {
		s.n.broadcast(notice{Sent: &sentNotice{User: user, At: at.UnixMilli()}}, "sending count", user)
	}
}

// saltKeyObject is the clusterwide object keyed to make the SCRAM salts of
// users that do not exist: the same on every node, so comparing nodes
// does not tell which users exist.
const saltKeyObject = "sasl/fake-salt-key"

// saltKeyAfter is how long after start a node makes the cluster's
// fake-salt key if no peer has: past failure detection and a gossip
// round, so a node that just joined sees the key its peers already hold.
const saltKeyAfter = 15 * time.Second

// fakeSaltKey returns the cluster's key for fake SCRAM salts, making it
// the first time it is asked for (until it has spread, the node's own key
// serves).
func (n *Node) fakeSaltKey(local []byte) []byte {
	if o, ok := n.Wide.Get(saltKeyObject); ok && len(o.Data) >= 16 {
		return o.Data
	}
	n.saltOnce.Do(func() {
		key := make([]byte, 32)
		rand.Read(key)
		n.wg.Add(1)
		go func() {
			defer n.wg.Done()
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := n.Wide.Put(ctx, n.Repl, n.AliveIDs(), saltKeyObject, key, false, replica.One); err != nil {
				n.cfg.Logger.Warn("sasl: storing the cluster's fake-salt key failed; each node uses its own", "err", err)
			}
		}()
	})
	return local
}

// Package acmecert gets the cluster's certificates from an ACME CA (RFC
// 8555: Let's Encrypt, or any other) and renews them before they end, so
// that an operator gives an e-mail address and the names, and nothing else.
//
// One node of the cluster orders a name's certificate: the live node ranked
// highest for the name's bucket (Porcupine's rendezvous ranking, §3.1), so
// no two nodes order at once in a stable cluster and another takes over
// when that one dies. The certificate goes into the cluster's replicated
// state (internal/clusterwide, as `quill tls set` puts it), so every node
// serves it; the HTTP-01 challenge's answer goes there too, so the CA may
// ask any node that the name resolves to. The protocol itself is
// golang.org/x/crypto/acme; what is written here is who orders, when, and
// where the results go, which no ACME library knows about a cluster.
package acmecert

import (
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strings"
	"time"

	"golang.org/x/crypto/acme"
)

// Timings, each deliberate:
const (
	// CheckInterval is how often the responsible node looks at how long
	// its names' certificates have left.
	CheckInterval = 30 * time.Second
	// orderTimeout bounds one whole order, challenges included.
	orderTimeout = 5 * time.Minute
	// retryAfterFailure is how long a failed order waits before the next
	// try, so a CA that refuses is not hammered (Let's Encrypt limits
	// failed validations per hour).
	retryAfterFailure = 10 * time.Minute
	// cleanupTimeout bounds the removal of an order's challenge answers.
	cleanupTimeout = 10 * time.Second
)

// LetsEncrypt is Let's Encrypt's production directory.
const LetsEncrypt = acme.LetsEncryptURL

// ChallengePrefix names the clusterwide objects holding HTTP-01 answers.
const ChallengePrefix = "acme-http/"

// accountObject is the clusterwide object holding the ACME account key,
// shared so that whichever node orders uses the same account.
const accountObject = "acme/account"

// Cert describes a cluster certificate, as NeedsOrder weighs it.
type Cert struct {
	Names               []string
	NotBefore, NotAfter time.Time
}

// NeedsOrder decides, without I/O, whether names need a new certificate
// now: no cluster certificate covers them all, or the ones that do have
// less than a third of their lifetime left (Let's Encrypt's advice: renew
// 30 days before the end of a 90-day certificate). An operator's
// certificate (quill tls set) counts: ACME does not replace it while it
// has life left, and takes over when it nears its end.
func NeedsOrder(names []string, certs []Cert, now time.Time) bool {
	for _, c := range certs {
		if !covers(c.Names, names) {
			continue
		}
		life := c.NotAfter.Sub(c.NotBefore)
		if now.Before(c.NotAfter.Add(-life / 3)) {
			return false
		}
	}
	return true
}

func covers(have, want []string) bool {
	for _, w := range want {
		found := false
		for _, h := range have {
			if strings.EqualFold(h, w) {
				found = true
			}
		}
		if !found {
			return false
		}
	}
	return true
}

// Cluster is what the manager needs of the node.
type Cluster interface {
	// Responsible says whether this node orders for a name now.
	Responsible(name string) bool
	// Certificates lists the cluster's certificates in service.
	Certificates() []Cert
	// Install stores a certificate (PEM chain and key) as cluster state.
	Install(ctx context.Context, chain, key []byte) error
	// Put stores (or, with nil, deletes) a clusterwide object; Get reads one.
	Put(ctx context.Context, name string, data []byte) error
	Get(name string) ([]byte, bool)
}

// Config configures the manager.
type Config struct {
	Email     string
	Directory string   // the CA's directory URL
	Names     []string // the host names to get one certificate for
	// HTTPClient reaches the CA (its transport may trust a test CA).
	HTTPClient *http.Client
	Log        *slog.Logger
}

// Manager orders and renews the certificate of Config.Names.
type Manager struct {
	cfg Config
	cl  Cluster
	log *slog.Logger

	failedAt time.Time
}

// New returns a manager; Run starts it.
func New(cfg Config, cl Cluster) (*Manager, error) {
	if cfg.Email == "" || len(cfg.Names) == 0 || cfg.Directory == "" {
		return nil, errors.New("acme: an e-mail address, a directory URL and at least one name are needed")
	}
	if cfg.Log == nil {
		cfg.Log = slog.New(slog.DiscardHandler)
	}
	return &Manager{cfg: cfg, cl: cl, log: cfg.Log}, nil
}

// Run checks every CheckInterval until ctx ends, and orders when this node
// is responsible and the certificate is missing or due.
func (m *Manager) Run(ctx context.Context) {
	t := time.NewTicker(CheckInterval)
	defer t.Stop()
	for {
		m.Check(ctx)
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

// Check orders once if this node should now.
func (m *Manager) Check(ctx context.Context) {
	now := time.Now()
	if !m.cl.Responsible(m.cfg.Names[0]) || !NeedsOrder(m.cfg.Names, m.cl.Certificates(), now) {
		return
	}
	if !m.failedAt.IsZero() && now.Sub(m.failedAt) < retryAfterFailure {
		return
	}
	octx, cancel := context.WithTimeout(ctx, orderTimeout)
	defer cancel()
	m.log.Info("acme: ordering a certificate", "names", m.cfg.Names, "directory", m.cfg.Directory)
	if err := m.order(octx); err != nil {
		m.failedAt = now
		m.log.Error("acme: order failed; trying again later", "names", m.cfg.Names, "retry_in", retryAfterFailure, "err", err)
		return
	}
	m.failedAt = time.Time{}
}

// account returns the client with the cluster's account key, making and
// storing one the first time.
func (m *Manager) account(ctx context.Context) (*acme.Client, error) {
	var key crypto.Signer
	if b, ok := m.cl.Get(accountObject); ok {
		k, err := parseKey(b)
		if err != nil {
			return nil, fmt.Errorf("acme account key: %w", err)
		}
		key = k
	} else {
		k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
		if err != nil {
			return nil, err
		}
		b, err := encodeKey(k)
		if err != nil {
			return nil, err
		}
		if err := m.cl.Put(ctx, accountObject, b); err != nil {
			return nil, fmt.Errorf("acme account key: store: %w", err)
		}
		key = k
	}
	c := &acme.Client{Key: key, DirectoryURL: m.cfg.Directory, HTTPClient: m.cfg.HTTPClient, UserAgent: "quill"}
	_, err := c.Register(ctx, &acme.Account{Contact: []string{"mailto:" + m.cfg.Email}}, acme.AcceptTOS)
	if err != nil && !errors.Is(err, acme.ErrAccountAlreadyExists) {
		return nil, fmt.Errorf("acme account for %s at %s: %w", m.cfg.Email, m.cfg.Directory, err)
	}
	return c, nil
}

// order runs one RFC 8555 order: authorizations by HTTP-01 (answers put in
// cluster state, served by every node), a CSR for a fresh key, the chain.
func (m *Manager) order(ctx context.Context) error {
	c, err := m.account(ctx)
	if err != nil {
		return err
	}
	o, err := c.AuthorizeOrder(ctx, acme.DomainIDs(m.cfg.Names...))
	if err != nil {
		return fmt.Errorf("new order: %w", err)
	}
	var answered []string
	defer func() {
		// The answers are needed only during the order; their removal
		// gets its own time, as ctx may be what ended the order.
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), cleanupTimeout)
		defer cancel()
		for _, tok := range answered {
			m.cl.Put(cctx, ChallengePrefix+tok, nil)
		}
	}()
	for _, zurl := range o.AuthzURLs {
		z, err := c.GetAuthorization(ctx, zurl)
		if err != nil {
			return fmt.Errorf("authorization %s: %w", zurl, err)
		}
		if z.Status == acme.StatusValid {
			continue
		}
		var chal *acme.Challenge
		for _, ch := range z.Challenges {
			if ch.Type == "http-01" {
				chal = ch
			}
		}
		if chal == nil {
			return fmt.Errorf("authorization of %s: the CA offers no http-01 challenge", z.Identifier.Value)
		}
		answer, err := c.HTTP01ChallengeResponse(chal.Token)
		if err != nil {
			return err
		}
		if err := m.cl.Put(ctx, ChallengePrefix+chal.Token, []byte(answer)); err != nil {
			return fmt.Errorf("store the http-01 answer: %w", err)
		}
		answered = append(answered, chal.Token)
		if _, err := c.Accept(ctx, chal); err != nil {
			return fmt.Errorf("accept the challenge for %s: %w", z.Identifier.Value, err)
		}
		if _, err := c.WaitAuthorization(ctx, z.URI); err != nil {
			return fmt.Errorf("authorization of %s: %w", z.Identifier.Value, err)
		}
	}
	if o, err = c.WaitOrder(ctx, o.URI); err != nil {
		return fmt.Errorf("order: %w", err)
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return err
	}
	csr, err := x509.CreateCertificateRequest(rand.Reader, &x509.CertificateRequest{DNSNames: m.cfg.Names}, key)
	if err != nil {
		return err
	}
	orderURL := o.URI
	ders, _, err := c.CreateOrderCert(ctx, o.FinalizeURL, csr, true)
	if err != nil {
		// A CA that answers the finalization with "processing" and no
		// Location header (Pebble does) leaves x/crypto/acme without
		// the order's URL to wait on: wait on the one we know.
		o, werr := c.WaitOrder(ctx, orderURL)
		if werr != nil || o.CertURL == "" {
			return fmt.Errorf("finalize: %w", err)
		}
		if ders, err = c.FetchCert(ctx, o.CertURL, true); err != nil {
			return fmt.Errorf("fetch the certificate: %w", err)
		}
	}
	var chain []byte
	for _, d := range ders {
		chain = append(chain, pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: d})...)
	}
	keyPEM, err := encodeKey(key)
	if err != nil {
		return err
	}
	if err := m.cl.Install(ctx, chain, keyPEM); err != nil {
		return fmt.Errorf("install the certificate: %w", err)
	}
	m.log.Info("acme: certificate installed for the cluster", "names", m.cfg.Names)
	return nil
}

func encodeKey(k *ecdsa.PrivateKey) ([]byte, error) {
	der, err := x509.MarshalECPrivateKey(k)
	if err != nil {
		return nil, err
	}
	return pem.EncodeToMemory(&pem.Block{Type: "EC PRIVATE KEY", Bytes: der}), nil
}

func parseKey(b []byte) (crypto.Signer, error) {
	blk, _ := pem.Decode(b)
	if blk == nil {
		return nil, errors.New("not PEM")
	}
	return x509.ParseECPrivateKey(blk.Bytes)
}

// ChallengeHandler answers the CA's HTTP-01 requests
// (/.well-known/acme-challenge/TOKEN) from cluster state, on any node.
func ChallengeHandler(get func(name string) ([]byte, bool)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		tok, ok := strings.CutPrefix(r.URL.Path, "/.well-known/acme-challenge/")
		if !ok || tok == "" || strings.Contains(tok, "/") {
			http.NotFound(w, r)
			return
		}
		answer, ok := get(ChallengePrefix + tok)
		if !ok {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/plain")
		w.Write(answer)
	})
}

// Package tlscert holds the certificates a node's listeners present: the
// PEM files an operator names (--tls-cert/--tls-key, several pairs for
// several domains, chosen by SNI), or, when none is named, a self-signed
// certificate for the node's host name that the node makes once and keeps
// in its data directory, so that `quill serve` speaks TLS with no
// configuration. Files are re-read when they change on disk or on SIGHUP,
// without a restart; a pair that fails to load leaves the previous one in
// service.
//
// None of the seed papers covers transport security: this is what every
// mail server of today does (RFC 8314 asks for TLS on every submission and
// access protocol). The TLS itself is Go's crypto/tls; only the choice and
// reload of certificates is written here, as no library does it for files.
package tlscert

import (
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"errors"
	"fmt"
	"log/slog"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"time"
)

const (
	// SelfSignedDir is where, under the data directory, the self-signed
	// certificate lives.
	SelfSignedDir = "tls"
	// selfSignedValidity is how long a self-signed certificate is valid;
	// it is made again when less than selfSignedRenew remains.
	selfSignedValidity = 398 * 24 * time.Hour
	selfSignedRenew    = 30 * 24 * time.Hour
	// DefaultPollInterval is how often the files are checked for a change.
	DefaultPollInterval = 30 * time.Second
)

// Pair names one certificate chain and its key, both PEM files.
type Pair struct{ Cert, Key string }

// Options configure a Store.
type Options struct {
	// Pairs are the operator's certificates; the first is the default for
	// clients that send no SNI or a name no certificate covers.
	Pairs []Pair
	// DataDir and Hostname make the self-signed certificate when Pairs is
	// empty.
	DataDir, Hostname string
	Log               *slog.Logger
}

// Info describes one certificate in service, for the log and the dashboard.
type Info struct {
	Names      []string  `json:"names"`
	NotAfter   time.Time `json:"not_after"`
	SelfSigned bool      `json:"self_signed"`
	CertFile   string    `json:"cert_file,omitempty"`
	// Cluster names the clusterwide object the certificate came from
	// (quill tls set, ACME), served by every node; empty for files.
	Cluster string `json:"cluster,omitempty"`
	Source  string `json:"source,omitempty"`
}

// Store is the set of certificates in service. It is safe for concurrent
// use; the tls.Config it hands out asks it for a certificate at each
// handshake, so a reload takes effect for the next connection.
type Store struct {
	opts  Options
	log   *slog.Logger
	pairs []Pair

	mu     sync.RWMutex
	certs  []*tls.Certificate // from files: the operator's, or the self-signed one
	stamps []stamp
	info   []Info
	// cluster are the certificates every node serves (SetCluster).
	cluster     []*tls.Certificate
	clusterInfo []Info
	// serving is what a handshake tries, in order (orderLocked).
	serving     []*tls.Certificate
	servingInfo []Info
}

// orderLocked rebuilds the list a handshake tries, after either source changed:
// the operator's files (a node's own configuration wins), then the
// cluster's, then the self-signed one, the last resort. It is kept, not
// built per handshake.
func (s *Store) orderLocked() {
	if len(s.opts.Pairs) > 0 {
		s.serving, s.servingInfo = slices.Concat(s.certs, s.cluster), slices.Concat(s.info, s.clusterInfo)
	} else {
		s.serving, s.servingInfo = slices.Concat(s.cluster, s.certs), slices.Concat(s.clusterInfo, s.info)
	}
}

// ClusterPEM is a certificate of the cluster's replicated state.
type ClusterPEM struct {
	Name       string // the clusterwide object's name
	Chain, Key []byte // PEM
	Source     string // "operator" (quill tls set) or "acme"
}

// ErrBadCertificate wraps the reason a certificate cannot be served.
var ErrBadCertificate = errors.New("certificate refused")

// Parse checks a certificate chain and key as a client would need them:
// they must match, and the leaf must be valid now.
func Parse(chain, key []byte, now time.Time) (*tls.Certificate, Info, error) {
	c, err := tls.X509KeyPair(chain, key)
	if err != nil {
		return nil, Info{}, fmt.Errorf("%w: certificate and key: %v", ErrBadCertificate, err)
	}
	leaf := c.Leaf
	if leaf == nil {
		return nil, Info{}, fmt.Errorf("%w: no leaf certificate", ErrBadCertificate)
	}
	if now.After(leaf.NotAfter) || now.Before(leaf.NotBefore) {
		return nil, Info{}, fmt.Errorf("%w: certificate for %v: not valid now (valid %s to %s)", ErrBadCertificate, leafNames(leaf),
			leaf.NotBefore.Format(time.DateOnly), leaf.NotAfter.Format(time.DateOnly))
	}
	return &c, Info{Names: leafNames(leaf), NotAfter: leaf.NotAfter}, nil
}

// SetCluster puts the cluster's certificates in service (replacing the
// previous set). One that does not parse is left out and logged: a
// broken object from a peer must not take the others down.
func (s *Store) SetCluster(pems []ClusterPEM) {
	var certs []*tls.Certificate
	var info []Info
	for _, p := range pems {
		c, in, err := Parse(p.Chain, p.Key, time.Now())
		if err != nil {
			s.log.Error("tls: cluster certificate not served", "name", p.Name, "err", err)
			continue
		}
		in.Cluster, in.Source = p.Name, p.Source
		certs, info = append(certs, c), append(info, in)
	}
	s.mu.Lock()
	same := slices.EqualFunc(s.clusterInfo, info, func(a, b Info) bool {
		return a.Cluster == b.Cluster && a.NotAfter.Equal(b.NotAfter) && slices.Equal(a.Names, b.Names)
	})
	s.cluster, s.clusterInfo = certs, info
	s.orderLocked()
	s.mu.Unlock()
	if same {
		return // the periodic reload found nothing new: nothing to say
	}
	for _, in := range info {
		s.log.Info("tls: cluster certificate in service", "names", in.Names, "not_after", in.NotAfter.Format(time.DateOnly), "object", in.Cluster)
	}
}

// stamp is what a reload compares to see whether a file changed.
type stamp struct {
	certMod, keyMod   time.Time
	certSize, keySize int64
}

// Open loads the configured pairs, or makes or loads the self-signed one.
func Open(opts Options) (*Store, error) {
	s := &Store{opts: opts, log: opts.Log, pairs: opts.Pairs}
	if s.log == nil {
		s.log = slog.New(slog.DiscardHandler)
	}
	if len(s.pairs) == 0 {
		p, made, err := ensureSelfSigned(opts.DataDir, opts.Hostname, time.Now())
		if err != nil {
			return nil, err
		}
		s.pairs = []Pair{p}
		if made {
			s.log.Warn("tls: no certificate configured; made a self-signed one (clients will not trust it: give --tls-cert/--tls-key)",
				"host", opts.Hostname, "cert", p.Cert)
		} else {
			s.log.Warn("tls: no certificate configured; serving the self-signed one", "cert", p.Cert)
		}
	}
	certs, stamps, info, err := loadAll(s.pairs, len(opts.Pairs) == 0)
	if err != nil {
		return nil, err
	}
	s.certs, s.stamps, s.info = certs, stamps, info
	s.orderLocked()
	for _, in := range info {
		s.log.Info("tls: certificate in service", "names", in.Names, "not_after", in.NotAfter.Format(time.DateOnly), "file", in.CertFile)
	}
	return s, nil
}

// cipherSuites are the TLS 1.2 suites offered: only AEAD with forward
// secrecy (Mozilla's "intermediate" profile). Go's defaults also offer
// ECDHE with AES-CBC and SHA-1, which testssl.sh lists as obsolete. TLS 1.3
// suites are not configurable and all AEAD.
var cipherSuites = []uint16{
	tls.TLS_ECDHE_ECDSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_RSA_WITH_AES_128_GCM_SHA256,
	tls.TLS_ECDHE_ECDSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_RSA_WITH_AES_256_GCM_SHA384,
	tls.TLS_ECDHE_ECDSA_WITH_CHACHA20_POLY1305_SHA256,
	tls.TLS_ECDHE_RSA_WITH_CHACHA20_POLY1305_SHA256,
}

// Config returns the TLS settings of every listener: TLS 1.2 and 1.3, AEAD
// suites with forward secrecy only, the certificate chosen per handshake by
// SNI. Session tickets are on (Go's default), so a returning client resumes
// without a full handshake.
func (s *Store) Config() *tls.Config {
	return &tls.Config{
		MinVersion:     tls.VersionTLS12,
		CipherSuites:   cipherSuites,
		GetCertificate: s.getCertificate,
	}
}

func (s *Store) getCertificate(hello *tls.ClientHelloInfo) (*tls.Certificate, error) {
	s.mu.RLock()
	certs := s.serving
	s.mu.RUnlock()
	if c := Choose(certs, hello); c != nil {
		return c, nil
	}
	return nil, errors.New("tls: no certificate in service")
}

// Choose picks the certificate for a handshake: the first that covers the
// name the client asked for and that it can use (its signature schemes and
// curves), else the first of all, the default.
func Choose(certs []*tls.Certificate, hello *tls.ClientHelloInfo) *tls.Certificate {
	if len(certs) == 0 {
		return nil
	}
	if hello.ServerName != "" {
		for _, c := range certs {
			if c.Leaf != nil && c.Leaf.VerifyHostname(hello.ServerName) == nil && hello.SupportsCertificate(c) == nil {
				return c
			}
		}
	}
	return certs[0]
}

// Info lists the certificates in service.
func (s *Store) Info() []Info {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return slices.Clone(s.servingInfo)
}

// Reload re-reads every pair whose files changed (or all, if force). A
// pair that fails to load keeps its previous certificate, and the error
// says which file and why.
func (s *Store) Reload(force bool) error {
	s.mu.RLock()
	old := s.stamps
	s.mu.RUnlock()
	changed := force
	for i, p := range s.pairs {
		st, err := stat(p)
		if err != nil || st != old[i] {
			changed = true
		}
	}
	if !changed {
		return nil
	}
	certs, stamps, info, err := loadAll(s.pairs, len(s.opts.Pairs) == 0)
	if err != nil {
		s.log.Error("tls: reload failed; the previous certificates stay in service", "err", err)
		return err
	}
	s.mu.Lock()
	s.certs, s.stamps, s.info = certs, stamps, info
	s.orderLocked()
	s.mu.Unlock()
	for _, in := range info {
		s.log.Info("tls: certificate reloaded", "names", in.Names, "not_after", in.NotAfter.Format(time.DateOnly), "file", in.CertFile)
	}
	return nil
}

// Watch reloads changed files every interval until ctx ends. A
// self-signed certificate near its end is made again.
func (s *Store) Watch(ctx context.Context, interval time.Duration) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		if len(s.opts.Pairs) == 0 {
			if _, made, err := ensureSelfSigned(s.opts.DataDir, s.opts.Hostname, time.Now()); err != nil {
				s.log.Error("tls: renewing the self-signed certificate failed", "err", err)
			} else if made {
				s.log.Warn("tls: self-signed certificate made again (the old one was near its end)")
			}
		}
		s.Reload(false)
	}
}

func stat(p Pair) (stamp, error) {
	ci, err := os.Stat(p.Cert)
	if err != nil {
		return stamp{}, err
	}
	ki, err := os.Stat(p.Key)
	if err != nil {
		return stamp{}, err
	}
	return stamp{certMod: ci.ModTime(), keyMod: ki.ModTime(), certSize: ci.Size(), keySize: ki.Size()}, nil
}

func loadAll(pairs []Pair, selfSigned bool) ([]*tls.Certificate, []stamp, []Info, error) {
	var (
		certs  []*tls.Certificate
		stamps []stamp
		info   []Info
	)
	for _, p := range pairs {
		st, err := stat(p)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("tls certificate %s: %w", p.Cert, err)
		}
		c, err := tls.LoadX509KeyPair(p.Cert, p.Key)
		if err != nil {
			return nil, nil, nil, fmt.Errorf("tls certificate %s with key %s: %w", p.Cert, p.Key, err)
		}
		leaf := c.Leaf
		if leaf == nil {
			return nil, nil, nil, fmt.Errorf("tls certificate %s: no leaf certificate", p.Cert)
		}
		certs = append(certs, &c)
		stamps = append(stamps, st)
		info = append(info, Info{Names: leafNames(leaf), NotAfter: leaf.NotAfter, SelfSigned: selfSigned, CertFile: p.Cert})
	}
	return certs, stamps, info, nil
}

// leafNames lists the names a certificate covers: its DNS names and IP
// addresses, or its common name when it has neither.
func leafNames(leaf *x509.Certificate) []string {
	names := slices.Clone(leaf.DNSNames)
	for _, ip := range leaf.IPAddresses {
		names = append(names, ip.String())
	}
	if len(names) == 0 && leaf.Subject.CommonName != "" {
		names = []string{leaf.Subject.CommonName}
	}
	return names
}

// ensureSelfSigned returns the self-signed pair of a data directory,
// making it when it is missing, unreadable or within selfSignedRenew of
// its end. made says whether it was made now.
func ensureSelfSigned(dataDir, host string, now time.Time) (Pair, bool, error) {
	dir := filepath.Join(dataDir, SelfSignedDir)
	p := Pair{Cert: filepath.Join(dir, "selfsigned.crt"), Key: filepath.Join(dir, "selfsigned.key")}
	if c, err := tls.LoadX509KeyPair(p.Cert, p.Key); err == nil && c.Leaf != nil && now.Add(selfSignedRenew).Before(c.Leaf.NotAfter) {
		return p, false, nil
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return p, false, fmt.Errorf("tls: self-signed certificate directory %s: %w", dir, err)
	}
	certPEM, keyPEM, err := SelfSigned(host, now, selfSignedValidity)
	if err != nil {
		return p, false, err
	}
	// Key first, 0600, and each file written whole before it is renamed
	// into place, so a crash leaves either the old pair or the new one.
	if err := writeAtomic(p.Key, keyPEM, 0o600); err != nil {
		return p, false, err
	}
	if err := writeAtomic(p.Cert, certPEM, 0o644); err != nil {
		return p, false, err
	}
	return p, true, nil
}

// SelfSigned makes a certificate and its key (PEM) for host, localhost
// and the loopback addresses, valid from now for validity.
func SelfSigned(host string, now time.Time, validity time.Duration) (certPEM, keyPEM []byte, err error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: generating a key: %w", err)
	}
	serial, err := rand.Int(rand.Reader, new(big.Int).Lsh(big.NewInt(1), 126))
	if err != nil {
		return nil, nil, fmt.Errorf("tls: generating a serial number: %w", err)
	}
	names := []string{"localhost"}
	if host != "" && host != "localhost" {
		names = append([]string{host}, names...)
	}
	tmpl := &x509.Certificate{
		SerialNumber:          serial,
		Subject:               pkix.Name{CommonName: names[0], Organization: []string{"Quill self-signed"}},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(validity),
		KeyUsage:              x509.KeyUsageDigitalSignature,
		ExtKeyUsage:           []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		BasicConstraintsValid: true,
		DNSNames:              names,
		IPAddresses:           []net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: signing the self-signed certificate: %w", err)
	}
	kder, err := x509.MarshalPKCS8PrivateKey(key)
	if err != nil {
		return nil, nil, fmt.Errorf("tls: encoding the key: %w", err)
	}
	return pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: der}),
		pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: kder}), nil
}

func writeAtomic(path string, data []byte, mode os.FileMode) error {
	tmp := path + ".tmp"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, mode)
	if err != nil {
		return fmt.Errorf("tls: writing %s: %w", path, err)
	}
	_, err = f.Write(data)
	if err == nil {
		// fsync before the rename: a crash must not leave an empty key
		// under the final name.
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		os.Remove(tmp)
		return fmt.Errorf("tls: writing %s: %w", path, err)
	}
	return nil
}

// IsLoopback reports whether a connection comes from this machine's
// loopback, where a password in clear crosses no network.
func IsLoopback(addr net.Addr) bool {
	var ip net.IP
	switch a := addr.(type) {
	case *net.TCPAddr:
		ip = a.IP
	default:
		host, _, err := net.SplitHostPort(addr.String())
		if err != nil {
			return false
		}
		ip = net.ParseIP(host)
	}
	return ip != nil && ip.IsLoopback()
}

// Listener wraps l so that every connection it accepts speaks TLS (RFC 8314
// implicit TLS). Each connection starts with a deadline of timeout for its
// handshake, which the protocol server's own deadlines then replace; the
// handshake itself runs on the connection's first read or write, on the
// session's goroutine, so a slow client does not hold up Accept.
func Listener(l net.Listener, cfg *tls.Config, timeout time.Duration) net.Listener {
	return &listener{Listener: l, cfg: cfg, timeout: timeout}
}

type listener struct {
	net.Listener
	cfg     *tls.Config
	timeout time.Duration
}

func (l *listener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(l.timeout))
	return tls.Server(c, l.cfg), nil
}

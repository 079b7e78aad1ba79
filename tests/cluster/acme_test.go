package cluster_test

import (
	"crypto/x509"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/tlscert"
)

// pebbleValidity is the lifetime of the certificates the test CA issues:
// short, so a renewal (at a third of the lifetime left) happens within the
// test.
const pebbleValidity = 45 * time.Second

// startPebble runs Let's Encrypt's test CA, Pebble (scripts/test-deps.sh
// installs it), on free loopback ports. Its documented test switch
// PEBBLE_VA_ALWAYS_VALID skips the challenge validation (the names of the
// test do not resolve to the nodes). It returns the directory URL and the
// PEM file of the certificate Pebble's HTTPS presents.
func startPebble(t *testing.T) (dirURL, caFile string) {
	bin, err := exec.LookPath("pebble")
	if err != nil {
		gopath, _ := exec.Command("go", "env", "GOPATH").Output()
		bin = filepath.Join(strings.TrimSpace(string(gopath)), "bin", "pebble")
		if _, err := os.Stat(bin); err != nil {
			fatalf(t, "pebble (the ACME test CA) is not installed: go install github.com/letsencrypt/pebble/v2/cmd/pebble@v2.10.1 (scripts/test-deps.sh does)")
		}
	}
	dir := t.TempDir()
	certPEM, keyPEM, err := tlscert.SelfSigned("localhost", time.Now(), time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	caFile = filepath.Join(dir, "pebble-https.pem")
	os.WriteFile(caFile, certPEM, 0o644)
	os.WriteFile(filepath.Join(dir, "pebble-https.key"), keyPEM, 0o600)
	listen := freeAddr(t)
	cfg := map[string]any{"pebble": map[string]any{
		"listenAddress": listen, "managementListenAddress": freeAddr(t),
		"certificate": caFile, "privateKey": filepath.Join(dir, "pebble-https.key"),
		"httpPort": 5002, "tlsPort": 5001, "ocspResponderURL": "", "externalAccountBindingRequired": false,
		"profiles": map[string]any{"default": map[string]any{"description": "short-lived, for the test",
			"validityPeriod": int(pebbleValidity / time.Second)}},
	}}
	b, _ := json.Marshal(cfg)
	cfgFile := filepath.Join(dir, "pebble.json")
	os.WriteFile(cfgFile, b, 0o644)
	logf, _ := os.Create(filepath.Join(dir, "pebble.log"))
	cmd := exec.Command(bin, "-config", cfgFile)
	cmd.Env = append(os.Environ(), "PEBBLE_VA_ALWAYS_VALID=1", "PEBBLE_VA_NOSLEEP=1", "PEBBLE_WFE_NONCEREJECT=0")
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Kill()
		cmd.Wait()
		if t.Failed() {
			out, _ := os.ReadFile(logf.Name())
			t.Logf("pebble log:\n%s", tail(string(out), 40))
		}
	})
	waitFor(t, "pebble to listen", 20*time.Second, func() bool {
		c, err := servedCertTLS(listen)
		return err == nil && c != nil
	})
	return "https://" + listen + "/dir", caFile
}

// TestACMECertificateForTheCluster: with --acme-email, one node of the
// cluster orders the certificate from a real ACME CA (Pebble), every node
// serves it, and it is renewed before it ends (issue 11, item 3).
func TestACMECertificateForTheCluster(t *testing.T) {
	// Beside the island tests, after the package's other tests: it mostly
	// waits on Pebble's challenges, and CI's time is short. The only
	// ACME test: Pebble's fixed challenge port is its alone.
	t.Parallel()
	dirURL, caFile := startPebble(t)
	const name = "mail.acme.test"
	nodes := startClusterWith(t, 3, "--acme-email", "postmaster@acme.test", "--acme-directory", dirURL,
		"--acme-domains", name, "--acme-http", "127.0.0.1:0", "--acme-ca", caFile)
	issued := func(n *Node) *x509.Certificate {
		raw, err := servedCert(n.Addrs["imap"], name)
		if err != nil {
			return nil
		}
		c, err := x509.ParseCertificate(raw)
		if err != nil || !strings.Contains(c.Issuer.CommonName, "Pebble") {
			return nil
		}
		return c
	}
	var first *x509.Certificate
	waitFor(t, "the ACME certificate on the first node", 60*time.Second, func() bool { first = issued(nodes[0]); return first != nil })
	for _, n := range nodes[1:] {
		waitFor(t, "the same certificate on node "+n.ID, 15*time.Second, func() bool {
			c := issued(n)
			return c != nil && c.SerialNumber.Cmp(first.SerialNumber) == 0
		})
	}
	if !slicesHas(first.DNSNames, name) {
		fatalf(t, "certificate names %v, want %s", first.DNSNames, name)
	}
	// Renewal: a new certificate before the first one ends, on every node.
	for _, n := range nodes {
		waitFor(t, "a renewed certificate on node "+n.ID, 2*pebbleValidity, func() bool {
			c := issued(n)
			return c != nil && c.SerialNumber.Cmp(first.SerialNumber) != 0
		})
	}
	if time.Now().After(first.NotAfter) {
		errorf(t, "renewed only after the first certificate ended (%s)", first.NotAfter)
	}
	// One node ordered: the one ranked highest for the name.
	var orderers []string
	for _, n := range nodes {
		if strings.Contains(n.Stderr(), "acme: ordering a certificate") {
			orderers = append(orderers, n.ID)
		}
	}
	if len(orderers) != 1 {
		fatalf(t, "nodes that ordered: %v, want exactly one", orderers)
	}
}

func slicesHas(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

package core

import (
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// awayDir is a data directory of a node last alive an hour ago, with a
// store, an id, members it knows, a token and a certificate.
func awayDir(t *testing.T) string {
	dir := t.TempDir()
	for _, f := range []string{knownFile, "admin.token", "node.id", "store/000001.log", "tls/selfsigned.key"} {
		p := filepath.Join(dir, f)
		os.MkdirAll(filepath.Dir(p), 0o700)
		if err := os.WriteFile(p, []byte("x"), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	old := time.Now().Add(-time.Hour).Format(time.RFC3339)
	if err := os.WriteFile(filepath.Join(dir, aliveFile), []byte(old), 0o600); err != nil {
		t.Fatal(err)
	}
	return dir
}

// A node of a cluster away too long rejoins without its hard state but
// keeps what is not the cluster's: known members, the admin token, its TLS
// certificate. The old hard state is moved aside, not deleted.
func TestRenewalKeepsTokenCertificateAndMembers(t *testing.T) {
	dir := awayDir(t)
	if err := renewIfAway(dir, time.Minute, true, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	for f, kept := range map[string]bool{knownFile: true, "admin.token": true, "tls/selfsigned.key": true,
		"node.id": false, "store": false, aliveFile: false} {
		_, err := os.Stat(filepath.Join(dir, f))
		if (err == nil) != kept {
			t.Errorf("%s: kept %v, want %v", f, err == nil, kept)
		}
	}
	entries, _ := os.ReadDir(dir)
	var aside string
	for _, e := range entries {
		if strings.HasPrefix(e.Name(), awayPrefix) {
			aside = filepath.Join(dir, e.Name())
		}
	}
	if _, err := os.Stat(filepath.Join(aside, "store", "000001.log")); aside == "" || err != nil {
		t.Fatalf("the old store was not moved aside (%q): %v", aside, err)
	}
}

// A node with no peers keeps its mail however long it was off: nobody else
// holds a copy, and nobody made updates it missed.
func TestNoRenewalWithoutPeers(t *testing.T) {
	dir := awayDir(t)
	os.Remove(filepath.Join(dir, knownFile))
	if hasPeers(dir, "127.0.0.1:7946", nil) || hasPeers(dir, "", []string{"127.0.0.1:7947"}) {
		t.Fatal("a node with no known members or no gossip address has peers")
	}
	if err := renewIfAway(dir, time.Minute, hasPeers(dir, "", nil), slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(filepath.Join(dir, "store", "000001.log")); err != nil {
		t.Fatalf("a single node's store after a long absence: %v", err)
	}
	// A remembered member that does not answer (the cluster shrank to
	// this node) is no peer; one that takes connections is.
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	dead, _ := net.Listen("tcp", "127.0.0.1:0")
	deadAddr := dead.Addr().String()
	dead.Close()
	os.WriteFile(filepath.Join(dir, knownFile), []byte(deadAddr+"\n"), 0o600)
	if hasPeers(dir, "127.0.0.1:7946", nil) {
		t.Fatal("a remembered member that is gone counts as a peer")
	}
	os.WriteFile(filepath.Join(dir, knownFile), []byte(deadAddr+"\n"+l.Addr().String()+"\n"), 0o600)
	if !hasPeers(dir, "127.0.0.1:7946", nil) {
		t.Fatal("a node whose remembered member answers has no peers")
	}
	l.Close()
}

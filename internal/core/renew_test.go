package core

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// A node away too long loses its hard state but keeps what is not the
// cluster's: known members, the admin token, its TLS certificate.
func TestRenewalKeepsTokenCertificateAndMembers(t *testing.T) {
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
	if err := renewIfAway(dir, time.Minute, slog.New(slog.DiscardHandler)); err != nil {
		t.Fatal(err)
	}
	for f, kept := range map[string]bool{knownFile: true, "admin.token": true, "tls/selfsigned.key": true,
		"node.id": false, "store": false, aliveFile: false} {
		_, err := os.Stat(filepath.Join(dir, f))
		if (err == nil) != kept {
			t.Errorf("%s: kept %v, want %v", f, err == nil, kept)
		}
	}
}

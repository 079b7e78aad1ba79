package tlscert

import (
	"crypto/tls"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

func TestSelfSignedIsMadeOnceWithAPrivateKey(t *testing.T) {
	dir := t.TempDir()
	s, err := Open(Options{DataDir: dir, Hostname: "mx.example.org"})
	if err != nil {
		t.Fatal(err)
	}
	info := s.Info()
	if len(info) != 1 || !info[0].SelfSigned || info[0].Names[0] != "mx.example.org" {
		t.Fatalf("info = %+v, want one self-signed certificate for mx.example.org", info)
	}
	key := filepath.Join(dir, SelfSignedDir, "selfsigned.key")
	st, err := os.Stat(key)
	if err != nil {
		t.Fatal(err)
	}
	if st.Mode().Perm() != 0o600 {
		t.Errorf("key mode %v, want 0600", st.Mode().Perm())
	}
	before, _ := os.ReadFile(key)
	if _, err := Open(Options{DataDir: dir, Hostname: "mx.example.org"}); err != nil {
		t.Fatal(err)
	}
	after, _ := os.ReadFile(key)
	if string(before) != string(after) {
		t.Error("a second start made a new self-signed key instead of keeping the first")
	}
}

func TestSelfSignedNearItsEndIsMadeAgain(t *testing.T) {
	dir := t.TempDir()
	now := time.Now()
	_, made, err := ensureSelfSigned(dir, "h", now.Add(-selfSignedValidity+selfSignedRenew-time.Hour))
	if err != nil || !made {
		t.Fatalf("first: made %v, err %v", made, err)
	}
	if _, made, err = ensureSelfSigned(dir, "h", now); err != nil || !made {
		t.Fatalf("a certificate %v from its end was kept (made %v, err %v)", selfSignedRenew-time.Hour, made, err)
	}
	if _, made, _ = ensureSelfSigned(dir, "h", now); made {
		t.Fatal("a fresh certificate was made again")
	}
}

// writePair writes a self-signed pair for host into dir.
func writePair(t *testing.T, dir, name, host string) Pair {
	t.Helper()
	c, k, err := SelfSigned(host, time.Now(), 24*time.Hour)
	if err != nil {
		t.Fatal(err)
	}
	p := Pair{Cert: filepath.Join(dir, name+".crt"), Key: filepath.Join(dir, name+".key")}
	if err := os.WriteFile(p.Cert, c, 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(p.Key, k, 0o600); err != nil {
		t.Fatal(err)
	}
	return p
}

func serves(t *testing.T, s *Store, sni string) string {
	t.Helper()
	c, err := s.getCertificate(&tls.ClientHelloInfo{ServerName: sni,
		SignatureSchemes: []tls.SignatureScheme{tls.ECDSAWithP256AndSHA256}, SupportedVersions: []uint16{tls.VersionTLS13}})
	if err != nil {
		t.Fatal(err)
	}
	return c.Leaf.DNSNames[0]
}

func TestSNIChoosesTheCertificateOfTheName(t *testing.T) {
	dir := t.TempDir()
	a := writePair(t, dir, "a", "mail.a.example")
	b := writePair(t, dir, "b", "mail.b.example")
	s, err := Open(Options{Pairs: []Pair{a, b}})
	if err != nil {
		t.Fatal(err)
	}
	for sni, want := range map[string]string{"mail.b.example": "mail.b.example", "mail.a.example": "mail.a.example",
		"": "mail.a.example", "other.example": "mail.a.example"} {
		if got := serves(t, s, sni); got != want {
			t.Errorf("SNI %q: served %s, want %s", sni, got, want)
		}
	}
}

func TestReloadTakesNewFilesAndKeepsTheOldOnError(t *testing.T) {
	dir := t.TempDir()
	p := writePair(t, dir, "a", "old.example")
	s, err := Open(Options{Pairs: []Pair{p}})
	if err != nil {
		t.Fatal(err)
	}
	writePair(t, dir, "a", "new.example")
	// Make the change visible even on a file system with coarse times.
	later := time.Now().Add(2 * time.Second)
	os.Chtimes(p.Cert, later, later)
	if err := s.Reload(false); err != nil {
		t.Fatal(err)
	}
	if got := serves(t, s, ""); got != "new.example" {
		t.Fatalf("after a change on disk: served %s, want new.example", got)
	}
	if err := os.WriteFile(p.Cert, []byte("not a certificate"), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := s.Reload(true); err == nil {
		t.Fatal("a broken certificate file loaded without an error")
	}
	if got := serves(t, s, ""); got != "new.example" {
		t.Fatalf("after a broken file: served %s, want the previous new.example", got)
	}
}

func TestOpenNamesTheBrokenFile(t *testing.T) {
	dir := t.TempDir()
	p := Pair{Cert: filepath.Join(dir, "missing.crt"), Key: filepath.Join(dir, "missing.key")}
	_, err := Open(Options{Pairs: []Pair{p}})
	if err == nil || !strings.Contains(err.Error(), "missing.crt") {
		t.Fatalf("err = %v, want one naming missing.crt", err)
	}
}

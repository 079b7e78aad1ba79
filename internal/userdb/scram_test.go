package userdb

import (
	"bytes"
	"testing"

	"github.com/xdg-go/scram"
)

func TestDeriveSCRAM(t *testing.T) {
	// SASLprep maps the soft hyphen to nothing (RFC 4013 §2.2), as a
	// SCRAM client does before deriving its proof.
	s, err := DeriveSCRAM("I\u00adX")
	if err != nil {
		t.Fatal(err)
	}
	sc, err := ParseSCRAM(s)
	if err != nil {
		t.Fatal(err)
	}
	if sc.Iters != SCRAMIterations || len(sc.Salt) != scramSaltLen {
		t.Errorf("factors %d, salt of %d bytes", sc.Iters, len(sc.Salt))
	}
	cl, _ := scram.SHA256.NewClient("", "IX", "")
	want, _ := cl.GetStoredCredentialsWithError(sc.KeyFactors)
	if !bytes.Equal(want.StoredKey, sc.StoredKey) || !bytes.Equal(want.ServerKey, sc.ServerKey) {
		t.Error("keys are not those a client derives from the prepared password")
	}
	if again, _ := DeriveSCRAM("I\u00adX"); again == s {
		t.Error("two derivations share a salt")
	}
	if _, err := DeriveSCRAM(""); err == nil {
		t.Error("empty password accepted")
	}
	for _, bad := range []string{"", "SCRAM-SHA-1$4096:AA==$AA==:AA==", "SCRAM-SHA-256$10:AA==$AA==:AA==",
		"SCRAM-SHA-256$4096:AA==$AA==", "SCRAM-SHA-256$4096:!!$AA==:AA==", "SCRAM-SHA-256$4096:AA=="} {
		if _, err := ParseSCRAM(bad); err == nil {
			t.Errorf("ParseSCRAM(%q) accepted", bad)
		}
	}
}

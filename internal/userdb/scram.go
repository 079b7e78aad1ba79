package userdb

import (
	"crypto/rand"
	"encoding/base64"
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/xdg-go/scram"
	"github.com/xdg-go/stringprep"
)

// SCRAM-SHA-256 (RFC 7677) keys are derived when a password is set, so a
// SCRAM login needs neither the password nor an argon2id check: the server
// keeps StoredKey and ServerKey, which prove a client's knowledge of the
// password without revealing it.
//
// SCRAMIterations is the PBKDF2 count: RFC 7677 §4 asks for at least 4096,
// which is what Dovecot and most clients use; twice that costs a client a
// few milliseconds per login and an offline attacker who stole the keys
// twice as much. Clients refuse counts far above the RFC's minimum, so it
// is not raised further (argon2id remains the password's main protection).
const (
	SCRAMIterations = 8192
	scramSaltLen    = 16
)

// scramScheme prefixes the stored form (RFC 5803):
// SCRAM-SHA-256$<iterations>:<salt>$<StoredKey>:<ServerKey>, base64.
const scramScheme = "SCRAM-SHA-256"

// DeriveSCRAM returns the SCRAM-SHA-256 keys of a password in RFC 5803
// form, with a new random salt. The password is normalised with SASLprep
// as clients do (RFC 5802 §2.2); one SASLprep refuses (unassigned code
// points) is used as given, which is what clients that skip SASLprep send.
func DeriveSCRAM(pw string) (string, error) {
	if pw == "" {
		return "", errors.New("password is empty")
	}
	if len(pw) > maxPasswordLen {
		return "", fmt.Errorf("password longer than %d bytes", maxPasswordLen)
	}
	if prepped, err := stringprep.SASLprep.Prepare(pw); err == nil {
		pw = prepped
	}
	salt := make([]byte, scramSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	// The user name does not enter the keys; NewClientUnprepped because
	// the password was prepared above.
	cl, err := scram.SHA256.NewClientUnprepped("", pw, "")
	if err != nil {
		return "", err
	}
	sc, err := cl.GetStoredCredentialsWithError(scram.KeyFactors{Salt: string(salt), Iters: SCRAMIterations})
	if err != nil {
		return "", err
	}
	std := base64.StdEncoding
	return fmt.Sprintf("%s$%d:%s$%s:%s", scramScheme, SCRAMIterations, std.EncodeToString(salt),
		std.EncodeToString(sc.StoredKey), std.EncodeToString(sc.ServerKey)), nil
}

// ParseSCRAM reads keys stored by DeriveSCRAM.
func ParseSCRAM(s string) (scram.StoredCredentials, error) {
	var out scram.StoredCredentials
	scheme, rest, ok := strings.Cut(s, "$")
	if !ok || scheme != scramScheme {
		return out, errors.New("stored SCRAM keys: unknown format")
	}
	factors, keys, ok := strings.Cut(rest, "$")
	if !ok {
		return out, errors.New("stored SCRAM keys: missing keys")
	}
	iters, salt, ok := strings.Cut(factors, ":")
	n, err := strconv.Atoi(iters)
	if !ok || err != nil || n < 4096 {
		return out, fmt.Errorf("stored SCRAM keys: bad iteration count %q", iters)
	}
	stored, server, ok := strings.Cut(keys, ":")
	if !ok {
		return out, errors.New("stored SCRAM keys: missing server key")
	}
	std := base64.StdEncoding
	rawSalt, err1 := std.DecodeString(salt)
	storedKey, err2 := std.DecodeString(stored)
	serverKey, err3 := std.DecodeString(server)
	if err := errors.Join(err1, err2, err3); err != nil {
		return out, fmt.Errorf("stored SCRAM keys: bad base64: %w", err)
	}
	out.Salt, out.Iters, out.StoredKey, out.ServerKey = string(rawSalt), n, storedKey, serverKey
	return out, nil
}

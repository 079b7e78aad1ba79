package userdb

import (
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"strings"

	"golang.org/x/crypto/argon2"
	"golang.org/x/crypto/bcrypt"
)

// Argon2id parameters: OWASP's 2023 minimum for argon2id (19 MiB, 2
// iterations, 1 lane). Logins are also cached by the user manager, so the
// cost is paid once per password change, not once per POP3/IMAP session.
const (
	argonMemoryKiB = 19 * 1024
	argonTime      = 2
	argonThreads   = 1
	argonKeyLen    = 32
	argonSaltLen   = 16
)

// maxPasswordLen bounds the work an attacker can make us do per attempt.
const maxPasswordLen = 1024

// ErrPasswordMismatch is returned by CheckPassword for a wrong password.
var ErrPasswordMismatch = errors.New("password mismatch")

var b64 = base64.RawStdEncoding

// HashPassword returns the argon2id hash of pw in PHC string format.
func HashPassword(pw string) (string, error) {
	if pw == "" {
		return "", errors.New("password is empty")
	}
	if len(pw) > maxPasswordLen {
		return "", fmt.Errorf("password longer than %d bytes", maxPasswordLen)
	}
	salt := make([]byte, argonSaltLen)
	if _, err := rand.Read(salt); err != nil {
		return "", err
	}
	sum := argon2.IDKey([]byte(pw), salt, argonTime, argonMemoryKiB, argonThreads, argonKeyLen)
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s",
		argon2.Version, argonMemoryKiB, argonTime, argonThreads, b64.EncodeToString(salt), b64.EncodeToString(sum)), nil
}

// CheckPassword verifies pw against a stored argon2id or bcrypt hash.
func CheckPassword(hash, pw string) error {
	if len(pw) > maxPasswordLen {
		return ErrPasswordMismatch
	}
	if strings.HasPrefix(hash, "$2") {
		if err := bcrypt.CompareHashAndPassword([]byte(hash), []byte(pw)); err != nil {
			return ErrPasswordMismatch
		}
		return nil
	}
	parts := strings.Split(hash, "$")
	if len(parts) != 6 || parts[1] != "argon2id" {
		return errors.New("stored password hash: unknown format")
	}
	var version int
	if _, err := fmt.Sscanf(parts[2], "v=%d", &version); err != nil || version != argon2.Version {
		return fmt.Errorf("stored password hash: unsupported argon2 version %q", parts[2])
	}
	var m uint32
	var t uint32
	var p uint8
	if _, err := fmt.Sscanf(parts[3], "m=%d,t=%d,p=%d", &m, &t, &p); err != nil {
		return fmt.Errorf("stored password hash: bad parameters %q", parts[3])
	}
	salt, err := b64.DecodeString(parts[4])
	if err != nil {
		return fmt.Errorf("stored password hash: bad salt: %w", err)
	}
	want, err := b64.DecodeString(parts[5])
	if err != nil {
		return fmt.Errorf("stored password hash: bad key: %w", err)
	}
	got := argon2.IDKey([]byte(pw), salt, t, m, p, uint32(len(want)))
	if subtle.ConstantTimeCompare(got, want) != 1 {
		return ErrPasswordMismatch
	}
	return nil
}

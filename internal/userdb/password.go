package userdb

import (
	"context"
	"crypto/rand"
	"crypto/subtle"
	"encoding/base64"
	"errors"
	"fmt"
	"runtime"
	"strings"
	"sync/atomic"

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

// ErrBusy is returned by CheckPassword when more checks wait than
// maxHashWaiters: a temporary failure, for the client to try again later.
var ErrBusy = errors.New("too many password checks at once")

// Each argon2id check holds argonMemoryKiB (19 MiB) for its duration, so
// checks run at most hashSlots at a time (one per core, at most 8: more
// would not finish sooner), and at most maxHashWaiters wait for a slot: a
// flood of wrong passwords costs a bounded 19 MiB × slots, not 19 MiB per
// connection (an abuse run took a node from 97 MB to 1.97 GB with 100).
const maxHashWaiters = 256

var (
	hashSlots   = make(chan struct{}, min(runtime.GOMAXPROCS(0), 8))
	hashWaiting atomic.Int64
)

// acquireHash takes a slot for one hash computation; release it with
// releaseHash.
func acquireHash(ctx context.Context) error {
	select {
	case hashSlots <- struct{}{}:
		return nil
	default:
	}
	if hashWaiting.Add(1) > maxHashWaiters {
		hashWaiting.Add(-1)
		return ErrBusy
	}
	defer hashWaiting.Add(-1)
	select {
	case hashSlots <- struct{}{}:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("waiting to check a password: %w", ctx.Err())
	}
}

func releaseHash() { <-hashSlots }

var b64 = base64.RawStdEncoding

// HashPassword returns the argon2id hash of pw in PHC string format. It
// takes a slot like a check (each holds 19 MiB, and more at once than
// slots finish no sooner: an import of 1,000 users 4 at a time took a
// node's RSS to 230 MB), but waits for it however many wait: it is called
// for an administrator's change, not by a client.
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
	hashSlots <- struct{}{}
	defer releaseHash()
	sum := argon2.IDKey([]byte(pw), salt, argonTime, argonMemoryKiB, argonThreads, argonKeyLen)
	return fmt.Sprintf("$argon2id$v=%d$m=%d,t=%d,p=%d$%s$%s",
		argon2.Version, argonMemoryKiB, argonTime, argonThreads, b64.EncodeToString(salt), b64.EncodeToString(sum)), nil
}

// CheckPassword verifies pw against a stored argon2id or bcrypt hash. It
// waits for a slot (see hashSlots) until ctx ends, or fails at once with
// ErrBusy when too many wait.
func CheckPassword(ctx context.Context, hash, pw string) error {
	if len(pw) > maxPasswordLen {
		return ErrPasswordMismatch
	}
	if err := acquireHash(ctx); err != nil {
		return err
	}
	defer releaseHash()
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

package userdb

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/store"
	"golang.org/x/crypto/bcrypt"
)

func TestPasswordHash(t *testing.T) {
	h, err := HashPassword("s3cret")
	if err != nil {
		t.Fatal(err)
	}
	if err := CheckPassword(t.Context(), h, "s3cret"); err != nil {
		t.Fatalf("right password rejected: %v", err)
	}
	if err := CheckPassword(t.Context(), h, "S3cret"); !errors.Is(err, ErrPasswordMismatch) {
		t.Fatalf("wrong password: got %v", err)
	}
	h2, _ := HashPassword("s3cret")
	if h == h2 {
		t.Fatal("two hashes of one password are equal: salt not random")
	}
	bc, _ := bcrypt.GenerateFromPassword([]byte("old"), bcrypt.MinCost)
	if err := CheckPassword(t.Context(), string(bc), "old"); err != nil {
		t.Fatalf("bcrypt hash rejected: %v", err)
	}
	if _, err := HashPassword(""); err == nil {
		t.Fatal("empty password accepted")
	}
}

func TestProfilesScanByBucket(t *testing.T) {
	st, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer st.Close()
	db := New(st)
	users := []string{"alice@example.org", "bob@example.org", "carol@example.net"}
	for _, u := range users {
		if err := db.Put(&Profile{Address: u, PasswordHash: "x", Created: time.Now()}); err != nil {
			t.Fatal(err)
		}
	}
	p, err := db.Get("ALICE@example.org")
	if err != nil || p.Address != "alice@example.org" {
		t.Fatalf("get: %v %v", p, err)
	}
	b := cluster.Bucket("bob@example.org")
	var got []string
	if err := db.Scan(int(b), func(p *Profile) error { got = append(got, p.Address); return nil }); err != nil {
		t.Fatal(err)
	}
	for _, a := range got {
		if cluster.Bucket(a) != b {
			t.Fatalf("scan of bucket %d returned %s from bucket %d", b, a, cluster.Bucket(a))
		}
	}
	if len(got) == 0 {
		t.Fatal("bucket scan missed bob")
	}
	n := 0
	db.Scan(-1, func(*Profile) error { n++; return nil })
	if n != 3 {
		t.Fatalf("full scan found %d profiles, want 3", n)
	}
}

// Users and aliases get stricter addresses than those already stored:
// nothing that walks out of a folder when mail is exported, a domain name
// that is one.
func TestValidateNewAddress(t *testing.T) {
	for _, ok := range []string{"a@b.c", "first.last+tag@example.org", "x_y-z=1@mail.example-1.org", "Bob@Example.ORG"} {
		if err := ValidateNewAddress(ok); err != nil {
			t.Errorf("%s rejected: %v", ok, err)
		}
	}
	for _, bad := range []string{"../x@example.org", "a/b@example.org", ".a@example.org", "a.@example.org", "a..b@example.org",
		"a%b@example.org", "a'b@example.org", "a@-x.org", "a@x_y.org", "a@x..org", "", "a b@x.org", "a@b@c"} {
		if err := ValidateNewAddress(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestValidateAddress(t *testing.T) {
	for _, ok := range []string{"a@b.c", "first.last+tag@example.org"} {
		if err := ValidateAddress(ok); err != nil {
			t.Errorf("%s rejected: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "nodomain", "@x.org", "a@", "a b@x.org", "a@x..org", "a@b@c", "<a@b>"} {
		if err := ValidateAddress(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// At most cap(hashSlots) checks run at once, at most maxHashWaiters wait,
// and the rest fail at once with ErrBusy (a flood of logins must not cost
// 19 MiB each).
func TestPasswordChecksAreBounded(t *testing.T) {
	h, err := HashPassword("pw")
	if err != nil {
		t.Fatal(err)
	}
	// Fill every slot and the waiting room by hand, then check.
	for range cap(hashSlots) {
		hashSlots <- struct{}{}
	}
	hashWaiting.Add(maxHashWaiters)
	err = CheckPassword(t.Context(), h, "pw")
	hashWaiting.Add(-maxHashWaiters)
	if !errors.Is(err, ErrBusy) {
		t.Fatalf("with every slot taken and %d waiting: %v, want ErrBusy", maxHashWaiters, err)
	}
	// With room to wait, a check waits for a slot until its context ends.
	ctx, cancel := context.WithTimeout(t.Context(), 50*time.Millisecond)
	defer cancel()
	if err := CheckPassword(ctx, h, "pw"); !errors.Is(err, context.DeadlineExceeded) {
		t.Fatalf("waiting for a slot: %v, want the context's deadline", err)
	}
	for range cap(hashSlots) {
		<-hashSlots
	}
	if err := CheckPassword(t.Context(), h, "pw"); err != nil {
		t.Fatalf("with the slots free: %v", err)
	}
	if n := hashWaiting.Load(); n != 0 {
		t.Fatalf("%d waiters left counted", n)
	}
}

package imap

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/quillmail/quill/internal/domain"
	"github.com/quillmail/quill/internal/userdb"
)

// TestQuota drives QUOTA (RFC 9208) and the limits behind it: GETQUOTAROOT
// and GETQUOTA report the user's one root, APPEND and COPY past a limit
// are NO [OVERQUOTA], MOVE is not refused, SETQUOTA is the
// administrator's, and delivery's recipient check refuses a user at the
// limit.
func TestQuota(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	body := func(i int) string { return fmt.Sprintf("Subject: q%d\r\n\r\n%s\r\n", i, strings.Repeat("x", 500)) }
	e.deliver(body(1))
	e.deliver(body(2))
	r := e.raw(true) // logged in before the limits are set: they apply at once
	if err := e.core.Users.SetQuota(ctx, testUser, 4096, 3); err != nil {
		t.Fatal(err)
	}

	caps := strings.Join(r.ok("CAPABILITY"), " ")
	for _, c := range []string{" QUOTA", "QUOTA=RES-STORAGE", "QUOTA=RES-MESSAGE"} {
		if !strings.Contains(caps, c) {
			t.Fatalf("CAPABILITY lacks %s: %s", c, caps)
		}
	}
	u := r.ok("GETQUOTAROOT INBOX")
	if len(u) != 2 || u[0] != `* QUOTAROOT INBOX ""` || u[1] != `* QUOTA "" (STORAGE 2 4 MESSAGE 2 3)` {
		t.Fatalf("GETQUOTAROOT: %q", u)
	}
	if u := r.ok(`GETQUOTA ""`); len(u) != 1 || u[0] != `* QUOTA "" (STORAGE 2 4 MESSAGE 2 3)` {
		t.Fatalf("GETQUOTA: %q", u)
	}
	for cmd, want := range map[string]string{
		`GETQUOTA "other"`:             "NO [NONEXISTENT]",
		`GETQUOTAROOT Nowhere`:         "NO [NONEXISTENT]",
		`SETQUOTA "" (STORAGE 100000)`: "NO [NOPERM]",
		`SETQUOTA "" STORAGE`:          "BAD",
		`GETQUOTA`:                     "BAD",
	} {
		if _, st := r.cmd(cmd); !strings.HasPrefix(st, want) {
			t.Errorf("%s: %s, want %s", cmd, st, want)
		}
	}

	// A third message fits; a fourth passes the message limit.
	appendMsg := func(text string) string {
		tag := r.send(fmt.Sprintf("APPEND INBOX {%d+}\r\n%s", len(text), text))
		_, st := r.until(tag)
		return st
	}
	if st := appendMsg(body(3)); !strings.HasPrefix(st, "OK") {
		t.Fatalf("APPEND within quota: %s", st)
	}
	if st := appendMsg(body(4)); !strings.HasPrefix(st, "NO [OVERQUOTA]") {
		t.Fatalf("APPEND past the message limit: %s", st)
	}
	r.ok("SELECT INBOX")
	if _, st := r.cmd("COPY 1 Archive"); !strings.HasPrefix(st, "NO [OVERQUOTA]") {
		t.Fatalf("COPY past the limit: %s", st)
	}
	r.ok("MOVE 1 Archive") // the root holds as much as before
	if _, err := e.core.Proxy.CheckRecipient(ctx, testUser, 0); !errors.Is(err, userdb.ErrOverQuota) {
		t.Fatalf("recipient check at the limit: %v", err)
	}

	// Room for one message again, but not for one of 3.5 KB (4 KB limit, 1 KB used).
	r.ok(`STORE 1 +FLAGS (\Deleted)`)
	r.ok("EXPUNGE")
	if _, err := e.core.Proxy.CheckRecipient(ctx, testUser, 0); err != nil {
		t.Fatalf("recipient check with room: %v", err)
	}
	if _, err := e.core.Proxy.CheckRecipient(ctx, testUser, 3500); !errors.Is(err, userdb.ErrOverQuota) {
		t.Fatalf("recipient check of a message larger than the room: %v", err)
	}
	if st := appendMsg(body(5) + strings.Repeat("y", 3500)); !strings.HasPrefix(st, "NO [OVERQUOTA]") {
		t.Fatalf("APPEND past the storage limit: %s", st)
	}

	// No limits: no quota root.
	if err := e.core.Users.SetQuota(ctx, testUser, 0, 0); err != nil {
		t.Fatal(err)
	}
	if u := r.ok("GETQUOTAROOT INBOX"); len(u) != 1 || u[0] != "* QUOTAROOT INBOX" {
		t.Fatalf("GETQUOTAROOT without limits: %q", u)
	}
	if _, st := r.cmd(`GETQUOTA ""`); !strings.HasPrefix(st, "NO [NONEXISTENT]") {
		t.Fatalf("GETQUOTA without limits: %s", st)
	}
	if err := e.core.Users.SetQuota(ctx, testUser, -1, 0); err == nil {
		t.Fatal("a negative limit was taken")
	}
}

// TestDomainQuota: APPEND and COPY that would take the user's domain past
// the domain's quota (issue 14, the same limit delivery holds to) are NO
// [OVERQUOTA] even when the user has no quota of their own; MOVE is not.
func TestDomainQuota(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	body := func(i int) string { return fmt.Sprintf("Subject: d%d\r\n\r\nhello\r\n", i) }
	e.deliver(body(1))
	e.deliver(body(2))
	dom := userdb.Domain(testUser)
	if _, err := e.core.AddDomain(ctx, domain.Domain{Name: dom, QuotaMessages: 2}); err != nil {
		t.Fatal(err)
	}
	r := e.raw(true)
	appendMsg := func(text string) string {
		tag := r.send(fmt.Sprintf("APPEND INBOX {%d+}\r\n%s", len(text), text))
		_, st := r.until(tag)
		return st
	}
	if st := appendMsg(body(3)); !strings.HasPrefix(st, "NO [OVERQUOTA]") || !strings.Contains(st, "domain") {
		t.Fatalf("APPEND past the domain's message limit: %s", st)
	}
	r.ok("SELECT INBOX")
	if _, st := r.cmd("COPY 1 Archive"); !strings.HasPrefix(st, "NO [OVERQUOTA]") {
		t.Fatalf("COPY past the domain's limit: %s", st)
	}
	r.ok("MOVE 1 Archive")
	if _, err := e.core.SetDomain(ctx, domain.Domain{Name: dom, QuotaMessages: 10}); err != nil {
		t.Fatal(err)
	}
	if st := appendMsg(body(4)); !strings.HasPrefix(st, "OK") {
		t.Fatalf("APPEND after the domain's limit was raised: %s", st)
	}
}

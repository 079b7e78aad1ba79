package cassandra_test

// quill migrate (internal/storemigrate) against the real Cassandra of this
// package's test binary (cassandratest.Main in store_test.go), so the copy
// costs no second Cassandra start: a native node with real mail, made
// through an in-process core (delivery through its proxy, IMAP flag
// changes, a move, an expunge, a deleted user), copied into Cassandra,
// verified, copied back into a new data directory, and read back through
// a core opened on it.

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"reflect"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cassandra/cassandratest"
	"github.com/quillmail/quill/internal/core"
	"github.com/quillmail/quill/internal/domain"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/proxy"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/storemigrate"
)

const migratePass = "pw-migrate"

func openNode(t *testing.T, dir string) (*core.Core, *proxy.IMAPStore) {
	t.Helper()
	c, err := core.New(core.Options{DataDir: dir, Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	return c, &proxy.IMAPStore{P: c.Proxy}
}

// seen is a message as a client reads it back.
type seen struct {
	UID    uint32
	Flags  string
	ModSeq uint64
	Date   int64 // ms: Cassandra's precision
	Size   int64
	Body   []byte
}

type seenBox struct {
	Name          string
	UIDValidity   uint32
	UIDNext       uint32
	HighestModSeq uint64
	Subscribed    bool
	Messages      []seen
}

// readAll reads users' mailboxes and messages through the node's IMAP
// store, as a client would see them.
func readAll(t *testing.T, s *proxy.IMAPStore, users []string) map[string][]seenBox {
	t.Helper()
	ctx := context.Background()
	out := map[string][]seenBox{}
	for _, u := range users {
		boxes, err := s.Mailboxes(ctx, u)
		if err != nil {
			t.Fatalf("user %s: %v", u, err)
		}
		for _, mb := range boxes {
			sb := seenBox{Name: mb.Name, UIDValidity: mb.UIDValidity, UIDNext: mb.UIDNext, HighestModSeq: mb.HighestModSeq,
				Subscribed: mb.Subscribed}
			msgs, err := s.Messages(ctx, u, mb.ID)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range msgs {
				body, err := s.Body(ctx, u, m.ID)
				if err != nil {
					t.Fatalf("user %s mailbox %s uid %d: %v", u, mb.Name, m.UID, err)
				}
				fl := slices.Clone(m.Flags)
				slices.Sort(fl)
				sb.Messages = append(sb.Messages, seen{UID: m.UID, Flags: strings.Join(fl, " "), ModSeq: m.ModSeq,
					Date: m.Date.UnixMilli(), Size: m.Size, Body: body})
			}
			out[u] = append(out[u], sb)
		}
	}
	return out
}

func message(n int, size int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(&b, "From: sender@example.net\r\nTo: someone@example.org\r\nSubject: message %d\r\nMessage-ID: <%d-%d@example.net>\r\n\r\n", n, n, time.Now().UnixNano())
	for b.Len() < size {
		fmt.Fprintf(&b, "line %d of message %d, to make it %d bytes\r\n", b.Len(), n, size)
	}
	return b.Bytes()
}

func randomName() string {
	b := make([]byte, 4)
	rand.Read(b)
	return hex.EncodeToString(b)
}

func inboxOf(t *testing.T, s *proxy.IMAPStore, user, name string) *mailbox.Mailbox {
	t.Helper()
	mb, err := s.Mailbox(context.Background(), user, name)
	if err != nil {
		t.Fatal(err)
	}
	return mb
}

func uidsOf(t *testing.T, s *proxy.IMAPStore, user string, mb *mailbox.Mailbox) []uint32 {
	t.Helper()
	msgs, err := s.Messages(context.Background(), user, mb.ID)
	if err != nil {
		t.Fatal(err)
	}
	var uids []uint32
	for _, m := range msgs {
		uids = append(uids, m.UID)
	}
	return uids
}

func migrate(t *testing.T, from, to string, verifyOnly bool) (*storemigrate.Result, string, error) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
	defer cancel()
	var out bytes.Buffer
	res, err := storemigrate.Run(ctx, from, to, storemigrate.Options{VerifyOnly: verifyOnly, Out: &out})
	return res, out.String(), err
}

// TestMigrateRoundTrip: a node's mail, and a stale replica of it that
// missed an expunge and a flag change (a copy of its data directory taken
// before them: a second node of a cluster that was down), copied into
// Cassandra, verified, copied again (nothing changes), copied back into a
// new data directory that a node then serves identically.
func TestMigrateRoundTrip(t *testing.T) {
	hosts := cassandratest.Hosts(t)
	ctx := context.Background()
	run := randomName()
	url := "cassandra://" + strings.Join(hosts, ",") + "/quill_migrate_" + run + "?rf=1&write=QUORUM&read=QUORUM"
	alice, bob, carol := "alice-"+run+"@example.org", "bob-"+run+"@example.org", "carol-"+run+"@example.org"
	users := []string{alice, bob}

	base := t.TempDir()
	dir, stale := filepath.Join(base, "n1"), filepath.Join(base, "n1-stale")
	c, s := openNode(t, dir)
	for _, u := range []string{alice, bob, carol} {
		if _, err := c.Users.AddUser(ctx, u, migratePass); err != nil {
			t.Fatal(err)
		}
	}
	for i := range 6 {
		if err := c.Proxy.Deliver(ctx, []string{alice}, message(i, 2000+i*500)); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.Proxy.Deliver(ctx, []string{bob}, message(99, 1500)); err != nil {
		t.Fatal(err)
	}
	// One body above Cassandra's 1 MiB chunk.
	if err := c.Proxy.Deliver(ctx, []string{alice, bob}, message(100, 1<<20+12345)); err != nil {
		t.Fatal(err)
	}
	if err := c.Proxy.Deliver(ctx, []string{alice}, message(102, 2500)); err != nil {
		t.Fatal(err)
	}
	if err := c.Proxy.Deliver(ctx, []string{bob, carol}, message(101, 3000)); err != nil {
		t.Fatal(err)
	}
	if _, err := s.CreateMailbox(ctx, alice, "Work/2026", ""); err != nil {
		t.Fatal(err)
	}
	in := inboxOf(t, s, alice, "INBOX")
	uids := uidsOf(t, s, alice, in)
	if _, _, err := s.StoreFlags(ctx, alice, in.ID, uids[:3], mailbox.FlagsAdd, []string{`\Seen`, "$Important"}, 0); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Copy(ctx, alice, in.ID, uids[3:5], "Work/2026", true); err != nil {
		t.Fatal(err)
	}
	if err := s.SetSubscribed(ctx, alice, "Junk", false); err != nil {
		t.Fatal(err)
	}
	// A mailbox the stale replica keeps and the node deletes later: a
	// copy after the delete removes it from Cassandra.
	if _, err := s.CreateMailbox(ctx, alice, "Tmp", ""); err != nil {
		t.Fatal(err)
	}
	if _, err := s.Copy(ctx, alice, in.ID, uids[5:6], "Tmp", false); err != nil {
		t.Fatal(err)
	}
	if err := c.Users.DeleteUser(ctx, carol); err != nil {
		t.Fatal(err)
	}
	// Clusterwide objects (a domain, and a deleted one's tombstone) and
	// an outbound queue entry (the core runs no queue runner: it stays).
	kept, dropped := "kept-"+run+".example", "dropped-"+run+".example"
	for _, d := range []string{kept, dropped} {
		if _, err := c.AddDomain(ctx, domain.Domain{Name: d}); err != nil {
			t.Fatal(err)
		}
	}
	if err := c.DeleteDomain(ctx, dropped); err != nil {
		t.Fatal(err)
	}
	queued := message(300, 4000)
	qid, err := c.Queue.Add(ctx, alice, alice, []string{"someone@remote.example"}, queued, 1, replica.One)
	if err != nil {
		t.Fatal(err)
	}
	c.Close()
	if err := os.CopyFS(stale, os.DirFS(dir)); err != nil {
		t.Fatal(err)
	}
	c, s = openNode(t, dir)
	in = inboxOf(t, s, alice, "INBOX")
	uids = uidsOf(t, s, alice, in)
	// The first and the last message go (UIDNEXT then lies past the
	// messages), then a flag change; bob's last change is an expunge
	// (HIGHESTMODSEQ past the messages').
	if _, err := s.Expunge(ctx, alice, in.ID, []uint32{uids[0], uids[len(uids)-1]}); err != nil {
		t.Fatal(err)
	}
	if _, _, err := s.StoreFlags(ctx, alice, in.ID, uids[1:2], mailbox.FlagsRemove, []string{`\Seen`}, 0); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteMailbox(ctx, alice, "Tmp"); err != nil {
		t.Fatal(err)
	}
	bin := inboxOf(t, s, bob, "INBOX")
	if _, err := s.Expunge(ctx, bob, bin.ID, uidsOf(t, s, bob, bin)[:1]); err != nil {
		t.Fatal(err)
	}
	want := readAll(t, s, users)

	// A running node's directory is refused by name.
	_, _, err = migrate(t, dir, url, false)
	if err == nil || !strings.Contains(err.Error(), "data directory "+dir+" is in use by a running quill") {
		t.Fatalf("migrate from a running node's directory: %v", err)
	}
	c.Close()

	// First the stale replica alone, then the cluster (both): the newer
	// flags win and the expunged message goes, in Cassandra too.
	if _, out, err := migrate(t, stale, url, false); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, err := storemigrateOpen(t, url).St.MailboxByName(ctx, alice, "Tmp"); err != nil {
		t.Fatalf("mailbox Tmp from the stale replica: %v", err)
	}
	res, out, err := migrate(t, dir+","+stale, url, false)
	if err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	t.Logf("to Cassandra:\n%s", out)
	if res.Copied.Users != 2 || res.Copied.Deleted != 1 || res.Copied.Messages != 8 || res.Copied.Expunged != 3 ||
		res.Copied.Queue != 1 || res.Copied.Objects != 2 {
		t.Fatalf("copied %+v: want 2 users, 1 deleted, 8 messages, 3 expunged, 1 queue entry, 2 objects", res.Copied)
	}

	cs := storemigrateOpen(t, url)
	if _, err := cs.St.MailboxByName(ctx, alice, "Tmp"); !errors.Is(err, mailbox.ErrNoMailbox) {
		t.Fatalf("mailbox Tmp after the copy of its delete: %v", err)
	}
	before, err := cs.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if p, err := cs.St.Profile(ctx, carol); err != nil || !p.Deleted {
		t.Fatalf("deleted user in Cassandra: %+v, %v", p, err)
	}
	// Every mailbox's fence lies past everything copied.
	for _, u := range before.Users {
		for _, b := range u.Boxes {
			f, err := cs.St.Reservations(ctx, u.Profile.Address, b.Mailbox.UIDValidity)
			if err != nil {
				t.Fatal(err)
			}
			for _, m := range b.Messages {
				if m.UID >= f.UIDReserved || m.ModSeq > f.ModSeqReserved {
					t.Fatalf("user %s mailbox %s uid %d modseq %d: past the fence %+v", u.Profile.Address, b.Mailbox.Name, m.UID, m.ModSeq, f)
				}
			}
		}
	}

	// Again: nothing changes (the fences are not claimed again either).
	epochs := map[string]int64{}
	for _, u := range before.Users {
		for _, b := range u.Boxes {
			f, err := cs.St.Reservations(ctx, u.Profile.Address, b.Mailbox.UIDValidity)
			if err != nil {
				t.Fatal(err)
			}
			epochs[u.Profile.Address+" "+b.Mailbox.Name] = f.Epoch
		}
	}
	if _, out, err := migrate(t, dir+","+stale, url, false); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	after, err := cs.Snapshot(ctx)
	if err != nil {
		t.Fatal(err)
	}
	if !reflect.DeepEqual(before, after) {
		t.Fatal("a second copy changed Cassandra")
	}
	for _, u := range after.Users {
		for _, b := range u.Boxes {
			f, _ := cs.St.Reservations(ctx, u.Profile.Address, b.Mailbox.UIDValidity)
			if was := epochs[u.Profile.Address+" "+b.Mailbox.Name]; f.Epoch != was || was == 0 {
				t.Fatalf("user %s mailbox %s: fence epoch %d after a copy again, was %d", u.Profile.Address, b.Mailbox.Name, f.Epoch, was)
			}
		}
	}

	// The verify pass finds a message changed behind its back.
	in2, err := cs.St.MailboxByName(ctx, alice, "INBOX")
	if err != nil {
		t.Fatal(err)
	}
	msgs, err := cs.St.AllMessages(ctx, alice, in2.UIDValidity)
	if err != nil {
		t.Fatal(err)
	}
	m := msgs[0]
	// At the record's own stamp + 1 (a newer write), a flag the source
	// does not have.
	bump := m.Version
	bump.Clock++
	if err := cs.St.UpdateFlags(ctx, alice, in2.UIDValidity, m.UID, append(m.Flags, "$Tampered"), m.ModSeq, bump); err != nil {
		t.Fatal(err)
	}
	_, out, err = migrate(t, dir+","+stale, url, true)
	if !errors.Is(err, storemigrate.ErrDifferences) || !strings.Contains(out, fmt.Sprintf("uid %d: flags", m.UID)) {
		t.Fatalf("verify-only after a change: %v\n%s", err, out)
	}
	bump.Clock++
	if err := cs.St.UpdateFlags(ctx, alice, in2.UIDValidity, m.UID, m.Flags, m.ModSeq, bump); err != nil {
		t.Fatal(err)
	}

	// Back into a new data directory, served by a node.
	back := filepath.Join(base, "back")
	if _, out, err := migrate(t, url, back, false); err != nil {
		t.Fatalf("%v\n%s", err, out)
	}
	if _, _, err := migrate(t, url, back, false); err == nil || !strings.Contains(err.Error(), "not empty") {
		t.Fatalf("copy into a data directory in use: %v", err)
	}
	c2, s2 := openNode(t, back)
	defer c2.Close()
	got := readAll(t, s2, users)
	if !reflect.DeepEqual(got, want) {
		for _, u := range users {
			if !reflect.DeepEqual(got[u], want[u]) {
				t.Errorf("user %s after the round trip:\n%s\nwant\n%s", u, describe(got[u]), describe(want[u]))
			}
		}
		t.FailNow()
	}
	if _, err := c2.Proxy.Login(ctx, alice, migratePass); err != nil {
		t.Fatalf("login after the round trip: %v", err)
	}
	if _, err := c2.Proxy.Login(ctx, carol, migratePass); err == nil {
		t.Fatal("a deleted user came back")
	}
	if !c2.HasDomain(kept) || c2.HasDomain(dropped) {
		t.Fatalf("domains after the round trip: %s %v, %s (deleted) %v", kept, c2.HasDomain(kept), dropped, c2.HasDomain(dropped))
	}
	if e, ok, err := c2.Queue.Storage.Lookup(ctx, qid); !ok || err != nil || e.Deleted || e.From != alice || len(e.Recipients) != 1 {
		t.Fatalf("queue entry %s after the round trip: %+v %v %v", qid, e, ok, err)
	} else if b, err := c2.Queue.Storage.Body(ctx, qid); err != nil || !bytes.Equal(b, queued) {
		t.Fatalf("queued message after the round trip: %d bytes, %v", len(b), err)
	}
	// A new delivery takes a UID past every migrated one.
	if err := c2.Proxy.Deliver(ctx, []string{alice}, message(200, 1000)); err != nil {
		t.Fatal(err)
	}
	in3 := inboxOf(t, s2, alice, "INBOX")
	after3 := uidsOf(t, s2, alice, in3)
	last := after3[len(after3)-1]
	for _, b := range want[alice] {
		for _, m := range b.Messages {
			if b.Name == "INBOX" && m.UID >= last {
				t.Fatalf("new message got UID %d, not past migrated UID %d", last, m.UID)
			}
		}
	}
}

func describe(boxes []seenBox) string {
	var b strings.Builder
	for _, mb := range boxes {
		fmt.Fprintf(&b, "  %s v%d uidnext %d highestmodseq %d sub=%v\n", mb.Name, mb.UIDValidity, mb.UIDNext, mb.HighestModSeq, mb.Subscribed)
		for _, m := range mb.Messages {
			fmt.Fprintf(&b, "    uid %d flags (%s) modseq %d date %d size %d body %d bytes\n", m.UID, m.Flags, m.ModSeq, m.Date, m.Size, len(m.Body))
		}
	}
	return b.String()
}

// TestMigrateLarge (QUILL_MIGRATE_LARGE=N, make migrate-large): N messages
// of 4.7 KB (Porcupine's mean) over 10 users, delivered through a core,
// copied into Cassandra, copied again, and back into a new data directory;
// the times are logged for docs/benchmarks.md, not checked.
func TestMigrateLarge(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("QUILL_MIGRATE_LARGE"))
	if n <= 0 {
		t.Skip("set QUILL_MIGRATE_LARGE to a number of messages (make migrate-large)")
	}
	hosts := cassandratest.Hosts(t)
	ctx := context.Background()
	run := randomName()
	url := "cassandra://" + strings.Join(hosts, ",") + "/quill_migrate_large_" + run + "?rf=1"
	dir := filepath.Join(t.TempDir(), "n1")
	c, _ := openNode(t, dir)
	const users, senders = 10, 8
	var addrs []string
	for i := range users {
		a := fmt.Sprintf("large%d-%s@example.org", i, run)
		if _, err := c.Users.AddUser(ctx, a, migratePass); err != nil {
			t.Fatal(err)
		}
		addrs = append(addrs, a)
	}
	began := time.Now()
	errs := make(chan error, senders)
	for w := range senders {
		go func() {
			for i := w; i < n; i += senders {
				if err := c.Proxy.Deliver(ctx, []string{addrs[i%users]}, message(i, 4700)); err != nil {
					errs <- err
					return
				}
			}
			errs <- nil
		}()
	}
	for range senders {
		if err := <-errs; err != nil {
			t.Fatal(err)
		}
	}
	t.Logf("%d messages delivered in %s", n, time.Since(began).Round(time.Millisecond))
	c.Close()
	for _, step := range []struct{ what, from, to string }{
		{"to Cassandra", dir, url},
		{"to Cassandra again", dir, url},
		{"back into a new data directory", url, filepath.Join(t.TempDir(), "back")},
	} {
		began := time.Now()
		res, out, err := migrate(t, step.from, step.to, false)
		if err != nil {
			t.Fatalf("%s: %v\n%s", step.what, err, out)
		}
		t.Logf("%s: %d messages copied in %s, verified in %s (%s in all)", step.what, res.Copied.Messages,
			res.CopyTook.Round(time.Millisecond), res.VerifyTook.Round(time.Millisecond), time.Since(began).Round(time.Millisecond))
	}
}

func storemigrateOpen(t *testing.T, url string) *storemigrate.Cassandra {
	t.Helper()
	cs, err := storemigrate.OpenCassandra(context.Background(), url)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { cs.Close() })
	return cs
}

package imap

import (
	"context"
	"fmt"
	"regexp"
	"strconv"
	"strings"
	"testing"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/internal/writer"
)

func TestVanishedUIDs(t *testing.T) {
	all := imap.UIDSet{imap.UIDRange{Start: 1, Stop: 0}}
	for _, c := range []struct {
		set  imap.UIDSet
		have []uint32
		last uint32
		want string
	}{
		{all, []uint32{1, 2, 5}, 7, "3:4,6:7"},
		{all, nil, 0, ""},
		{all, []uint32{1, 2, 3}, 3, ""},
		{all, nil, 4, "1:4"},
		{imap.UIDSet{{Start: 10, Stop: 20}}, nil, 7, ""},        // all above what was given out
		{imap.UIDSet{{Start: 5, Stop: 0}}, []uint32{1}, 3, "3"}, // 5:* is 3:5
		{imap.UIDSet{{Start: 2, Stop: 2}, {Start: 4, Stop: 6}}, []uint32{4}, 9, "2,5:6"},
		{imap.UIDSet{{Start: 1, Stop: 4294967295}}, []uint32{2, 3, 4}, 4, "1"},
		{imap.UIDSet{{Start: 6, Stop: 8}, {Start: 1, Stop: 3}}, []uint32{2, 7}, 9, "1,3,6,8"},
	} {
		got := vanishedUIDs(c.set, c.have, c.last)
		s := ""
		if len(got) > 0 {
			s = got.String()
		}
		if s != c.want {
			t.Errorf("vanishedUIDs(%v, %v, %d) = %q, want %q", c.set, c.have, c.last, s, c.want)
		}
	}
}

var highestModSeq = regexp.MustCompile(`HIGHESTMODSEQ (\d+)`)

func modSeqOf(t *testing.T, lines []string) string {
	t.Helper()
	for _, l := range lines {
		if m := highestModSeq.FindStringSubmatch(l); m != nil {
			return m[1]
		}
	}
	t.Fatalf("no HIGHESTMODSEQ in %q", lines)
	return ""
}

// TestQResync drives RFC 7162 §3.2 over the wire: changes made in one
// session reach another as VANISHED and FETCH, on a new SELECT, in UID
// FETCH VANISHED and while selected.
func TestQResync(t *testing.T) {
	e := newEnv(t)
	for i := 1; i <= 5; i++ {
		e.deliver(fmt.Sprintf("Subject: m%d\r\n\r\nbody %d\r\n", i, i))
	}
	a := e.raw(true)
	if u := a.ok("CAPABILITY"); !has(u, " QRESYNC") {
		t.Fatalf("CAPABILITY: %q", u)
	}
	// QRESYNC parameters before ENABLE QRESYNC are BAD.
	if _, st := a.cmd("SELECT INBOX (QRESYNC (1 1))"); !strings.HasPrefix(st, "BAD") {
		t.Fatalf("SELECT QRESYNC before ENABLE: %s", st)
	}
	if u := a.ok("ENABLE QRESYNC"); !has(u, "* ENABLED QRESYNC") {
		t.Fatalf("ENABLE QRESYNC: %q", u)
	}
	sel := a.ok("SELECT INBOX")
	h0 := modSeqOf(t, sel)
	var v string
	for _, l := range sel {
		if m := regexp.MustCompile(`UIDVALIDITY (\d+)`).FindStringSubmatch(l); m != nil {
			v = m[1]
		}
	}

	// Another session: \Seen on 2, 3 and 4 expunged.
	b := e.raw(true)
	b.ok("SELECT INBOX")
	b.ok("UID STORE 2 +FLAGS (\\Seen)")
	b.ok("UID STORE 3:4 +FLAGS (\\Deleted)")
	if u := b.ok("UID EXPUNGE 3:4"); !has(u, "* 3 EXPUNGE") || has(u, "VANISHED") {
		t.Fatalf("EXPUNGE without QRESYNC: %q", u)
	}

	// The selected session hears VANISHED, not EXPUNGE, and the flag
	// change with UID and MODSEQ.
	u := a.ok("NOOP")
	if !has(u, "* VANISHED 3:4") || has(u, "EXPUNGE") || !has(u, "FETCH (UID 2 FLAGS (\\Seen") {
		t.Fatalf("NOOP after changes elsewhere: %q", u)
	}

	// UID FETCH VANISHED: what is gone, then what changed.
	u = a.ok("UID FETCH 1:* (FLAGS) (CHANGEDSINCE " + h0 + " VANISHED)")
	if len(u) != 2 || u[0] != "* VANISHED (EARLIER) 3:4" || !strings.Contains(u[1], "UID 2") {
		t.Fatalf("UID FETCH VANISHED: %q", u)
	}
	for _, c := range []string{
		"FETCH 1:* (FLAGS) (CHANGEDSINCE 1 VANISHED)", // not UID FETCH
		"UID FETCH 1:* (FLAGS) (VANISHED)",            // no CHANGEDSINCE
	} {
		if _, st := a.cmd(c); !strings.HasPrefix(st, "BAD") {
			t.Fatalf("%s: %s", c, st)
		}
	}

	// A new session resynchronises with what it knew.
	c := e.raw(true)
	c.ok("ENABLE QRESYNC")
	u = c.ok("SELECT INBOX (QRESYNC (" + v + " " + h0 + "))")
	if !has(u, "* VANISHED (EARLIER) 3:4") || !has(u, "* 2 FETCH (UID 2 FLAGS (\\Seen") || has(u, "UID 1 ") || has(u, "UID 5 ") {
		t.Fatalf("SELECT QRESYNC: %q", u)
	}
	// Known UIDs narrow both; a seq-match-data is accepted; SELECT of a
	// selected mailbox closes it first.
	u = c.ok("EXAMINE INBOX (QRESYNC (" + v + " " + h0 + " 1,4:5 (1:3 1,4:5)))")
	if !has(u, "* OK [CLOSED]") || !has(u, "* VANISHED (EARLIER) 4") || has(u, "3:4") || has(u, "FETCH") {
		t.Fatalf("EXAMINE QRESYNC with known UIDs: %q", u)
	}
	// Another UIDVALIDITY: nothing to resynchronise.
	other, _ := strconv.ParseUint(v, 10, 32)
	other = other%4000000000 + 1
	if u = c.ok(fmt.Sprintf("SELECT INBOX (QRESYNC (%d %s))", other, h0)); has(u, "VANISHED") || has(u, "FETCH") {
		t.Fatalf("SELECT QRESYNC of another UIDVALIDITY: %q", u)
	}
	for _, bad := range []string{"(QRESYNC (0 1))", "(QRESYNC (1))", "(QRESYNC (1 1 (1:2)))", "(QRESYNC (1 1 1:2 (1 2) x))"} {
		if _, st := c.cmd("SELECT INBOX " + bad); !strings.HasPrefix(st, "BAD") {
			t.Fatalf("SELECT INBOX %s: %s", bad, st)
		}
	}

	// Its own EXPUNGE and MOVE answer VANISHED too.
	c.ok("SELECT INBOX")
	c.ok("UID STORE 5 +FLAGS (\\Deleted)")
	tag := c.send("EXPUNGE")
	u, st := c.until(tag)
	if len(u) != 1 || u[0] != "* VANISHED 5" || !strings.HasPrefix(st, "OK [HIGHESTMODSEQ ") {
		t.Fatalf("EXPUNGE under QRESYNC: %q %s", u, st)
	}
	if got := modSeqOf(t, []string{st}); got == h0 {
		t.Fatalf("EXPUNGE's HIGHESTMODSEQ %s did not move", got)
	}
	c.ok("CREATE Moved")
	if u = c.ok("UID MOVE 1 Moved"); !has(u, "COPYUID") || !has(u, "* VANISHED 1") || has(u, "EXPUNGE") {
		t.Fatalf("MOVE under QRESYNC: %q", u)
	}
}

// TestHiddenDeliveryReachesSession: a delivery confirmed while an earlier
// allocation is still in flight is hidden (UIDs appear in order). The
// mailbox's UIDNEXT and HIGHESTMODSEQ stay below it meanwhile, so a
// session that synced then, or that STOREd since, still learns of it when
// it appears, and QRESYNC never reports its UID, or the one in flight, as
// gone.
func TestHiddenDeliveryReachesSession(t *testing.T) {
	e := newEnv(t)
	ctx := context.Background()
	e.deliver("Subject: one\r\n\r\n1\r\n")
	a := e.raw(true)
	a.ok("ENABLE QRESYNC")
	a.ok("SELECT INBOX")
	w := e.core.Proxy.Writers.For(testUser)
	held, err := w.Alloc(ctx, &writer.AllocRequest{User: testUser, Mailbox: "INBOX"})
	if err != nil {
		t.Fatal(err)
	}
	e.deliver("Subject: three\r\n\r\n3\r\n") // UID 3, hidden behind UID 2
	a.ok("NOOP")
	if u := a.ok("UID FETCH 1:* (FLAGS) (CHANGEDSINCE 1 VANISHED)"); has(u, "VANISHED") {
		t.Fatalf("UIDs in flight or hidden reported gone: %q", u)
	}
	if err := w.Confirm(ctx, &writer.ConfirmRequest{Place: held.Place, Cancel: true}); err != nil {
		t.Fatal(err)
	}
	u := a.ok(`STORE 1 +FLAGS (\Seen)`)
	u = append(u, a.ok("NOOP")...)
	if !has(u, "* 2 EXISTS") {
		t.Fatalf("the message that appeared was not announced: %q", u)
	}
	if u := a.ok("UID FETCH 1:* (FLAGS) (CHANGEDSINCE 1 VANISHED)"); !has(u, "* VANISHED (EARLIER) 2") || !has(u, "UID 3 ") {
		t.Fatalf("after the cancel: %q", u)
	}
}

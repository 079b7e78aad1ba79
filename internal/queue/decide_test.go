package queue

import (
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
)

var t0 = time.Date(2026, 11, 24, 10, 0, 0, 0, time.UTC)

func entry(rcpts ...string) *Entry {
	e := &Entry{ID: NewID(), From: "alice@example.org", Created: t0, Replicas: []cluster.NodeID{"n-b", "n-a"}}
	for _, r := range rcpts {
		e.Recipients = append(e.Recipients, Recipient{Address: r, State: Queued, NextTry: t0})
	}
	return e
}

func TestLeaderIsFirstLiveReplicaInSortedOrder(t *testing.T) {
	set := []cluster.NodeID{"n-c", "n-a", "n-b"}
	if got := Leader(set, map[cluster.NodeID]bool{"n-a": true, "n-b": true, "n-c": true}); got != "n-a" {
		t.Fatalf("leader %q, want n-a", got)
	}
	if got := Leader(set, map[cluster.NodeID]bool{"n-b": true, "n-c": true}); got != "n-b" {
		t.Fatalf("with n-a away: leader %q, want n-b", got)
	}
	if got := Leader(set, map[cluster.NodeID]bool{"n-x": true}); got != "" {
		t.Fatalf("no replica alive: leader %q, want none", got)
	}
}

func TestBackoffDoublesUpToItsCapWithJitter(t *testing.T) {
	base := 5 * time.Minute
	for attempts, want := range map[int]time.Duration{1: base, 2: 2 * base, 3: 4 * base, 4: 8 * base, 5: 12 * base, 40: 12 * base} {
		if got := Backoff(attempts, base, 0.5); got != want {
			t.Errorf("attempt %d: %v, want %v", attempts, got, want)
		}
		lo, hi := Backoff(attempts, base, 0), Backoff(attempts, base, 0.999999)
		if lo < want*8/10-time.Millisecond || hi > want*12/10 || lo >= hi {
			t.Errorf("attempt %d: jitter spans %v..%v around %v, want ±20%%", attempts, lo, hi, want)
		}
	}
}

func TestStepDeliveredFailedAndDeferred(t *testing.T) {
	e := entry("bob@a.example", "carol@a.example", "dave@b.example")
	now := t0.Add(time.Minute)
	Step(e, []Result{
		{Rcpt: "bob@a.example", Delivered: true, Code: 250, Text: "ok", Remote: "mx.a.example [192.0.2.1:25]"},
		{Rcpt: "carol@a.example", Permanent: true, Code: 550, Status: "5.1.1", Text: "no such user"},
		{Rcpt: "dave@b.example", Code: 451, Status: "4.7.1", Text: "greylisted"},
		{Rcpt: "nobody@else.example", Delivered: true},
	}, now, time.Minute, func() float64 { return 0.5 })
	r := e.Recipients
	if r[0].State != Delivered || r[0].Attempts != 1 || r[0].Remote == "" {
		t.Errorf("bob: %+v, want delivered after 1 attempt with its remote", r[0])
	}
	if r[1].State != Failed || r[1].LastReply != "550 5.1.1 no such user" || !r[1].NextTry.Equal(now) {
		t.Errorf("carol: %+v, want failed with the reply, due now for its DSN", r[1])
	}
	if r[2].State != Queued || !r[2].NextTry.Equal(now.Add(time.Minute)) || r[2].LastReply != "451 4.7.1 greylisted" {
		t.Errorf("dave: %+v, want queued again in 1m", r[2])
	}
	if due, ok := Due(e); !ok || !due.Equal(now) {
		t.Errorf("due %v %v, want now (a DSN is owed)", due, ok)
	}
	// A second result for a settled recipient changes nothing.
	Step(e, []Result{{Rcpt: "bob@a.example", Permanent: true, Code: 550}}, now, time.Minute, func() float64 { return 0 })
	if e.Recipients[0].State != Delivered {
		t.Errorf("a delivered recipient was changed by a later result: %+v", e.Recipients[0])
	}
	e.Recipients[1].State = Reported
	e.Recipients[2].State = Delivered
	if !Done(e) {
		t.Errorf("every recipient delivered or reported: entry not done")
	}
}

func TestExpireFailsWhatIsLeftAndKeepsTheLastReply(t *testing.T) {
	e := entry("bob@a.example", "carol@a.example")
	e.Recipients[0].State = Delivered
	e.Recipients[1].LastReply = "451 4.7.1 greylisted"
	if Expire(e, t0.Add(time.Hour), 2*time.Hour) {
		t.Fatal("expired before its lifetime")
	}
	if !Expire(e, t0.Add(2*time.Hour), 2*time.Hour) {
		t.Fatal("not expired at its lifetime")
	}
	if e.Recipients[0].State != Delivered || e.Recipients[1].State != Failed ||
		!strings.Contains(e.Recipients[1].LastReply, "451 4.7.1 greylisted") {
		t.Fatalf("after expiry: %+v", e.Recipients)
	}
}

func TestWarningOnceForASenderAfterItsTime(t *testing.T) {
	e := entry("bob@a.example")
	if NeedsWarning(e, t0.Add(3*time.Hour), 4*time.Hour) {
		t.Error("warned before 4h")
	}
	if !NeedsWarning(e, t0.Add(4*time.Hour), 4*time.Hour) {
		t.Error("not warned at 4h")
	}
	e.Warned = true
	if NeedsWarning(e, t0.Add(5*time.Hour), 4*time.Hour) {
		t.Error("warned twice")
	}
	e.Warned, e.From = false, ""
	if NeedsWarning(e, t0.Add(5*time.Hour), 4*time.Hour) {
		t.Error("a report about a report (null sender)")
	}
}

func TestDueRecipientsGroupByDomainInOrder(t *testing.T) {
	e := entry("a@X.example", "b@y.example", "c@x.example", "d@y.example", "e@z.example")
	e.Recipients[4].NextTry = t0.Add(time.Hour)
	e.Recipients[3].State = Delivered
	domains, by := DueRecipients(e, t0)
	if strings.Join(domains, ",") != "x.example,y.example" {
		t.Fatalf("domains %v", domains)
	}
	if strings.Join(by["x.example"], ",") != "a@X.example,c@x.example" || strings.Join(by["y.example"], ",") != "b@y.example" {
		t.Fatalf("groups %v", by)
	}
}

func TestMergeKeepsAnOperatorsRetryDuringAnAttempt(t *testing.T) {
	begun := entry("bob@a.example", "carol@b.example")
	done := begun.Clone()
	Step(done, []Result{{Rcpt: "bob@a.example", Code: 451, Text: "later"}}, t0, time.Hour, func() float64 { return 0.5 })
	cur := begun.Clone()
	cur.Recipients[1].NextTry = t0.Add(-time.Minute) // retry asked for carol meanwhile
	cur.Stamp.Clock++
	m := Merge(cur, begun, done)
	if m.Recipients[0].Attempts != 1 || m.Recipients[0].LastReply != "451 later" {
		t.Errorf("bob lost the attempt's outcome: %+v", m.Recipients[0])
	}
	if !m.Recipients[1].NextTry.Equal(t0.Add(-time.Minute)) {
		t.Errorf("carol's retry undone: %+v", m.Recipients[1])
	}
}

func TestValidID(t *testing.T) {
	if err := ValidID(NewID()); err != nil {
		t.Fatal(err)
	}
	for _, bad := range []string{"", "../x", strings.Repeat("A", 32), strings.Repeat("a", 31), strings.Repeat("g", 32)} {
		if ValidID(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

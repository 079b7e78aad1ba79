package island

import (
	"fmt"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// change is a table change from three islands to four, the usual case.
func change(t *testing.T) (cur, next Table) {
	t.Helper()
	cur, _ = Initial([]string{"a", "b", "c"})
	next, _, err := Rebalance(cur, equal("a", "b", "c", "d"), uniform(100), DefaultThreshold)
	if err != nil {
		t.Fatal(err)
	}
	return cur, next
}

func participants(t *testing.T, cur Table, ns ...string) map[string]*Participant {
	t.Helper()
	out := map[string]*Participant{}
	for _, n := range ns {
		p, err := NewParticipant(n, Record{Phase: Idle, Current: cur}, nil)
		if err != nil {
			t.Fatal(err)
		}
		out[n] = p
	}
	return out
}

func kinds(ms []Msg) string {
	var s []string
	for _, m := range ms {
		s = append(s, fmt.Sprintf("%s>%s", m.Kind, m.To))
	}
	return strings.Join(s, " ")
}

func mustStep(t *testing.T, step func(Msg) (Effects, error), m Msg) Effects {
	t.Helper()
	eff, err := step(m)
	if err != nil {
		t.Fatalf("%s from %s: %v", m.Kind, m.From, err)
	}
	return eff
}

func TestTwoPhaseCommit(t *testing.T) {
	cur, next := change(t)
	ps := participants(t, cur, "a", "b", "c", "d")
	c, eff, err := NewCoordinator("coord", cur, next, []string{"d", "c", "b", "a"})
	if err != nil {
		t.Fatal(err)
	}
	if got := kinds(eff.Send); got != "prepare>a prepare>b prepare>c prepare>d" || eff.Persist != nil {
		t.Fatalf("start: send %s, persist %v", got, eff.Persist)
	}
	var votes []Msg
	for _, m := range eff.Send {
		if m.Base != cur.Epoch() || m.Epoch != next.Epoch() || !m.Table.Equal(next) {
			t.Fatalf("prepare %+v does not carry the change", m)
		}
		pe := mustStep(t, ps[m.To].Step, m)
		if pe.Persist == nil || pe.Persist.Phase != Prepared || pe.Persist.Coordinator != "coord" || !pe.Persist.Proposal.Equal(next) {
			t.Fatalf("%s votes yes without persisting the proposal: %+v", m.To, pe.Persist)
		}
		if len(pe.Send) != 1 || pe.Send[0].Kind != Vote || !pe.Send[0].Yes {
			t.Fatalf("%s: %+v, want a yes vote", m.To, pe.Send)
		}
		votes = append(votes, pe.Send...)
	}
	for i, v := range votes {
		ce := mustStep(t, c.Step, v)
		if i < len(votes)-1 {
			if c.Phase() != Preparing || len(ce.Send) != 0 {
				t.Fatalf("after %d of 4 yes votes: phase %s, send %s", i+1, c.Phase(), kinds(ce.Send))
			}
			continue
		}
		if c.Phase() != Committed || ce.Persist == nil || ce.Persist.Phase != Committed || !ce.Persist.Proposal.Equal(next) {
			t.Fatalf("after every yes: phase %s, persist %+v", c.Phase(), ce.Persist)
		}
		if got := kinds(ce.Send); got != "commit>a commit>b commit>c commit>d" {
			t.Fatalf("commit sends %s", got)
		}
		for _, m := range ce.Send {
			pe := mustStep(t, ps[m.To].Step, m)
			if pe.Install == nil || !pe.Install.Equal(next) || pe.Persist.Phase != Idle || !pe.Persist.Current.Equal(next) {
				t.Fatalf("%s on commit: install %v, persist %+v", m.To, pe.Install, pe.Persist)
			}
			if c.Finished() {
				t.Fatal("finished before every Done")
			}
			mustStep(t, c.Step, pe.Send[0])
		}
	}
	if !c.Finished() {
		t.Fatal("not finished after every Done")
	}
	for n, p := range ps {
		if p.Phase() != Idle || !p.Current().Equal(next) {
			t.Fatalf("%s ends %s with %v", n, p.Phase(), p.Current())
		}
	}
}

// runUntilVotes delivers the Prepares and returns the votes, skipping the
// participants in skip (unreachable: their Prepare is lost).
func runUntilVotes(t *testing.T, ps map[string]*Participant, prepares []Msg, skip string) []Msg {
	var votes []Msg
	for _, m := range prepares {
		if m.To == skip {
			continue
		}
		votes = append(votes, mustStep(t, ps[m.To].Step, m).Send...)
	}
	return votes
}

func TestTwoPhaseAbortOnRefusal(t *testing.T) {
	cur, next := change(t)
	ps := participants(t, cur, "a", "b", "c")
	// c has already moved on: its table is newer than the proposal's base.
	newer, _ := New(cur.Epoch()+5, cur.Owners(), nil)
	ps["c"], _ = NewParticipant("c", Record{Phase: Idle, Current: newer}, nil)
	c, eff, _ := NewCoordinator("coord", cur, next, []string{"a", "b", "c"})
	votes := runUntilVotes(t, ps, eff.Send, "")
	var abort Effects
	for _, v := range votes {
		abort = mustStep(t, c.Step, v)
		if !v.Yes {
			break
		}
	}
	if c.Phase() != Aborted || !c.Finished() || !strings.Contains(c.Reason(), "island c refused: c has table epoch 6, the proposal replaces 1") {
		t.Fatalf("phase %s, reason %q", c.Phase(), c.Reason())
	}
	if abort.Persist != nil {
		t.Fatal("an abort is persisted: presumed abort needs no record")
	}
	if got := kinds(abort.Send); got != "abort>a abort>b" {
		t.Fatalf("abort sends %s, want the yes voters only", got)
	}
	for _, m := range abort.Send {
		pe := mustStep(t, ps[m.To].Step, m)
		if pe.Install != nil || pe.Persist == nil || pe.Persist.Phase != Idle || !pe.Persist.Current.Equal(cur) {
			t.Fatalf("%s on abort: %+v", m.To, pe)
		}
		if ps[m.To].Phase() != Idle || !ps[m.To].Current().Equal(cur) {
			t.Fatalf("%s after abort: %s %v", m.To, ps[m.To].Phase(), ps[m.To].Current())
		}
	}
	// A late query gets the outcome.
	if e := mustStep(t, c.Step, Msg{Kind: Query, From: "a", Epoch: next.Epoch()}); kinds(e.Send) != "abort>a" {
		t.Fatalf("query after abort: %s", kinds(e.Send))
	}
}

func TestTwoPhaseAbortOnUnreachable(t *testing.T) {
	cur, next := change(t)
	ps := participants(t, cur, "a", "b", "c")
	c, eff, _ := NewCoordinator("coord", cur, next, []string{"a", "b", "c"})
	votes := runUntilVotes(t, ps, eff.Send, "b")
	mustStep(t, c.Step, votes[0])
	ab := mustStep(t, c.Step, Msg{Kind: Unreachable, From: "b", Epoch: next.Epoch()})
	if c.Phase() != Aborted || c.Reason() != "island b unreachable" || kinds(ab.Send) != "abort>a abort>b abort>c" {
		t.Fatalf("unreachable b: phase %s, reason %q, send %s", c.Phase(), c.Reason(), kinds(ab.Send))
	}
	// c's yes arrives late and is answered with the outcome.
	if e := mustStep(t, c.Step, votes[1]); kinds(e.Send) != "abort>c" {
		t.Fatalf("late yes: %s", kinds(e.Send))
	}
}

func TestTwoPhaseAbortOnTimeout(t *testing.T) {
	cur, next := change(t)
	ps := participants(t, cur, "a", "b", "c", "d")
	c, eff, _ := NewCoordinator("coord", cur, next, []string{"a", "b", "c", "d"})
	votes := runUntilVotes(t, ps, eff.Send, "")
	mustStep(t, c.Step, votes[0])
	mustStep(t, c.Step, votes[2])
	mustStep(t, c.Step, Msg{Kind: Timeout, Epoch: next.Epoch()})
	if c.Phase() != Aborted || c.Reason() != "no vote in time from b, d" {
		t.Fatalf("timeout: phase %s, reason %q", c.Phase(), c.Reason())
	}
}

func TestTwoPhaseCommitRetriedUntilDone(t *testing.T) {
	cur, next := change(t)
	ps := participants(t, cur, "a", "b")
	c, eff, _ := NewCoordinator("coord", cur, next, []string{"a", "b"})
	var commit Effects
	for _, v := range runUntilVotes(t, ps, eff.Send, "") {
		commit = mustStep(t, c.Step, v)
	}
	// a hears the commit; b's is lost, and b is unreachable for a while.
	done := mustStep(t, ps["a"].Step, commit.Send[0]).Send[0]
	mustStep(t, c.Step, done)
	if e := mustStep(t, c.Step, Msg{Kind: Unreachable, From: "b", Epoch: next.Epoch()}); c.Phase() != Committed || len(e.Send) != 0 {
		t.Fatalf("unreachable after the decision: phase %s, send %s", c.Phase(), kinds(e.Send))
	}
	retry := mustStep(t, c.Step, Msg{Kind: Timeout, Epoch: next.Epoch()})
	if kinds(retry.Send) != "commit>b" {
		t.Fatalf("retry sends %s, want the commit to b only", kinds(retry.Send))
	}
	// A resent commit to a is harmless: a says Done again.
	if e := mustStep(t, ps["a"].Step, commit.Send[0]); kinds(e.Send) != "done>coord" || e.Install != nil {
		t.Fatalf("resent commit: %+v", e)
	}
	mustStep(t, c.Step, mustStep(t, ps["b"].Step, retry.Send[0]).Send[0])
	if !c.Finished() || !ps["b"].Current().Equal(next) {
		t.Fatal("b's Done did not finish the change")
	}
}

func TestTwoPhaseRestarts(t *testing.T) {
	cur, next := change(t)
	ps := participants(t, cur, "a", "b")
	c, eff, _ := NewCoordinator("coord", cur, next, []string{"a", "b"})
	var rec *Record
	var commit Effects
	var prepared Record
	for _, m := range eff.Send {
		pe := mustStep(t, ps[m.To].Step, m)
		if m.To == "b" {
			prepared = *pe.Persist
		}
		commit = mustStep(t, c.Step, pe.Send[0])
	}
	rec = commit.Persist
	// The coordinator crashes after logging the commit, before sending it.
	c2, eff2, err := RestoreCoordinator("coord", *rec, []string{"a", "b"})
	if err != nil || c2.Phase() != Committed || kinds(eff2.Send) != "commit>a commit>b" {
		t.Fatalf("restore: %v, send %s", err, kinds(eff2.Send))
	}
	// b crashes too, and comes back prepared: in doubt, it asks.
	b2, err := NewParticipant("b", prepared, nil)
	if err != nil || b2.Phase() != Prepared {
		t.Fatalf("participant restore: %v", err)
	}
	q := mustStep(t, b2.Step, Msg{Kind: Timeout})
	if len(q.Send) != 1 || q.Send[0].Kind != Query || q.Send[0].To != "coord" || q.Send[0].Epoch != next.Epoch() {
		t.Fatalf("in doubt: %+v", q.Send)
	}
	ans := mustStep(t, c2.Step, q.Send[0])
	if kinds(ans.Send) != "commit>b" {
		t.Fatalf("answer to the query: %s", kinds(ans.Send))
	}
	if e := mustStep(t, b2.Step, ans.Send[0]); e.Install == nil || !e.Install.Equal(next) {
		t.Fatal("b did not install the table after its query")
	}
	if _, _, err := RestoreCoordinator("coord", Record{Phase: Aborted, Proposal: next}, []string{"a"}); err == nil {
		t.Fatal("restored an aborted coordinator")
	}
}

func TestTwoPhasePresumedAbort(t *testing.T) {
	cur, next := change(t)
	ps := participants(t, cur, "a")
	_, eff, _ := NewCoordinator("coord", cur, next, []string{"a"})
	mustStep(t, ps["a"].Step, eff.Send[0])
	// The coordinator dies before deciding; its node comes back with no
	// record, and answers a's query by presumption.
	q := mustStep(t, ps["a"].Step, Msg{Kind: Timeout}).Send[0]
	ans := Presume("coord", q)
	if ans.Kind != Abort || ans.To != "a" || ans.Epoch != next.Epoch() {
		t.Fatalf("presumed answer %+v", ans)
	}
	mustStep(t, ps["a"].Step, ans)
	if ps["a"].Phase() != Idle || !ps["a"].Current().Equal(cur) {
		t.Fatal("a did not drop the proposal")
	}
}

func TestTwoPhaseParticipantGuards(t *testing.T) {
	cur, next := change(t)
	p := participants(t, cur, "a")["a"]
	prep := Msg{Kind: Prepare, From: "coord", To: "a", Epoch: next.Epoch(), Base: cur.Epoch(), Table: next}
	mustStep(t, p.Step, prep)
	// A resent Prepare gets the same yes, without a new record.
	if e := mustStep(t, p.Step, prep); e.Persist != nil || !e.Send[0].Yes {
		t.Fatalf("resent prepare: %+v", e)
	}
	// A rival proposal is refused while prepared.
	rival := prep
	rival.From = "other"
	if e := mustStep(t, p.Step, rival); e.Send[0].Yes || !strings.Contains(e.Send[0].Reason, "prepared for epoch 2 from coord") {
		t.Fatalf("rival prepare: %+v", e.Send)
	}
	// A commit for an epoch never prepared is an error, not an install.
	q := participants(t, cur, "q")["q"]
	if _, err := q.Step(Msg{Kind: Commit, From: "coord", Epoch: next.Epoch()}); err == nil {
		t.Fatal("committed an unprepared epoch")
	}
	// Learning a committed table at least as new resolves the doubt.
	if e := mustStep(t, p.Step, Msg{Kind: Learn, Table: next}); p.Phase() != Idle || e.Install == nil || e.Persist.Phase != Idle {
		t.Fatalf("learn: %s, %+v", p.Phase(), e)
	}
	if e := mustStep(t, p.Step, Msg{Kind: Learn, Table: cur}); e.Install != nil {
		t.Fatal("learnt an older table")
	}
	// The wiring's check refuses tables naming unknown islands.
	check := func(t Table) error { return t.Validate([]string{"a", "b", "c"}) }
	r, _ := NewParticipant("r", Record{Phase: Idle, Current: cur}, check)
	prep.To = "r"
	if e := mustStep(t, r.Step, prep); e.Send[0].Yes || !strings.Contains(e.Send[0].Reason, "unknown islands d") {
		t.Fatalf("check: %+v", e.Send)
	}
	malformed := prep
	malformed.Table = Table{}
	if e := mustStep(t, r.Step, malformed); e.Send[0].Yes {
		t.Fatal("voted yes on an empty table")
	}
	if _, err := r.Step(Msg{Kind: Vote}); err == nil {
		t.Fatal("participant took a vote")
	}
	if _, err := NewParticipant("x", Record{Phase: Prepared, Current: cur, Proposal: next}, nil); err == nil {
		t.Fatal("restored a prepared record without its coordinator")
	}
	if _, err := NewParticipant("x", Record{Phase: Idle}, nil); err == nil {
		t.Fatal("restored a record without a table")
	}
}

func TestTwoPhaseCoordinatorGuards(t *testing.T) {
	cur, next := change(t)
	if _, _, err := NewCoordinator("c", next, cur, []string{"a"}); err == nil {
		t.Fatal("proposal older than the current table accepted")
	}
	if _, _, err := NewCoordinator("c", cur, next, nil); err == nil {
		t.Fatal("no participants accepted")
	}
	if _, _, err := NewCoordinator("c", cur, next, []string{"a", "a"}); err == nil {
		t.Fatal("duplicate participants accepted")
	}
	if _, _, err := NewCoordinator("c", cur, Table{}, []string{"a"}); err == nil {
		t.Fatal("empty proposal accepted")
	}
	c, _, _ := NewCoordinator("c", cur, next, []string{"a"})
	for _, m := range []Msg{
		{Kind: Vote, From: "a", Epoch: next.Epoch() + 1, Yes: true},
		{Kind: Vote, From: "stranger", Epoch: next.Epoch(), Yes: true},
		{Kind: Done, From: "a", Epoch: next.Epoch()},
		{Kind: Prepare, From: "a", Epoch: next.Epoch()},
	} {
		if _, err := c.Step(m); err == nil {
			t.Errorf("coordinator took %+v", m)
		}
	}
	if c.Phase() != Preparing {
		t.Fatalf("bad messages moved the coordinator to %s", c.Phase())
	}
}

// TestTwoPhaseRandomSchedules runs the two machines over thousands of
// seeded schedules: messages lost, duplicated and reordered, transport
// failures reported, timeouts fired, participants and the coordinator
// crashing and coming back from their records. Whatever happens, once the
// network heals every participant ends Idle, and either all of them route
// by the new table (the coordinator logged a commit) or none does; no
// participant ever installs it before the commit was logged.
func TestTwoPhaseRandomSchedules(t *testing.T) {
	cur, next := change(t)
	names := []string{"a", "b", "c", "d"}
	var commits, aborts int
	for seed := range uint64(3000) {
		r := rand.New(rand.NewPCG(seed, 99))
		s := &sim{t: t, r: r, next: next, names: names, recs: map[string]Record{}, ps: map[string]*Participant{}}
		for _, n := range names {
			s.recs[n] = Record{Phase: Idle, Current: cur}
			s.ps[n], _ = NewParticipant(n, s.recs[n], nil)
		}
		var eff Effects
		s.coord, eff, _ = NewCoordinator("coord", cur, next, names)
		s.apply("coord", eff)
		// Chaos.
		for range 40 + r.IntN(40) {
			s.chaos()
		}
		// Healing: every message arrives, timers fire, until quiet.
		for round := 0; ; round++ {
			if round > 50 {
				t.Fatalf("seed %d: did not settle: coordinator %v, queue %s", seed, s.coord != nil, kinds(s.queue))
			}
			for len(s.queue) > 0 {
				m := s.queue[0]
				s.queue = s.queue[1:]
				s.deliver(m)
			}
			quiet := s.coord == nil || s.coord.Finished()
			for _, n := range names {
				if s.ps[n].Phase() == Prepared {
					quiet = false
					s.deliver(Msg{Kind: Timeout, To: n})
				}
			}
			if s.coord != nil && !s.coord.Finished() {
				s.deliver(Msg{Kind: Timeout, To: "coord", Epoch: next.Epoch()})
			}
			if quiet && len(s.queue) == 0 {
				break
			}
		}
		installed := 0
		for _, n := range names {
			p := s.ps[n]
			if p.Phase() != Idle {
				t.Fatalf("seed %d: %s ends %s", seed, n, p.Phase())
			}
			if p.Current().Equal(next) {
				installed++
			} else if !p.Current().Equal(cur) {
				t.Fatalf("seed %d: %s ends with %v", seed, n, p.Current())
			}
		}
		switch {
		case s.committed && installed == len(names):
			commits++
		case !s.committed && installed == 0:
			aborts++
		default:
			t.Fatalf("seed %d: commit logged %v, but %d of %d installed the table", seed, s.committed, installed, len(names))
		}
	}
	t.Logf("3000 schedules: %d committed, %d aborted", commits, aborts)
	if commits < 100 || aborts < 100 {
		t.Fatalf("the schedules exercise one outcome too rarely: %d commits, %d aborts", commits, aborts)
	}
}

// sim is the network and disks of TestTwoPhaseRandomSchedules.
type sim struct {
	t         *testing.T
	r         *rand.Rand
	next      Table
	names     []string
	coord     *Coordinator // nil: crashed, or finished and forgotten
	coordRec  *Record
	committed bool // the coordinator logged its commit
	ps        map[string]*Participant
	recs      map[string]Record
	queue     []Msg
}

func (s *sim) apply(node string, eff Effects) {
	if eff.Persist != nil {
		if node == "coord" {
			s.coordRec = eff.Persist
			s.committed = s.committed || eff.Persist.Phase == Committed
		} else {
			s.recs[node] = *eff.Persist
		}
	}
	if eff.Install != nil && eff.Install.Equal(s.next) && !s.committed {
		s.t.Fatalf("%s installed the new table before the commit was logged", node)
	}
	s.queue = append(s.queue, eff.Send...)
}

func (s *sim) deliver(m Msg) {
	if m.To == "coord" {
		if s.coord == nil {
			if m.Kind == Query {
				s.queue = append(s.queue, Presume("coord", m))
			}
			return
		}
		if eff, err := s.coord.Step(m); err == nil {
			s.apply("coord", eff)
		} // else the I/O layer logs the message and drops it
		if s.coord.Finished() {
			s.coord, s.coordRec = nil, nil // forgotten, its record deleted
		}
		return
	}
	eff, err := s.ps[m.To].Step(m)
	if err != nil {
		return // e.g. a Commit overtaken by nothing: logged and dropped
	}
	s.apply(m.To, eff)
}

func (s *sim) chaos() {
	r := s.r
	switch k := r.IntN(20); {
	case k < 10 && len(s.queue) > 0: // deliver a random message
		i := r.IntN(len(s.queue))
		m := s.queue[i]
		s.queue = slices.Delete(s.queue, i, i+1)
		s.deliver(m)
	case k < 12 && len(s.queue) > 0: // lose one; the sender's transport may notice
		i := r.IntN(len(s.queue))
		m := s.queue[i]
		s.queue = slices.Delete(s.queue, i, i+1)
		if m.From == "coord" && r.IntN(2) == 0 {
			s.deliver(Msg{Kind: Unreachable, From: m.To, To: "coord", Epoch: m.Epoch})
		}
	case k < 13 && len(s.queue) > 0: // duplicate one
		s.queue = append(s.queue, s.queue[r.IntN(len(s.queue))])
	case k < 15: // a participant crashes and restarts from its record
		n := s.names[r.IntN(len(s.names))]
		p, err := NewParticipant(n, s.recs[n], nil)
		if err != nil {
			s.t.Fatalf("restart %s from %+v: %v", n, s.recs[n], err)
		}
		s.ps[n] = p
	case k < 16: // the coordinator crashes and restarts from its record
		s.coord = nil
		if s.coordRec != nil {
			c, eff, err := RestoreCoordinator("coord", *s.coordRec, s.names)
			if err != nil {
				s.t.Fatalf("restore coordinator: %v", err)
			}
			s.coord = c
			s.apply("coord", eff)
		}
	case k < 17 && s.coord != nil: // the coordinator's timer
		s.deliver(Msg{Kind: Timeout, To: "coord", Epoch: s.next.Epoch()})
	case k < 18: // a participant's timer
		s.deliver(Msg{Kind: Timeout, To: s.names[r.IntN(len(s.names))]})
	}
}

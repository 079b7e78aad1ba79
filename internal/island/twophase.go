package island

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// The two-phase commit of a table change (Archipelago §4.1: every island
// installs the new table or none does, and the change is abandoned when an
// island cannot be reached), as two pure state machines: messages in, records to persist and messages to send out. The
// I/O layer ships the messages over Quill's RPC, turns its deadlines into
// Timeout messages and failed calls into Unreachable ones, and writes each
// Record durably before it sends what came with it.
//
// The coordinator (one node: the one that ran Rebalance) goes
//
//	Preparing --every participant votes yes--> Committed --every Done--> finished
//	Preparing --a no, an Unreachable or a Timeout--> Aborted (finished)
//
// and a participant (one live node answering for each island) goes
//
//	Idle --Prepare it accepts--> Prepared --Commit--> Idle (new table installed)
//	                             Prepared --Abort---> Idle (table unchanged)
//
// What each must keep durable (presumed abort: only the commit decision is
// logged by the coordinator, so a coordinator with no record of a change
// answers Abort to anyone asking about it):
//
//   - Coordinator: nothing before the decision. On Committed it writes
//     Record{Phase: Committed, Proposal: next} before sending any Commit,
//     and keeps it until every participant has said Done; after a restart
//     RestoreCoordinator sends the Commits again. An abort is not logged.
//   - Participant: Record{Phase: Prepared, Coordinator, Current, Proposal}
//     before it votes yes (after a yes it may not forget the proposal: the
//     coordinator may already have committed it), and Record{Phase: Idle,
//     Current} when the outcome arrives, before it says Done. A restarted
//     participant that is Prepared is in doubt: it asks the coordinator
//     (Query) every QueryInterval until it hears the outcome or learns a
//     committed table at least as new from the cluster state (Learn).

// Deadlines the I/O layer turns into Timeout messages.
const (
	// PrepareTimeout is how long the coordinator waits for every vote
	// before aborting: an island that cannot answer a small RPC in this
	// time is as good as unreachable, and the change is retried later.
	PrepareTimeout = 10 * time.Second
	// OutcomeRetry is how often the coordinator sends a committed outcome
	// again to participants that have not said Done.
	OutcomeRetry = 2 * time.Second
	// QueryInterval is how often a participant in doubt asks the
	// coordinator for the outcome.
	QueryInterval = 5 * time.Second
)

// Kind is what a two-phase message says.
type Kind uint8

const (
	// Prepare: coordinator to participant, carrying the proposed Table,
	// its Epoch and the Base epoch it replaces. Answered by a Vote.
	Prepare Kind = iota + 1
	// Vote: participant to coordinator, Yes or not (with a Reason).
	Vote
	// Commit: coordinator to participant: install the proposal.
	Commit
	// Abort: coordinator to participant: drop the proposal (Reason says
	// why).
	Abort
	// Done: participant to coordinator: the outcome is applied and durable.
	Done
	// Query: participant in doubt to coordinator: what was decided?
	Query
	// Unreachable: transport to coordinator: From could not be reached.
	Unreachable
	// Timeout: timer to coordinator or participant: its deadline passed.
	Timeout
	// Learn: cluster state to participant: a committed Table seen in the
	// replicated cluster state.
	Learn
)

var kindNames = [...]string{"?", "prepare", "vote", "commit", "abort", "done", "query", "unreachable", "timeout", "learn"}

func (k Kind) String() string {
	if int(k) < len(kindNames) {
		return kindNames[k]
	}
	return fmt.Sprintf("kind %d", k)
}

// Msg is one two-phase message. Epoch names the change (the proposed
// table's epoch) in every message.
type Msg struct {
	Kind     Kind
	From, To string
	Epoch    uint64
	Base     uint64 // Prepare: the epoch of the table the proposal replaces
	Table    Table  // Prepare: the proposal; Learn: the committed table
	Yes      bool   // Vote
	Reason   string // Vote (no), Abort
}

// Phase is a state of either machine.
type Phase uint8

const (
	// Idle: a participant with no change pending, routing by Current.
	Idle Phase = iota
	// Preparing: the coordinator has sent Prepare and counts votes.
	Preparing
	// Prepared: a participant that voted yes and awaits the outcome.
	Prepared
	// Committed: the coordinator decided to commit (logged).
	Committed
	// Aborted: the coordinator decided to abort.
	Aborted
)

var phaseNames = [...]string{"idle", "preparing", "prepared", "committed", "aborted"}

func (p Phase) String() string {
	if int(p) < len(phaseNames) {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase %d", p)
}

// Record is what a machine needs after a restart; see the list above for
// when each is written.
type Record struct {
	Phase       Phase
	Coordinator string // participant Prepared: whom to ask
	Current     Table  // participant: the installed table
	Proposal    Table  // coordinator Committed, participant Prepared
}

// Effects is what a step asks of the I/O layer, in order: write Persist
// durably (when not nil), then route by Install (when not nil), then send.
type Effects struct {
	Persist *Record
	Install *Table
	Send    []Msg
}

// Coordinator drives one table change.
type Coordinator struct {
	self   string
	base   uint64
	next   Table
	parts  []string // sorted
	phase  Phase
	votes  map[string]bool // participant -> voted yes
	done   map[string]bool
	reason string // why it aborted
}

// NewCoordinator starts the change from current to next (Rebalance's
// result) among the participants, and returns the Prepares to send.
func NewCoordinator(self string, current, next Table, participants []string) (*Coordinator, Effects, error) {
	if len(next.islands) == 0 {
		return nil, Effects{}, errors.New("two-phase: the proposed table has no islands")
	}
	if next.epoch <= current.epoch {
		return nil, Effects{}, fmt.Errorf("two-phase: proposed epoch %d is not above the current %d", next.epoch, current.epoch)
	}
	parts := slices.Clone(participants)
	slices.Sort(parts)
	if len(parts) == 0 {
		return nil, Effects{}, errors.New("two-phase: no participants")
	}
	if i := duplicate(parts); i >= 0 {
		return nil, Effects{}, fmt.Errorf("two-phase: participant %q named twice", parts[i])
	}
	c := &Coordinator{self: self, base: current.epoch, next: next, parts: parts, phase: Preparing,
		votes: map[string]bool{}, done: map[string]bool{}}
	var eff Effects
	for _, p := range parts {
		eff.Send = append(eff.Send, Msg{Kind: Prepare, From: self, To: p, Epoch: next.epoch, Base: c.base, Table: next})
	}
	return c, eff, nil
}

// RestoreCoordinator resumes a change whose commit was logged (rec from
// the coordinator's Committed record): it sends every Commit again, since
// it no longer knows who said Done.
func RestoreCoordinator(self string, rec Record, participants []string) (*Coordinator, Effects, error) {
	if rec.Phase != Committed {
		return nil, Effects{}, fmt.Errorf("two-phase: coordinator record in phase %s, only committed is kept", rec.Phase)
	}
	c, _, err := NewCoordinator(self, Table{epoch: rec.Proposal.epoch - 1}, rec.Proposal, participants)
	if err != nil {
		return nil, Effects{}, err
	}
	c.phase = Committed
	return c, Effects{Send: c.outcome(Commit, c.pending())}, nil
}

// Presume answers a Query about a change this node has no coordinator and
// no record for: under presumed abort that change was not committed.
func Presume(self string, q Msg) Msg {
	return Msg{Kind: Abort, From: self, To: q.From, Epoch: q.Epoch, Reason: "coordinator has no record of the change"}
}

// Phase returns where the change is.
func (c *Coordinator) Phase() Phase { return c.phase }

// Next returns the proposed table.
func (c *Coordinator) Next() Table { return c.next }

// Reason says why the change aborted ("" unless Aborted).
func (c *Coordinator) Reason() string { return c.reason }

// Finished reports whether the coordinator may be forgotten (and its
// record deleted): an aborted change at once (presumed abort), a committed
// one when every participant has said Done.
func (c *Coordinator) Finished() bool {
	return c.phase == Aborted || c.phase == Committed && len(c.pending()) == 0
}

// pending returns the participants that have not said Done.
func (c *Coordinator) pending() []string {
	var out []string
	for _, p := range c.parts {
		if !c.done[p] {
			out = append(out, p)
		}
	}
	return out
}

func (c *Coordinator) outcome(k Kind, to []string) []Msg {
	out := make([]Msg, 0, len(to))
	for _, p := range to {
		out = append(out, Msg{Kind: k, From: c.self, To: p, Epoch: c.next.epoch, Reason: c.reason})
	}
	return out
}

// abort decides Abort and tells every participant that did not vote no.
func (c *Coordinator) abort(reason string) Effects {
	c.phase, c.reason = Aborted, reason
	var to []string
	for _, p := range c.parts {
		if yes, voted := c.votes[p]; !voted || yes {
			to = append(to, p)
		}
	}
	return Effects{Send: c.outcome(Abort, to)}
}

// Step takes one message and returns what to do. A message about another
// change, or from a node that is not a participant, is an error: the
// caller logs and drops it.
func (c *Coordinator) Step(m Msg) (Effects, error) {
	if m.Epoch != c.next.epoch {
		return Effects{}, fmt.Errorf("two-phase: %s for epoch %d, this change is epoch %d", m.Kind, m.Epoch, c.next.epoch)
	}
	if m.Kind != Timeout {
		if _, ok := slices.BinarySearch(c.parts, m.From); !ok {
			return Effects{}, fmt.Errorf("two-phase: %s from %q, not a participant of epoch %d", m.Kind, m.From, c.next.epoch)
		}
	}
	switch m.Kind {
	case Vote:
		return c.vote(m)
	case Done:
		if c.phase == Preparing {
			return Effects{}, fmt.Errorf("two-phase: done from %q before any outcome of epoch %d", m.From, c.next.epoch)
		}
		c.done[m.From] = true
		return Effects{}, nil
	case Query:
		switch c.phase {
		case Committed:
			return Effects{Send: c.outcome(Commit, []string{m.From})}, nil
		case Aborted:
			return Effects{Send: c.outcome(Abort, []string{m.From})}, nil
		}
		return Effects{}, nil // not decided yet: the answer comes with the outcome
	case Unreachable:
		if c.phase == Preparing {
			return c.abort(fmt.Sprintf("island %s unreachable", m.From)), nil
		}
		return Effects{}, nil // the outcome is sent again on the next Timeout
	case Timeout:
		switch c.phase {
		case Preparing:
			var silent []string
			for _, p := range c.parts {
				if _, voted := c.votes[p]; !voted {
					silent = append(silent, p)
				}
			}
			return c.abort("no vote in time from " + strings.Join(silent, ", ")), nil
		case Committed:
			return Effects{Send: c.outcome(Commit, c.pending())}, nil
		}
		return Effects{}, nil
	}
	return Effects{}, fmt.Errorf("two-phase: coordinator cannot take a %s message", m.Kind)
}

func (c *Coordinator) vote(m Msg) (Effects, error) {
	switch c.phase {
	case Preparing:
		c.votes[m.From] = m.Yes
		if !m.Yes {
			return c.abort(fmt.Sprintf("island %s refused: %s", m.From, m.Reason)), nil
		}
		for _, p := range c.parts {
			if !c.votes[p] {
				return Effects{}, nil
			}
		}
		c.phase = Committed
		return Effects{Persist: &Record{Phase: Committed, Proposal: c.next}, Send: c.outcome(Commit, c.parts)}, nil
	case Committed:
		if !m.Yes {
			return Effects{}, fmt.Errorf("two-phase: %q votes no on epoch %d after voting yes", m.From, c.next.epoch)
		}
		return Effects{Send: c.outcome(Commit, []string{m.From})}, nil // our Commit was lost
	default: // Aborted: a late yes needs the outcome, a no needs nothing
		if m.Yes {
			return Effects{Send: c.outcome(Abort, []string{m.From})}, nil
		}
		return Effects{}, nil
	}
}

// Participant is one island's side of table changes: it holds the
// installed table and at most one prepared proposal.
type Participant struct {
	self     string
	phase    Phase // Idle or Prepared
	coord    string
	current  Table
	proposal Table
	check    func(Table) error
}

// NewParticipant restores a participant from its last Record (for a node's
// first start, Record{Phase: Idle, Current: the table it starts with}).
// check vets a proposal before the participant votes yes (nil: accept any
// well-formed one): the wiring passes a function that validates the table
// against the islands the membership knows (Table.Validate).
func NewParticipant(self string, rec Record, check func(Table) error) (*Participant, error) {
	if len(rec.Current.islands) == 0 {
		return nil, errors.New("two-phase: participant record has no current table")
	}
	p := &Participant{self: self, phase: rec.Phase, coord: rec.Coordinator, current: rec.Current, check: check}
	switch rec.Phase {
	case Idle:
	case Prepared:
		if rec.Proposal.epoch <= rec.Current.epoch || rec.Coordinator == "" {
			return nil, fmt.Errorf("two-phase: prepared record for epoch %d over current %d, coordinator %q",
				rec.Proposal.epoch, rec.Current.epoch, rec.Coordinator)
		}
		p.proposal = rec.Proposal
	default:
		return nil, fmt.Errorf("two-phase: participant record in phase %s", rec.Phase)
	}
	return p, nil
}

// Phase returns Idle or Prepared.
func (p *Participant) Phase() Phase { return p.phase }

// Current returns the installed table.
func (p *Participant) Current() Table { return p.current }

func (p *Participant) record() *Record {
	r := &Record{Phase: p.phase, Current: p.current}
	if p.phase == Prepared {
		r.Coordinator, r.Proposal = p.coord, p.proposal
	}
	return r
}

func (p *Participant) reply(m Msg, k Kind) Msg {
	return Msg{Kind: k, From: p.self, To: m.From, Epoch: m.Epoch}
}

func (p *Participant) refuse(m Msg, format string, a ...any) Effects {
	v := p.reply(m, Vote)
	v.Reason = fmt.Sprintf(format, a...)
	return Effects{Send: []Msg{v}}
}

// Step takes one message and returns what to do.
func (p *Participant) Step(m Msg) (Effects, error) {
	switch m.Kind {
	case Prepare:
		return p.prepare(m), nil
	case Commit:
		switch {
		case p.phase == Prepared && m.Epoch == p.proposal.epoch:
			p.phase, p.current, p.proposal = Idle, p.proposal, Table{}
			installed := p.current
			return Effects{Persist: p.record(), Install: &installed, Send: []Msg{p.reply(m, Done)}}, nil
		case m.Epoch <= p.current.epoch:
			return Effects{Send: []Msg{p.reply(m, Done)}}, nil // a resent Commit
		}
		return Effects{}, fmt.Errorf("two-phase: commit of epoch %d from %q, which %s never prepared", m.Epoch, m.From, p.self)
	case Abort:
		if p.phase == Prepared && m.Epoch == p.proposal.epoch {
			p.phase, p.proposal = Idle, Table{}
			return Effects{Persist: p.record(), Send: []Msg{p.reply(m, Done)}}, nil
		}
		return Effects{Send: []Msg{p.reply(m, Done)}}, nil // nothing prepared: nothing to drop
	case Timeout:
		if p.phase == Prepared {
			return Effects{Send: []Msg{{Kind: Query, From: p.self, To: p.coord, Epoch: p.proposal.epoch}}}, nil
		}
		return Effects{}, nil
	case Learn:
		return p.learn(m), nil
	}
	return Effects{}, fmt.Errorf("two-phase: participant cannot take a %s message", m.Kind)
}

func (p *Participant) prepare(m Msg) Effects {
	if p.phase == Prepared {
		if m.From == p.coord && m.Epoch == p.proposal.epoch && m.Table.Equal(p.proposal) {
			v := p.reply(m, Vote)
			v.Yes = true
			return Effects{Send: []Msg{v}} // a resent Prepare: same vote
		}
		return p.refuse(m, "%s is prepared for epoch %d from %s", p.self, p.proposal.epoch, p.coord)
	}
	switch {
	case m.Base != p.current.epoch:
		return p.refuse(m, "%s has table epoch %d, the proposal replaces %d", p.self, p.current.epoch, m.Base)
	case len(m.Table.islands) == 0 || m.Table.epoch != m.Epoch || m.Epoch <= p.current.epoch:
		return p.refuse(m, "proposal for epoch %d is malformed", m.Epoch)
	}
	if p.check != nil {
		if err := p.check(m.Table); err != nil {
			return p.refuse(m, "%s: %v", p.self, err)
		}
	}
	p.phase, p.coord, p.proposal = Prepared, m.From, m.Table
	v := p.reply(m, Vote)
	v.Yes = true
	return Effects{Persist: p.record(), Send: []Msg{v}}
}

// learn installs a committed table newer than the current one; one at least
// as new as the proposal resolves a participant in doubt.
func (p *Participant) learn(m Msg) Effects {
	if len(m.Table.islands) == 0 || m.Table.epoch <= p.current.epoch {
		return Effects{}
	}
	p.current = m.Table
	if p.phase == Prepared && p.current.epoch >= p.proposal.epoch {
		p.phase, p.proposal, p.coord = Idle, Table{}, ""
	}
	installed := p.current
	return Effects{Persist: p.record(), Install: &installed}
}

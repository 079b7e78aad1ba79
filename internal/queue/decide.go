package queue

// The queue's decisions apart from its I/O (the style of etcd's raft: pure
// steps decide, the runner persists and sends): who leads an entry, when
// it is due, how long to wait before trying again, what a remote reply
// does to a recipient, and when an entry is done. decide_test.go tests
// each without sockets or Pebble.

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/cluster"
)

// Leader returns the node that delivers an entry: the first live node of
// its sorted replica set, "" if none is alive.
func Leader(replicas []cluster.NodeID, alive map[cluster.NodeID]bool) cluster.NodeID {
	set := slices.Clone(replicas)
	slices.Sort(set)
	for _, n := range set {
		if alive[n] {
			return n
		}
	}
	return ""
}

// Due returns when an entry next needs its leader: the earliest next try
// of a recipient still to be tried or owed a DSN; false when nothing is
// left (the entry is done).
func Due(e *Entry) (time.Time, bool) {
	var due time.Time
	found := false
	for _, r := range e.Recipients {
		if r.State != Queued && r.State != Failed {
			continue
		}
		if !found || r.NextTry.Before(due) {
			due, found = r.NextTry, true
		}
	}
	return due, found
}

// Done reports an entry with nothing left to try or report.
func Done(e *Entry) bool {
	_, due := Due(e)
	return !due
}

// maxBackoffFactor caps the wait between attempts at this many times the
// first one: with the default 5 minutes, an hour (Postfix waits 300 to
// 4,000 s; RFC 5321 §4.5.4.1 asks for at least 30 minutes between tries
// after the first failures, and we try sooner only at the start).
const maxBackoffFactor = 12

// Backoff returns how long to wait after a recipient's attempts-th failed
// attempt: base doubled per attempt up to maxBackoffFactor·base, then
// spread by ±20% (jitter is a number in [0, 1)) so recipients that failed
// together do not all come back together.
func Backoff(attempts int, base time.Duration, jitter float64) time.Duration {
	d := base
	for i := 1; i < attempts && d < base*maxBackoffFactor; i++ {
		d *= 2
	}
	d = min(d, base*maxBackoffFactor)
	return time.Duration(float64(d) * (0.8 + 0.4*jitter))
}

// Result is what one attempt did for one recipient.
type Result struct {
	Rcpt string
	// Delivered: the server took it. Permanent: it refused it for good
	// (5xx); otherwise the failure is temporary.
	Delivered, Permanent bool
	// Reply is the server's reply (code, enhanced status, text) or why
	// there was none.
	Code   int
	Status string
	Text   string
	// Remote names the server that gave the reply.
	Remote string
}

// Reply renders the result as the entry records it.
func (r Result) Reply() string {
	switch {
	case r.Code == 0 && r.Status != "":
		return r.Status + " " + r.Text // this node's own verdict
	case r.Code == 0:
		return r.Text
	case r.Status != "":
		return fmt.Sprintf("%d %s %s", r.Code, r.Status, r.Text)
	}
	return fmt.Sprintf("%d %s", r.Code, r.Text)
}

// StatusOf is a result's RFC 3463 status: the server's enhanced code, or
// one derived from the reply's class.
func StatusOf(r Result) string {
	if r.Status != "" {
		return r.Status
	}
	switch {
	case r.Delivered:
		return "2.0.0"
	case r.Permanent:
		return "5.0.0"
	}
	return "4.0.0"
}

// Step records an attempt's results in the entry: a delivered recipient
// is done, a refused one is owed a DSN, and one that failed for now waits
// Backoff before its next try. jitter gives each retry its spread.
func Step(e *Entry, results []Result, now time.Time, base time.Duration, jitter func() float64) {
	for _, res := range results {
		i := slices.IndexFunc(e.Recipients, func(r Recipient) bool { return r.Address == res.Rcpt })
		if i < 0 || e.Recipients[i].State != Queued {
			continue
		}
		r := &e.Recipients[i]
		r.Attempts++
		r.LastTry, r.LastReply, r.Remote = now, res.Reply(), res.Remote
		switch {
		case res.Delivered:
			r.State = Delivered
		case res.Permanent:
			r.State, r.NextTry = Failed, now
		default:
			r.NextTry = now.Add(Backoff(r.Attempts, base, jitter()))
		}
	}
}

// Expire fails every recipient still queued once the entry has been in
// the queue for lifetime; it reports whether it did.
func Expire(e *Entry, now time.Time, lifetime time.Duration) bool {
	if now.Before(e.Created.Add(lifetime)) {
		return false
	}
	expired := false
	for i := range e.Recipients {
		r := &e.Recipients[i]
		if r.State == Queued {
			r.State, r.NextTry = Failed, now
			r.LastReply = fmt.Sprintf("%s after %v in the queue; last reply: %s", expiredReply, lifetime, orNone(r.LastReply))
			expired = true
		}
	}
	return expired
}

// expiredReply starts the reply recorded for a recipient whose time in
// the queue ran out.
const expiredReply = "delivery time expired"

func orNone(s string) string {
	if s == "" {
		return "none"
	}
	return s
}

// NeedsWarning reports whether the sender is owed a delay warning: the
// entry has waited warnAfter, a recipient is still queued, none went out
// yet, and there is a sender to tell (no DSN about a DSN, RFC 3461 §6.2).
func NeedsWarning(e *Entry, now time.Time, warnAfter time.Duration) bool {
	if e.Warned || e.From == "" || warnAfter <= 0 || now.Before(e.Created.Add(warnAfter)) {
		return false
	}
	return slices.ContainsFunc(e.Recipients, func(r Recipient) bool { return r.State == Queued })
}

// Domain returns the domain of an address, lower-cased.
func Domain(addr string) string {
	_, d, _ := strings.Cut(addr, "@")
	return strings.ToLower(d)
}

// DueRecipients groups the queued recipients whose next try has come by
// domain, in the order the entry names them: one connection carries all
// of a domain's recipients.
func DueRecipients(e *Entry, now time.Time) (domains []string, by map[string][]string) {
	by = map[string][]string{}
	for _, r := range e.Recipients {
		if r.State != Queued || r.NextTry.After(now) {
			continue
		}
		d := Domain(r.Address)
		if _, ok := by[d]; !ok {
			domains = append(domains, d)
		}
		by[d] = append(by[d], r.Address)
	}
	return domains, by
}

// Merge carries an attempt's outcome (done, started from the state
// begun) onto cur, the state found when the attempt ended, which an
// operator may have changed meanwhile (retry). Recipients the attempt
// settled keep its outcome; the others keep cur's, so a retry asked for
// during the attempt is not undone.
func Merge(cur, begun, done *Entry) *Entry {
	out := cur.Clone()
	for i := range out.Recipients {
		r := &out.Recipients[i]
		j := slices.IndexFunc(done.Recipients, func(x Recipient) bool { return x.Address == r.Address })
		k := slices.IndexFunc(begun.Recipients, func(x Recipient) bool { return x.Address == r.Address })
		if j < 0 || k < 0 || done.Recipients[j] == begun.Recipients[k] {
			continue
		}
		nt := r.NextTry
		*r = done.Recipients[j]
		if r.State == Queued && nt.Before(r.NextTry) && cur.Recipients[i] != begun.Recipients[k] {
			r.NextTry = nt
		}
	}
	out.Warned = out.Warned || done.Warned
	return out
}

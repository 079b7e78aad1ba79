package telemetry

import (
	"context"
	"sort"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
)

// ReportTimeout bounds one member's answer when the console gathers the
// cluster: a console answers within a second even while a node is dying
// (a stopped process holds its connection open and never answers); a
// member that misses it is shown with its last report, marked stale.
const ReportTimeout = 700 * time.Millisecond

// forgetAfter is how long a member that left or that nobody hears of any
// more is still shown with its last report.
const forgetAfter = 24 * time.Hour

// NodeView is one member as the console shows it: what membership says of
// it and its newest report.
type NodeView struct {
	ID    cluster.NodeID `json:"id"`
	Self  bool           `json:"self,omitempty"`
	State string         `json:"state"` // alive, suspect, dead, left; "unknown" if only remembered
	// Report is the newest report this node has of the member (nil:
	// none yet); Stale says it is not from this gathering, Age how old it
	// is.
	Report *Report       `json:"report,omitempty"`
	Stale  bool          `json:"stale,omitempty"`
	Age    time.Duration `json:"age_ns,omitempty"`
	Error  string        `json:"error,omitempty"` // why this gathering got no report
	Down   time.Duration `json:"down_ns,omitempty"`
	// ReplacedIn is how long until the repair gives the objects this
	// member held new replicas elsewhere (0: due or not down).
	ReplacedIn time.Duration `json:"replaced_in_ns,omitempty"`
}

// Cluster is the whole picture a console draws.
type Cluster struct {
	At    time.Time  `json:"at"`
	Nodes []NodeView `json:"nodes"`
	// Alive counts members alive or suspect; Known every member shown.
	Alive int `json:"alive"`
	Known int `json:"known"`
	// Users sums the live members' reports of the users their buckets
	// hold; UsersPartial says a live member's report is missing or stale.
	Users        int  `json:"users"`
	UsersPartial bool `json:"users_partial,omitempty"`
	// Totals over the reports of every member shown.
	Messages     int64 `json:"messages"`
	MessageBytes int64 `json:"message_bytes"`
	Queued       int64 `json:"queued"`
	Under        int64 `json:"under_replicated"`
	// Rates summed over the members, per minute (see Report).
	SeriesStart   time.Time `json:"series_start"`
	Deliveries    []float64 `json:"deliveries"`
	Logins        []float64 `json:"logins"`
	LoginFailures []float64 `json:"login_failures"`
	Errors        []float64 `json:"errors"`
}

// Sources is what a View reads: membership, this node's own reporter, how
// to ask another member, and since when a member is away (the replication
// manager's notion, so "replaced in" matches what repair will do).
type Sources struct {
	Self    cluster.NodeID
	Members func() []cluster.MemberInfo
	Local   func(now time.Time) Report
	Ask     func(ctx context.Context, n cluster.NodeID) (Report, error)
	// Away is how long member n has not been seen alive (false: no
	// knowledge), and ReplaceAfter how long repair waits before giving a
	// dead member's objects new replicas.
	Away         func(n cluster.NodeID) (time.Duration, bool)
	ReplaceAfter time.Duration
}

// View gathers the cluster's reports and remembers the last one of each
// member.
type View struct {
	src  Sources
	mu   sync.Mutex
	last map[cluster.NodeID]Report
}

// NewView returns a view over src.
func NewView(src Sources) *View {
	return &View{src: src, last: map[cluster.NodeID]Report{}}
}

// Gather asks every live member for its report at once, waiting at most
// ReportTimeout for each, and returns the picture.
func (v *View) Gather(ctx context.Context) Cluster {
	now := time.Now()
	members := v.src.Members()
	// This node's own report is in before any asking starts: the
	// goroutines below write the map too.
	fresh := map[cluster.NodeID]Report{v.src.Self: v.src.Local(now)}
	errs := map[cluster.NodeID]string{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, m := range members {
		if m.ID == v.src.Self || (m.State != "alive" && m.State != "suspect") {
			continue
		}
		wg.Add(1)
		go func(id cluster.NodeID) {
			defer wg.Done()
			cctx, cancel := context.WithTimeout(ctx, ReportTimeout)
			defer cancel()
			r, err := v.src.Ask(cctx, id)
			mu.Lock()
			defer mu.Unlock()
			if err != nil {
				errs[id] = "no answer within " + ReportTimeout.String()
				return
			}
			fresh[id] = r
		}(m.ID)
	}
	wg.Wait()
	v.mu.Lock()
	for id, r := range fresh {
		v.last[id] = r
	}
	last := make(map[cluster.NodeID]Report, len(v.last))
	for id, r := range v.last {
		last[id] = r
	}
	v.mu.Unlock()
	return Merge(now, v.src.Self, members, fresh, last, errs, v.src.Away, v.src.ReplaceAfter)
}

// Merge builds the picture from the members, the reports of this
// gathering (fresh), the last report known of each member (last) and why
// members did not answer (errs). It is pure: Gather does the asking.
func Merge(now time.Time, self cluster.NodeID, members []cluster.MemberInfo, fresh, last map[cluster.NodeID]Report,
	errs map[cluster.NodeID]string, away func(cluster.NodeID) (time.Duration, bool), replaceAfter time.Duration) Cluster {
	c := Cluster{At: now}
	seen := map[cluster.NodeID]bool{}
	add := func(id cluster.NodeID, state string) {
		seen[id] = true
		nv := NodeView{ID: id, Self: id == self, State: state, Error: errs[id]}
		if r, ok := fresh[id]; ok {
			nv.Report = &r
		} else if r, ok := last[id]; ok {
			nv.Report, nv.Stale, nv.Age = &r, true, now.Sub(r.At)
		}
		if state != "alive" && state != "suspect" {
			if nv.Report != nil && nv.Age > forgetAfter {
				return
			}
			if away != nil {
				if d, ok := away(id); ok {
					nv.Down = d
					nv.ReplacedIn = max(0, replaceAfter-d)
				}
			}
			if nv.Down == 0 && nv.Report != nil {
				nv.Down = now.Sub(nv.Report.At)
				nv.ReplacedIn = max(0, replaceAfter-nv.Down)
			}
		} else {
			c.Alive++
		}
		c.Nodes = append(c.Nodes, nv)
	}
	for _, m := range members {
		add(m.ID, m.State)
	}
	for id := range last {
		if !seen[id] {
			add(id, "unknown")
		}
	}
	sort.Slice(c.Nodes, func(i, j int) bool { return c.Nodes[i].ID < c.Nodes[j].ID })
	c.Known = len(c.Nodes)
	c.Deliveries, c.Logins = make([]float64, Window), make([]float64, Window)
	c.LoginFailures, c.Errors = make([]float64, Window), make([]float64, Window)
	c.SeriesStart = time.Unix((now.Unix()/60-Window+1)*60, 0)
	for _, nv := range c.Nodes {
		r := nv.Report
		if nv.State == "alive" || nv.State == "suspect" {
			// A dead member's buckets are another's now: only live
			// members' fresh reports count users.
			if r == nil || nv.Stale {
				c.UsersPartial = true
			} else {
				c.Users += r.Users
			}
		}
		if r == nil {
			continue
		}
		c.Messages += r.Messages
		c.MessageBytes += r.MessageBytes
		c.Queued += r.Queued
		c.Under += r.UnderReplicated
		for _, s := range []struct{ dst, src []float64 }{{c.Deliveries, r.Deliveries}, {c.Logins, r.Logins},
			{c.LoginFailures, r.LoginFailures}, {c.Errors, r.Errors}} {
			for k, v := range Align(s.src, r.SeriesStart, c.SeriesStart) {
				s.dst[k] += v
			}
		}
	}
	return c
}

// Align places a series of per-minute counts that starts at from on the
// Window minutes that start at to: a stale report's series ends where it
// was made, and a peer's series of another length is cut to the window
// (minutes outside it count 0).
func Align(values []float64, from, to time.Time) []float64 {
	out := make([]float64, Window)
	shift := int((to.Unix() - from.Unix()) / 60)
	for k := range Window {
		if i := k + shift; i >= 0 && i < len(values) && i < Window {
			out[k] = values[i]
		}
	}
	return out
}

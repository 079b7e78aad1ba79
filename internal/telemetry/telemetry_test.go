package telemetry

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
)

func TestSeriesCountsPerMinute(t *testing.T) {
	t0 := time.Unix(1_800_000_000-1_800_000_000%60, 0) // a minute's start
	var s Series
	s.Observe(t0, 100)
	s.Observe(t0.Add(30*time.Second), 103)
	s.Observe(t0.Add(61*time.Second), 110) // minute 0 ends near 110
	s.Observe(t0.Add(125*time.Second), 111)
	start, c := s.Counts(t0.Add(150*time.Second), 115)
	if len(c) != Window {
		t.Fatalf("%d minutes, want %d", len(c), Window)
	}
	if want := t0.Add(2*time.Minute - (Window-1)*time.Minute); !start.Equal(want) {
		t.Fatalf("start %v, want %v", start, want)
	}
	got := c[Window-3:]
	if got[0] != 10 || got[1] != 1 || got[2] != 4 {
		t.Fatalf("last three minutes %v, want [10 1 4]", got)
	}
	for _, v := range c[:Window-3] {
		if v != 0 {
			t.Fatalf("minutes before the first reading count %v", c)
		}
	}
}

func TestSeriesGapLongerThanWindow(t *testing.T) {
	t0 := time.Unix(1_800_000_000-1_800_000_000%60, 0)
	var s Series
	s.Observe(t0, 5)
	later := t0.Add(3 * time.Hour)
	_, c := s.Counts(later.Add(20*time.Second), 9)
	// Nothing is known of the minutes in the gap but their end: the
	// counts of the old hour are gone, the minute in progress has 0 (its
	// start was first read at the reading that ended the gap).
	sum := 0.0
	for _, v := range c {
		sum += v
	}
	if sum != 0 {
		t.Fatalf("counts after a long gap %v", c)
	}
	_, c = s.Counts(later.Add(70*time.Second), 12)
	// Between the readings at +20 s and +70 s the counter grew by 3: it
	// falls on the minute the first was read in.
	if c[Window-2] != 3 || c[Window-1] != 0 {
		t.Fatalf("minutes after the gap count %v, want [3 0]", c[Window-2:])
	}
}

func TestReporterRates(t *testing.T) {
	total := 0.0
	r := &Reporter{Counters: Counters{Deliveries: func() float64 { return total }},
		Figures: func(rep *Report) { rep.Node = "n1" }}
	t0 := time.Unix(1_800_000_000-1_800_000_000%60, 0)
	r.sample(t0)
	total = 7
	rep := r.Report(t0.Add(20 * time.Second))
	if rep.Node != "n1" || rep.Deliveries[Window-1] != 7 || len(rep.Logins) != Window {
		t.Fatalf("report %+v", rep)
	}
	back := FromPB(rep.ToPB())
	if back.Node != "n1" || back.Deliveries[Window-1] != 7 || !back.SeriesStart.Equal(rep.SeriesStart) {
		t.Fatalf("report after the wire %+v", back)
	}
}

func TestMergeMarksDeadAndStale(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	series := func(v float64) []float64 {
		s := make([]float64, Window)
		s[Window-1] = v
		return s
	}
	start := time.Unix((now.Unix()/60-Window+1)*60, 0)
	members := []cluster.MemberInfo{
		{Member: cluster.Member{ID: "a"}, State: "alive"},
		{Member: cluster.Member{ID: "b"}, State: "dead"},
		{Member: cluster.Member{ID: "c"}, State: "suspect"},
	}
	fresh := map[cluster.NodeID]Report{"a": {Node: "a", At: now, Messages: 10, SeriesStart: start, Deliveries: series(2)}}
	last := map[cluster.NodeID]Report{
		"a": fresh["a"],
		// b's last report was made 2 minutes ago: its series ends two
		// minutes before the cluster's.
		"b": {Node: "b", At: now.Add(-2 * time.Minute), Messages: 5, SeriesStart: start.Add(-2 * time.Minute), Deliveries: series(3)},
	}
	errs := map[cluster.NodeID]string{"c": "no answer"}
	away := func(n cluster.NodeID) (time.Duration, bool) {
		if n == "b" {
			return 90 * time.Second, true
		}
		return 0, false
	}
	c := Merge(now, "a", members, fresh, last, errs, away, 2*time.Minute)
	if c.Alive != 2 || c.Known != 3 {
		t.Fatalf("alive %d known %d, want 2 of 3", c.Alive, c.Known)
	}
	a, b, cc := c.Nodes[0], c.Nodes[1], c.Nodes[2]
	if !a.Self || a.Stale || a.Report == nil {
		t.Fatalf("self %+v", a)
	}
	if !b.Stale || b.Age != 2*time.Minute || b.Down != 90*time.Second || b.ReplacedIn != 30*time.Second {
		t.Fatalf("dead member %+v", b)
	}
	if cc.Report != nil || cc.Error == "" || cc.State != "suspect" {
		t.Fatalf("silent member %+v", cc)
	}
	if c.Messages != 15 {
		t.Fatalf("messages %d, want 15", c.Messages)
	}
	if c.Deliveries[Window-1] != 2 || c.Deliveries[Window-3] != 3 {
		t.Fatalf("cluster deliveries end %v", c.Deliveries[Window-4:])
	}
}

func TestGatherDoesNotWaitForSilentMember(t *testing.T) {
	members := []cluster.MemberInfo{
		{Member: cluster.Member{ID: "a"}, State: "alive"},
		{Member: cluster.Member{ID: "b"}, State: "alive"},
	}
	v := NewView(Sources{Self: "a", Members: func() []cluster.MemberInfo { return members },
		Local: func(now time.Time) Report { return Report{Node: "a", At: now} },
		Ask: func(ctx context.Context, n cluster.NodeID) (Report, error) {
			<-ctx.Done() // a stopped process: the call never answers
			return Report{}, errors.New("deadline")
		}})
	t0 := time.Now()
	c := v.Gather(context.Background())
	if took := time.Since(t0); took > ReportTimeout+300*time.Millisecond {
		t.Fatalf("gathering took %v with a silent member", took)
	}
	if c.Nodes[1].Error == "" || c.Nodes[0].Report == nil {
		t.Fatalf("picture %+v", c.Nodes)
	}
}

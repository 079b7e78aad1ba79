package replica

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
)

// Seeded interleavings of push results against every policy and replica
// count: the tally decides exactly when the policy is met or can no longer
// be, its verdict is ErrPolicy exactly when too few targets hold the write,
// and a target is counted only for a push that succeeded.
func TestTallyDecidesAtTheRightMoment(t *testing.T) {
	for seed := uint64(0); seed < 2000; seed++ {
		rnd := rand.New(rand.NewPCG(seed, 7))
		targets := 1 + rnd.IntN(5)
		local := rnd.IntN(2) == 0
		policy := []Policy{One, Quorum, All}[rnd.IntN(3)]
		want := targets + rnd.IntN(2) // R may exceed the targets (a short set)
		need := policy.Need(want)
		var acked []cluster.NodeID
		pushes := targets
		if local {
			acked = []cluster.NodeID{"self"}
			pushes--
		}
		tl := newTally(need, acked, pushes)
		ok := map[cluster.NodeID]bool{}
		got := len(acked)
		left := pushes
		for i := 0; i < pushes; i++ {
			n := cluster.NodeID(fmt.Sprintf("n%d", i))
			var err error
			if rnd.IntN(3) == 0 {
				err = errors.New("push failed")
			} else {
				ok[n] = true
				got++
			}
			left--
			d := tl.step(n, err)
			must := got >= need || got+left < need || left == 0
			if d != must {
				t.Fatalf("seed %d step %d: decided %v, want %v (acked %d, left %d, need %d)", seed, i, d, must, got, left, need)
			}
			if d {
				break
			}
		}
		if pushes == 0 && !tl.decided() {
			t.Fatalf("seed %d: a write with nothing to push is not decided", seed)
		}
		rep, err := tl.verdict("o")
		if (len(rep.Acked) < need) != errors.Is(err, ErrPolicy) {
			t.Fatalf("seed %d: %d acked of %d needed, error %v", seed, len(rep.Acked), need, err)
		}
		for _, n := range rep.Acked {
			if n != "self" && !ok[n] {
				t.Fatalf("seed %d: %s counted without a successful push", seed, n)
			}
		}
	}
}

// A write's updates must share kind and targets; the plan names the other
// targets and what the policy needs, whatever the order and repetition of
// the targets.
func TestPlanWrite(t *testing.T) {
	for seed := uint64(0); seed < 500; seed++ {
		rnd := rand.New(rand.NewPCG(seed, 9))
		all := []cluster.NodeID{"a", "b", "c", "d"}
		rnd.Shuffle(len(all), func(i, j int) { all[i], all[j] = all[j], all[i] })
		targets := all[:1+rnd.IntN(4)]
		var ups []*Update
		for i := 0; i < 1+rnd.IntN(3); i++ {
			ts := slices.Clone(targets)
			rnd.Shuffle(len(ts), func(i, j int) { ts[i], ts[j] = ts[j], ts[i] })
			if rnd.IntN(4) == 0 {
				ts = append(ts, ts[0]) // a repeated target counts once
			}
			ups = append(ups, &Update{Object: fmt.Sprintf("m/%d/u", i), Targets: ts, Blob: []byte("x")})
		}
		mismatch := rnd.IntN(5) == 0 && len(targets) > 1
		if mismatch {
			ups = append(ups, &Update{Object: "m/x/u", Targets: targets[1:]})
		}
		p, err := planWrite("a", &WriteRequest{Updates: ups, Policy: Quorum})
		if mismatch {
			if err == nil {
				t.Fatalf("seed %d: updates with other targets planned together", seed)
			}
			continue
		}
		if err != nil {
			t.Fatal(err)
		}
		if p.local != slices.Contains(targets, "a") || slices.Contains(p.remaining, "a") ||
			len(p.remaining) != len(targets)-b2i(p.local) || p.need != Quorum.Need(len(targets)) || !p.content {
			t.Fatalf("seed %d: targets %v: plan %+v", seed, targets, p)
		}
	}
	if _, err := planWrite("a", &WriteRequest{Updates: []*Update{{Object: "m/1/u", Targets: []cluster.NodeID{"a"}}, {Object: "p/u", Targets: []cluster.NodeID{"a"}}}}); err == nil {
		t.Fatal("a message and a profile planned as one write")
	}
}

func b2i(b bool) int {
	if b {
		return 1
	}
	return 0
}

// The local apply's outcomes: applied and stale go on, a conflict names
// its object, anything else fails.
func TestJudgeLocal(t *testing.T) {
	objs := []string{"m/1/u", "m/2/u"}
	if c, err := judgeLocal(objs, []Outcome{Applied, Stale}); err != nil || c != nil {
		t.Fatalf("applied and stale: %v %v", c, err)
	}
	if c, err := judgeLocal(objs, []Outcome{Applied, Conflict}); !errors.Is(err, errConflict) || !slices.Equal(c, []string{"m/2/u"}) {
		t.Fatalf("conflict: %v %v", c, err)
	}
	if _, err := judgeLocal(objs, []Outcome{Failed, Applied}); err == nil {
		t.Fatal("a failed apply went on")
	}
}

// A round that left work goes on without the interval's pause, as long as
// scans stay within their duty; a round with nothing left waits.
func TestRepairWait(t *testing.T) {
	for _, c := range []struct {
		scan, round time.Duration
		capped      bool
		want        time.Duration
	}{
		{10 * time.Millisecond, 20 * time.Millisecond, false, repairInterval},
		{time.Second, 2 * time.Second, false, 20 * time.Second},
		{10 * time.Millisecond, 20 * time.Second, true, repairInterval / 10},
		{time.Second, 5 * time.Second, true, 15 * time.Second},
		{time.Second, 30 * time.Second, true, repairInterval / 10},
	} {
		if got := repairWait(c.scan, c.round, c.capped); got != c.want {
			t.Errorf("repairWait(%v, %v, %v) = %v, want %v", c.scan, c.round, c.capped, got, c.want)
		}
	}
}

package island

import (
	"fmt"
	"math"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

// equal returns Islands of capacity 1 with the given names.
func equal(ns ...string) []Island {
	out := make([]Island, len(ns))
	for i, n := range ns {
		out[i] = Island{Name: n}
	}
	return out
}

func uniform(bytes int64) Loads {
	var l Loads
	for b := range l {
		l[b] = bytes
	}
	return l
}

// view is what the tests measure of a table under given loads, in
// Rebalance's weights (Weights: bytes + a typical bucket's per bucket).
type view struct {
	load, target map[string]float64
	maxW         float64
}

func measure(tab Table, islands []Island, loads Loads) view {
	v := view{load: map[string]float64{}, target: map[string]float64{}}
	var total, capSum float64
	ws := Weights(loads)
	for b := range Buckets {
		w := ws[b]
		total += w
		v.load[tab.Island(uint8(b))] += w
		v.maxW = max(v.maxW, w)
	}
	for _, is := range islands {
		capSum += capOf(is)
	}
	for _, is := range islands {
		v.target[is.Name] = total * capOf(is) / capSum
	}
	return v
}

func capOf(is Island) float64 {
	if is.Capacity == 0 {
		return 1
	}
	return is.Capacity
}

// inBand reports whether every island is within the threshold of its target.
func (v view) inBand(threshold float64) bool {
	for n, tg := range v.target {
		if math.Abs(v.load[n]-tg) > threshold*tg {
			return false
		}
	}
	return true
}

// distance is the summed distance of the islands from their targets.
func (v view) distance() float64 {
	var d float64
	for n, tg := range v.target {
		d += math.Abs(v.load[n] - tg)
	}
	return d
}

// checkRebalance runs Rebalance and checks the properties that hold in
// every case; it returns the result for case-specific checks.
func checkRebalance(t *testing.T, label string, before Table, islands []Island, loads Loads, threshold float64) (Table, []Move) {
	t.Helper()
	next, moves, err := Rebalance(before, islands, loads, threshold)
	if err != nil {
		t.Fatalf("%s: %v", label, err)
	}
	keep := map[string]bool{}
	var want []string
	for _, is := range islands {
		keep[is.Name] = true
		want = append(want, is.Name)
	}
	slices.Sort(want)
	if !slices.Equal(next.Islands(), want) {
		t.Fatalf("%s: islands %v, want %v", label, next.Islands(), want)
	}
	// The moves are exactly the difference between the tables.
	var diff []Move
	for b := range Buckets {
		if f, to := before.Island(uint8(b)), next.Island(uint8(b)); f != to {
			diff = append(diff, Move{Bucket: uint8(b), From: f, To: to, Bytes: loads[b]})
		}
	}
	if !slices.Equal(moves, diff) {
		t.Fatalf("%s: moves %v do not match the tables' difference %v", label, moves, diff)
	}
	switch {
	case len(moves) == 0 && slices.Equal(before.Islands(), want):
		if !next.Equal(before) {
			t.Fatalf("%s: nothing moved but the table changed: %v -> %v", label, before, next)
		}
	case next.Epoch() != before.Epoch()+1:
		t.Fatalf("%s: changed table has epoch %d after %d", label, next.Epoch(), before.Epoch())
	}
	// Monotonic: no island both gives and takes.
	gives, takes := map[string]bool{}, map[string]bool{}
	for _, m := range moves {
		gives[m.From], takes[m.To] = true, true
	}
	for n := range gives {
		if takes[n] {
			t.Fatalf("%s: island %s both gives and takes buckets: %v", label, n, moves)
		}
		if !keep[n] {
			continue
		}
	}
	// Removed islands keep nothing; added ones only take.
	for _, o := range next.Owners() {
		if !keep[o] {
			t.Fatalf("%s: removed island %s still owns buckets", label, o)
		}
	}
	for n := range gives {
		if !before.Has(n) {
			t.Fatalf("%s: added island %s gives buckets", label, n)
		}
	}
	// Bytes moved: each losing island sheds less than one bucket more than
	// its excess over its target (a removed island exactly its load).
	v := measure(before, islands, loads)
	var moved, bound float64
	ws := Weights(loads)
	for _, m := range moves {
		moved += ws[m.Bucket]
	}
	for n, l := range v.load {
		if e := l - v.target[n]; e > 0 {
			bound += e
			if keep[n] {
				bound += v.maxW
			}
		}
	}
	if moved > bound+1e-6*bound {
		t.Fatalf("%s: moved %.0f, more than the bound %.0f", label, moved, bound)
	}
	// Deterministic, whatever the order of the islands given.
	rev := slices.Clone(islands)
	slices.Reverse(rev)
	again, moves2, err := Rebalance(before, rev, loads, threshold)
	if err != nil || !again.Equal(next) || !slices.Equal(moves, moves2) {
		t.Fatalf("%s: result depends on the order of the islands (%v)", label, err)
	}
	return next, moves
}

func TestRebalanceNoMoveWithinThreshold(t *testing.T) {
	tab, _ := Initial([]string{"a", "b", "c"}) // 86, 85, 85 buckets
	next, moves, err := Rebalance(tab, equal("c", "b", "a"), uniform(1000), DefaultThreshold)
	if err != nil || len(moves) != 0 || !next.Equal(tab) {
		t.Fatalf("balanced table: moves %v, table %v (%v)", moves, next, err)
	}
	// Drift to about 17% above the mean on a (in weights, which add the
	// mean bytes per bucket to each): still inside 20%.
	loads := uniform(1000)
	for _, b := range tab.Owned("a") {
		loads[b] = 1600
	}
	v := measure(tab, equal("a", "b", "c"), loads)
	if d := v.load["a"]/v.target["a"] - 1; d < 0.14 || d > 0.2 {
		t.Fatalf("test setup: a is %.2f above its target", d)
	}
	if _, moves, _ := Rebalance(tab, equal("a", "b", "c"), loads, DefaultThreshold); len(moves) != 0 {
		t.Fatalf("drift inside the threshold moved %v", moves)
	}
	// Past it (a's weight at 1.28 times the mean), buckets leave a for b
	// and c.
	for _, b := range tab.Owned("a") {
		loads[b] = 2200
	}
	next, moves = checkRebalance(t, "drift", tab, equal("a", "b", "c"), loads, DefaultThreshold)
	if len(moves) == 0 {
		t.Fatal("drift past the threshold moved nothing")
	}
	for _, m := range moves {
		if m.From != "a" {
			t.Fatalf("drift moved %v, want only buckets of a", m)
		}
	}
	// Once moving, it balances as near as whole buckets allow (a bucket
	// is 1.5% of a target here), not just back inside the threshold.
	if !measure(next, equal("a", "b", "c"), loads).inBand(0.03) {
		t.Fatalf("after the drift: %v, not within 3%% of the targets", next)
	}
}

func TestRebalanceAddIsland(t *testing.T) {
	tab, _ := Initial([]string{"a", "b", "c"})
	next, moves := checkRebalance(t, "add d", tab, equal("a", "b", "c", "d"), uniform(4096), DefaultThreshold)
	c := counts(next)
	if c["d"] != 64 || c["a"] != 64 || c["b"] != 64 || c["c"] != 64 {
		t.Fatalf("equal buckets over 4 islands: %v", c)
	}
	if len(moves) != 64 {
		t.Fatalf("%d moves, want the 64 d needs", len(moves))
	}
	// Empty cluster: the buckets themselves are shared out.
	next, _ = checkRebalance(t, "add d, no mail", tab, equal("a", "b", "c", "d"), Loads{}, DefaultThreshold)
	if c := counts(next); c["d"] != 64 {
		t.Fatalf("d got %d buckets of an empty cluster, want 64", c["d"])
	}
}

func TestRebalanceRemoveIsland(t *testing.T) {
	tab, _ := Initial([]string{"a", "b", "c", "d"})
	next, moves := checkRebalance(t, "remove d", tab, equal("a", "b", "c"), uniform(100), DefaultThreshold)
	if len(moves) != 64 {
		t.Fatalf("%d moves, want d's 64", len(moves))
	}
	for _, m := range moves {
		if m.From != "d" {
			t.Fatalf("removing d moved %v", m)
		}
	}
	c := counts(next)
	for _, n := range []string{"a", "b", "c"} {
		if c[n] < 85 || c[n] > 86 {
			t.Fatalf("after removing d: %v", c)
		}
	}
	// An island that owned no bucket goes from the list alone.
	var owners [Buckets]string
	for b := range owners {
		owners[b] = "a"
	}
	withSpare, _ := New(5, owners, []string{"a", "spare"})
	next, moves = checkRebalance(t, "drop spare", withSpare, equal("a"), uniform(1), 0)
	if len(moves) != 0 || next.Epoch() != 6 || next.Has("spare") {
		t.Fatalf("dropping an empty island: %v, moves %v", next, moves)
	}
}

func TestRebalanceCapacity(t *testing.T) {
	tab, _ := Initial([]string{"big", "small"})
	isl := []Island{{Name: "big", Capacity: 3}, {Name: "small", Capacity: 1}}
	next, _ := checkRebalance(t, "capacity 3:1", tab, isl, uniform(10), 0.05)
	if c := counts(next); c["big"] != 192 || c["small"] != 64 {
		t.Fatalf("capacity 3:1 over equal buckets: %v", c)
	}
}

func TestRebalanceHeavyBucket(t *testing.T) {
	// One bucket holds nearly everything: no table is within the band,
	// the result is still monotonic, and repeating converges.
	tab, _ := Initial([]string{"a", "b"})
	loads := uniform(10)
	loads[3] = 1 << 30
	next, _ := checkRebalance(t, "heavy", tab, equal("a", "b"), loads, DefaultThreshold)
	for round := range 3 {
		again, moves := checkRebalance(t, fmt.Sprintf("heavy, round %d", round+2), next, equal("a", "b"), loads, DefaultThreshold)
		if len(moves) == 0 {
			return
		}
		next = again
	}
	t.Fatalf("rebalancing around a heavy bucket did not settle: %v", next)
}

func TestRebalanceRejects(t *testing.T) {
	tab, _ := Initial([]string{"a", "b"})
	neg := Loads{}
	neg[7] = -1
	for _, c := range []struct {
		name      string
		tab       Table
		islands   []Island
		loads     Loads
		threshold float64
		want      string
	}{
		{"zero table", Table{}, equal("a"), Loads{}, 0.2, "no islands"},
		{"no islands", tab, nil, Loads{}, 0.2, "no islands to keep"},
		{"twice", tab, equal("a", "a"), Loads{}, 0.2, `"a" listed twice`},
		{"bad name", tab, equal("a", "B"), Loads{}, 0.2, "not allowed"},
		{"NaN threshold", tab, equal("a"), Loads{}, math.NaN(), "threshold"},
		{"negative threshold", tab, equal("a"), Loads{}, -0.1, "threshold"},
		{"negative capacity", tab, []Island{{Name: "a", Capacity: -1}}, Loads{}, 0.2, "capacity -1"},
		{"infinite capacity", tab, []Island{{Name: "a", Capacity: math.Inf(1)}}, Loads{}, 0.2, "capacity"},
		{"negative load", tab, equal("a"), neg, 0.2, "bucket 7: load -1"},
		{"too many", tab, equal(names(MaxIslands + 1)...), Loads{}, 0.2, "at most 256"},
	} {
		_, _, err := Rebalance(c.tab, c.islands, c.loads, c.threshold)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// randomLoads draws bucket loads of one of several shapes.
func randomLoads(r *rand.Rand) (Loads, string) {
	var l Loads
	shape := r.IntN(4)
	for b := range l {
		switch shape {
		case 0: // even: every bucket about the same
			l[b] = 1_000_000 + r.Int64N(200_000)
		case 1: // uneven but bounded (users hash evenly; mailbox sizes vary)
			l[b] = 500_000 + r.Int64N(1_000_000)
		case 2: // skewed: a few heavy buckets
			l[b] = r.Int64N(100_000)
			if r.IntN(16) == 0 {
				l[b] = r.Int64N(5_000_000)
			}
		case 3: // a new cluster: mostly empty
			if r.IntN(8) == 0 {
				l[b] = r.Int64N(10_000)
			}
		}
	}
	return l, []string{"even", "uneven", "skewed", "sparse"}[shape]
}

// TestRebalanceProperties draws thousands of cases (a table, islands
// added, removed or kept, loads of several shapes, a threshold) and checks
// every property of Rebalance on each: those of checkRebalance, then that
// the result is within the threshold whenever whole buckets allow it, that
// an added island gets its share, and that a second Rebalance of the
// result moves nothing.
func TestRebalanceProperties(t *testing.T) {
	r := rand.New(rand.NewPCG(2026, 17))
	pool := names(16)
	var cases, reachable, settled int
	for i := range 3000 {
		// The current table: a balanced start or a random assignment
		// (an arbitrary table: any starting point must work).
		n := 1 + r.IntN(8)
		before, _ := Initial(pool[:n])
		if r.IntN(3) == 0 {
			before = randomTableOf(r, pool[:n])
		}
		// The islands to keep: remove some, add some.
		var isl []Island
		for _, name := range pool[:n] {
			if r.IntN(5) != 0 {
				isl = append(isl, Island{Name: name})
			}
		}
		for _, name := range pool[n:] {
			if r.IntN(8) == 0 {
				isl = append(isl, Island{Name: name})
			}
		}
		if len(isl) == 0 {
			isl = append(isl, Island{Name: pool[n]})
		}
		if r.IntN(4) == 0 {
			for j := range isl {
				isl[j].Capacity = float64(1 + r.IntN(4))
			}
		}
		loads, shape := randomLoads(r)
		threshold := []float64{0, 0.02, 0.1, 0.2, 0.5}[r.IntN(5)]
		label := fmt.Sprintf("case %d (%s loads, threshold %v, %v -> %v)", i, shape, threshold, before, isl)
		cases++

		next, moves := checkRebalance(t, label, before, isl, loads, threshold)
		v := measure(next, isl, loads)
		// Within the band whenever the buckets are small enough beside it
		// that whole buckets can reach it: with k islands, the heaviest
		// bucket below half the band of the smallest target, or the
		// threshold 0 (closest possible, not exact).
		minT := math.Inf(1)
		for _, tg := range v.target {
			minT = min(minT, tg)
		}
		if threshold > 0 && 2*v.maxW <= threshold*minT {
			reachable++
			if !v.inBand(threshold) {
				t.Fatalf("%s: result %v outside the threshold though buckets are small (largest %.0f, smallest target %.0f)",
					label, next, v.maxW, minT)
			}
			// An added island gets about its share.
			for _, is := range isl {
				if !before.Has(is.Name) && math.Abs(v.load[is.Name]-v.target[is.Name]) > threshold*v.target[is.Name] {
					t.Fatalf("%s: added island %s holds %.0f of its %.0f", label, is.Name, v.load[is.Name], v.target[is.Name])
				}
			}
		}
		// A second Rebalance moves nothing once within the band, and in
		// any case never goes further from the targets: repeating settles.
		again, moves2 := checkRebalance(t, label+", again", next, isl, loads, threshold)
		if v.inBand(threshold) {
			if len(moves2) != 0 || !again.Equal(next) {
				t.Fatalf("%s: second Rebalance moved %v", label, moves2)
			}
			settled++
		} else if d2 := measure(again, isl, loads).distance(); d2 > v.distance()+1e-6*v.distance() {
			t.Fatalf("%s: second Rebalance went from distance %.0f to %.0f", label, v.distance(), d2)
		}
		_ = moves
	}
	t.Logf("%d cases: %d with buckets small enough for the band (all within it), %d settled after one Rebalance", cases, reachable, settled)
	if reachable < cases/4 {
		t.Fatalf("only %d of %d cases exercise the band check: the generator drifted", reachable, cases)
	}
}

func randomTableOf(r *rand.Rand, isl []string) Table {
	var owners [Buckets]string
	for b := range owners {
		owners[b] = isl[r.IntN(len(isl))]
	}
	tab, err := New(1+r.Uint64N(100), owners, isl)
	if err != nil {
		panic(err)
	}
	return tab
}

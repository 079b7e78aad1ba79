package island

import (
	"errors"
	"fmt"
	"math"
	"slices"
)

// DefaultThreshold is how far, as a share of its target, an island's
// weight (Weights: its bytes plus a typical bucket's for each it owns) may
// drift before Rebalance moves buckets: the 20%, the band the
// node rebalancer (internal/rebalance) also keeps. Moving a bucket copies
// every user in it to another island, so small drifts are left alone
// (Archipelago §4.1 expects table changes to be rare, on the scale of days).
const DefaultThreshold = 0.2

// Island is an island as Rebalance sees it.
type Island struct {
	Name string
	// Capacity weighs the island's share of the bytes: its target is the
	// total times Capacity over the sum of all capacities. 0 counts as 1,
	// so equal islands need not say; the wiring may pass the island's
	// number of nodes or its disk size.
	Capacity float64
}

// Loads is the bytes each bucket's users hold (the sum over the bucket's
// users of their mail and profiles, every replica counted); a bucket
// without users holds 0.
type Loads [Buckets]int64

// Move is one bucket changing island.
type Move struct {
	Bucket   uint8
	From, To string
	Bytes    int64 // the bucket's load: what the move copies
}

// Rebalance recomputes the table by monotonic bin packing (Archipelago
// §3.1): islands lists the islands that are to exist from now on, loads the
// bytes per bucket, threshold the band (DefaultThreshold) within which an
// island's bytes may differ from its target before anything moves.
//
// It leaves the table alone (returning t itself and no moves) when the
// islands are the table's and every island is within the band: the
// hysteresis that keeps small drifts from moving users. Otherwise it
// returns a new table at the next epoch, and the moves from t to it, in
// bucket order, such that:
//
//   - each island only gains or only loses buckets, never both, so that a
//     bucket moves at most once and no island is both sending and
//     receiving users;
//   - an island not in islands (removed) loses all its buckets, and one not
//     in t (added) starts empty and gains;
//   - the moves bring every island as near its target as whole buckets
//     allow. Beyond the removed islands' buckets, the bytes moved exceed
//     the least that perfect balance needs (the sum of every island's
//     excess over its target) by less than one bucket per losing island.
//
// A bucket's weight is its bytes plus the mean bytes of the buckets that
// hold mail (at least 1: Weights), which stands for the mail its users
// will get: a bucket empty today fills like a typical one. Weighing bytes
// alone would fill an added island's share with the buckets that hold
// little yet (in a young cluster, most of them), so it would own most of
// the buckets and get most of the new mail; with the mean added, islands
// end with shares of both bytes and buckets, and in a cluster holding no
// mail yet the buckets are shared out evenly.
// Every choice is deterministic: ties between buckets go to the lower
// bucket number, between islands to the name that sorts first.
//
// The packing is greedy, in three steps: (1) a removed island's buckets,
// heaviest first, each to the gaining island furthest below its target;
// (2) repeatedly, the heaviest bucket of an island above its target that
// fits the largest remaining deficit, moved there; (3) while some island
// is still outside the band, the move that most reduces the total
// distance from the targets, even if it overshoots.
func Rebalance(t Table, islands []Island, loads Loads, threshold float64) (Table, []Move, error) {
	if len(t.islands) == 0 {
		return Table{}, nil, errors.New("rebalance: the current table has no islands")
	}
	if math.IsNaN(threshold) || math.IsInf(threshold, 0) || threshold < 0 {
		return Table{}, nil, fmt.Errorf("rebalance: threshold %v, want a share >= 0", threshold)
	}
	caps := make(map[string]float64, len(islands))
	for _, isl := range islands {
		if err := ValidName(isl.Name); err != nil {
			return Table{}, nil, fmt.Errorf("rebalance: %w", err)
		}
		if _, dup := caps[isl.Name]; dup {
			return Table{}, nil, fmt.Errorf("rebalance: island %q listed twice", isl.Name)
		}
		c := isl.Capacity
		if math.IsNaN(c) || math.IsInf(c, 0) || c < 0 {
			return Table{}, nil, fmt.Errorf("rebalance: island %q: capacity %v, want >= 0", isl.Name, c)
		}
		if c == 0 {
			c = 1
		}
		caps[isl.Name] = c
	}
	if len(caps) == 0 {
		return Table{}, nil, errors.New("rebalance: no islands to keep")
	}
	if len(caps) > MaxIslands {
		return Table{}, nil, fmt.Errorf("rebalance: %d islands, at most %d", len(caps), MaxIslands)
	}
	for b, l := range loads {
		if l < 0 {
			return Table{}, nil, fmt.Errorf("rebalance: bucket %d: load %d bytes is negative", b, l)
		}
	}

	p := newPacking(t, caps, loads, threshold)
	names := p.presentNames()
	if slices.Equal(names, t.islands) && !p.outOfBand() {
		return t, nil, nil
	}
	p.evacuate()
	p.fit()
	p.overshoot()

	var owners [Buckets]string
	for b, i := range p.owner {
		owners[b] = p.isl[i].name
	}
	next, err := New(t.epoch+1, owners, names)
	if err != nil {
		return Table{}, nil, fmt.Errorf("rebalance: %w", err) // unreachable: every owner is present
	}
	var moves []Move
	for b := range Buckets {
		if from, to := t.Island(uint8(b)), next.Island(uint8(b)); from != to {
			moves = append(moves, Move{Bucket: uint8(b), From: from, To: to, Bytes: loads[b]})
		}
	}
	if len(moves) == 0 && slices.Equal(names, t.islands) {
		return t, nil, nil // outside the band, but no whole bucket helps
	}
	return next, moves, nil
}

// packing is Rebalance's working state: every island of the old table or
// the new list, its target and current load, and who owns each bucket.
type packing struct {
	isl       []packIsland // sorted by name
	owner     [Buckets]int // index into isl
	w         [Buckets]float64
	threshold float64
}

type packIsland struct {
	name    string
	present bool    // in the new list (else removed: target 0)
	target  float64 // weight it should hold
	load    float64 // weight it holds
	gains   bool    // below target at the start: may only gain
	loses   bool    // above target at the start, or removed: may only lose
}

func newPacking(t Table, caps map[string]float64, loads Loads, threshold float64) *packing {
	names := slices.Clone(t.islands)
	for n := range caps {
		names = append(names, n)
	}
	slices.Sort(names)
	names = slices.Compact(names)
	p := &packing{isl: make([]packIsland, len(names)), threshold: threshold}
	var total, capSum float64
	for i, n := range names {
		_, p.isl[i].present = caps[n]
		p.isl[i].name = n
		capSum += caps[n]
	}
	p.w = Weights(loads)
	for b := range Buckets {
		total += p.w[b]
		i, _ := slices.BinarySearch(names, t.Island(uint8(b)))
		p.owner[b] = i
		p.isl[i].load += p.w[b]
	}
	for i := range p.isl {
		is := &p.isl[i]
		if is.present {
			is.target = total * caps[is.name] / capSum
		}
		is.gains = is.present && is.load < is.target
		is.loses = !is.present || is.load > is.target
	}
	return p
}

// Weights returns Rebalance's weight of each bucket: its bytes plus the
// mean bytes of the buckets holding any, at least 1.
func Weights(loads Loads) [Buckets]float64 {
	var sum float64
	used := 0
	for _, l := range loads {
		sum += float64(l)
		if l > 0 {
			used++
		}
	}
	base := max(1, sum/float64(max(used, 1)))
	var w [Buckets]float64
	for b, l := range loads {
		w[b] = float64(l) + base
	}
	return w
}

func (p *packing) presentNames() []string {
	var out []string
	for _, is := range p.isl {
		if is.present {
			out = append(out, is.name)
		}
	}
	return out
}

// outOfBand reports whether some kept island's load is further from its
// target than the threshold allows.
func (p *packing) outOfBand() bool {
	for _, is := range p.isl {
		if is.present && math.Abs(is.load-is.target) > p.threshold*is.target {
			return true
		}
	}
	return false
}

func (p *packing) move(b, to int) {
	p.isl[p.owner[b]].load -= p.w[b]
	p.isl[to].load += p.w[b]
	p.owner[b] = to
}

// neediest returns the gaining island furthest below its target, or -1
// when no gaining island is below it. With force it returns the gaining
// island least above its target when none is below (a removed island's
// bucket must go somewhere).
func (p *packing) neediest(force bool) int {
	best := -1
	for j, is := range p.isl {
		if !is.gains {
			continue
		}
		if best < 0 || is.target-is.load > p.isl[best].target-p.isl[best].load {
			best = j
		}
	}
	if best >= 0 && !force && p.isl[best].load >= p.isl[best].target {
		return -1
	}
	return best
}

// heavierFirst orders buckets by weight, heaviest first, then by number.
func (p *packing) heavierFirst(bs []int) {
	slices.SortStableFunc(bs, func(a, b int) int {
		switch {
		case p.w[a] > p.w[b]:
			return -1
		case p.w[a] < p.w[b]:
			return 1
		}
		return a - b
	})
}

// evacuate moves every bucket of a removed island, heaviest first, to the
// gaining island furthest below its target. There is always a gaining
// island: the kept islands' targets sum to the total, so together they
// lack at least what the removed islands hold.
func (p *packing) evacuate() {
	var bs []int
	for b, i := range p.owner {
		if !p.isl[i].present {
			bs = append(bs, b)
		}
	}
	p.heavierFirst(bs)
	for _, b := range bs {
		p.move(b, p.neediest(true))
	}
}

// fit moves, while one exists, the heaviest bucket of an island above its
// target that fits both that island's excess and the largest deficit, to
// the island with that deficit. Each such move brings both islands nearer
// their targets by the whole bucket, so the bytes moved here never exceed
// the total excess.
func (p *packing) fit() {
	for {
		j := p.neediest(false)
		if j < 0 {
			return
		}
		deficit := p.isl[j].target - p.isl[j].load
		best := -1
		for b, i := range p.owner {
			is := p.isl[i]
			if !is.loses || !is.present {
				continue
			}
			if p.w[b] <= min(is.load-is.target, deficit) && (best < 0 || p.w[b] > p.w[best]) {
				best = b
			}
		}
		if best < 0 {
			return
		}
		p.move(best, j)
	}
}

// overshoot, while some island is outside the band, makes the move from a
// losing island above its target to a gaining island below it that most
// reduces the summed distance from the targets. No bucket fits any more
// (fit ran first), so each such move carries one of its two islands past
// its target, after which that island takes no further part: there are at
// most as many of these moves as islands, and each loser sheds less than
// one bucket more than its excess.
func (p *packing) overshoot() {
	for p.outOfBand() {
		bestB, bestJ, bestR := -1, -1, 0.0
		for b, i := range p.owner {
			from := p.isl[i]
			e := from.load - from.target
			if !from.loses || !from.present || e <= 0 {
				continue
			}
			w := p.w[b]
			for j, to := range p.isl {
				d := to.target - to.load
				if !to.gains || d <= 0 {
					continue
				}
				r := e + d - math.Abs(e-w) - math.Abs(d-w)
				better := r > bestR ||
					r == bestR && bestB >= 0 && (w < p.w[bestB] || w == p.w[bestB] && b < bestB)
				if r > 0 && better {
					bestB, bestJ, bestR = b, j, r
				}
			}
		}
		if bestB < 0 {
			return
		}
		p.move(bestB, bestJ)
	}
}

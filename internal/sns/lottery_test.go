package sns

import (
	"math"
	"math/rand/v2"
	"testing"
)

// TestPickFollowsTickets: over many draws each worker is chosen in
// proportion to 1/(1+load).
func TestPickFollowsTickets(t *testing.T) {
	loads := []int{0, 1, 3, 9}
	want := []float64{1, 0.5, 0.25, 0.1}
	sum := 0.0
	for _, w := range want {
		sum += w
	}
	r := rand.New(rand.NewPCG(1, 2))
	const n = 200000
	got := make([]int, len(loads))
	for i := 0; i < n; i++ {
		got[Pick(loads, r.Float64())]++
	}
	for i := range loads {
		share, exp := float64(got[i])/n, want[i]/sum
		if math.Abs(share-exp) > 0.01 {
			t.Errorf("worker with load %d chosen %.3f of the time, want %.3f", loads[i], share, exp)
		}
	}
	if Pick([]int{5}, 0.99) != 0 || Pick([]int{0, 0}, 0) != 0 || Pick([]int{0, 0}, 0.999) != 1 {
		t.Error("edges")
	}
}

// TestCorrectionSpreadsABurst: within one report interval, a burst of
// tasks dispatched with the correction (each task adds to the chosen
// worker's load) spreads over the workers, where without it every task
// goes by the same stale loads and the idle-looking worker gets far more
// than its share (the oscillation of SNS Fig. 2a).
func TestCorrectionSpreadsABurst(t *testing.T) {
	run := func(correct bool) (maxShare float64) {
		r := rand.New(rand.NewPCG(3, 4))
		reported := []int{0, 6, 6, 6} // one worker looked idle at the last report
		got := make([]int, len(reported))
		for task := 0; task < 40; task++ {
			loads := make([]int, len(reported))
			for i := range reported {
				loads[i] = reported[i]
				if correct {
					loads[i] += got[i]
				}
			}
			got[Pick(loads, r.Float64())]++
		}
		return float64(got[0]) / 40
	}
	without, with := run(false), run(true)
	if without < 0.6 || with > 0.45 {
		t.Errorf("share of the burst on the idle-looking worker: %.2f without correction, %.2f with", without, with)
	}
}

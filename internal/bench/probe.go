package bench

import "math"

// Probe defaults.
const (
	// DefaultMissLimit is the share of requests of a step that may miss the
	// deadline before the step counts as overloaded ("increasing the number
	// of outstanding requests until at least 10% of them fail to complete
	// within two seconds").
	DefaultMissLimit = 0.10
	// DefaultProbeStart is the number of workers of the first step.
	DefaultProbeStart = 2
	// DefaultProbeGrowth multiplies the concurrency after a good step while
	// no step has been overloaded yet.
	DefaultProbeGrowth = 1.5
	// DefaultProbeMax caps the concurrency.
	DefaultProbeMax = 1024
)

// StepResult is what the probe needs to know about a finished step.
type StepResult struct {
	Concurrency int
	Requests    int64 // requests finished in the step
	Misses      int64 // late or failed requests among them
}

// Probe decides the concurrency of the next step from the result of the
// last one. It is a pure state machine: the caller runs the steps.
//
// It grows the concurrency geometrically (×Growth, at least +1) while steps
// stay under MissLimit. After the first overloaded step it "reduces the
// request rate and resumes probing" (Porcupine §6.1) by bisecting between
// the highest good and the lowest overloaded concurrency, and stops when the
// two are within an eighth of each other (or adjacent).
type Probe struct {
	Start     int
	Max       int
	Growth    float64
	MissLimit float64

	good int // highest concurrency whose step stayed under MissLimit; 0 if none
	bad  int // lowest concurrency whose step went over; 0 if none
}

// NewProbe returns a probe with the default parameters.
func NewProbe() *Probe {
	return &Probe{Start: DefaultProbeStart, Max: DefaultProbeMax,
		Growth: DefaultProbeGrowth, MissLimit: DefaultMissLimit}
}

// Overloaded tells whether a step missed the deadline too often. A step in
// which nothing finished at all is overloaded.
func (p *Probe) Overloaded(r StepResult) bool {
	if r.Requests == 0 {
		return true
	}
	return float64(r.Misses)/float64(r.Requests) >= p.MissLimit
}

// Next records r and returns the concurrency of the next step, or done.
func (p *Probe) Next(r StepResult) (next int, done bool) {
	c := r.Concurrency
	if p.Overloaded(r) {
		if p.bad == 0 || c < p.bad {
			p.bad = c
		}
	} else if c > p.good {
		p.good = c
	}
	if p.good >= p.bad && p.bad != 0 {
		// A later step at a higher load went fine after all (noise):
		// forget the overload and keep probing upwards from there.
		p.bad = 0
	}

	if p.bad == 0 { // still climbing
		if p.good >= p.Max {
			return 0, true
		}
		next = int(math.Ceil(float64(p.good) * p.Growth))
		next = min(max(next, p.good+1), p.Max)
		return next, false
	}
	if p.good == 0 { // even the smallest step so far was overloaded
		if p.bad <= 1 {
			return 0, true
		}
		return p.bad / 2, false
	}
	if p.bad-p.good <= max(1, p.good/8) {
		return 0, true
	}
	return (p.good + p.bad) / 2, false
}

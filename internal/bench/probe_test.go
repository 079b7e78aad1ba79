package bench

import (
	"math/rand/v2"
	"testing"
)

// drive runs the probe against a server that misses the deadline for more
// than 10% of requests once the concurrency exceeds capacity.
func drive(t *testing.T, p *Probe, capacity int) (tried []int) {
	t.Helper()
	c := p.Start
	for range 100 {
		tried = append(tried, c)
		r := StepResult{Concurrency: c, Requests: 1000, Misses: 10}
		if c > capacity {
			r.Misses = 200
		}
		next, done := p.Next(r)
		if done {
			return tried
		}
		if next < 1 || next > p.Max {
			t.Fatalf("next concurrency %d out of [1, %d]", next, p.Max)
		}
		c = next
	}
	t.Fatalf("probe did not finish: %v", tried)
	return nil
}

func TestProbeFindsCapacity(t *testing.T) {
	for _, capacity := range []int{1, 2, 3, 7, 16, 40, 100, 500} {
		p := NewProbe()
		tried := drive(t, p, capacity)
		// It must have tried a concurrency at or near capacity and one
		// above it, and stop with good and bad close together.
		if p.bad == 0 || p.bad <= capacity {
			t.Errorf("capacity %d: never overloaded (steps %v)", capacity, tried)
		}
		if p.good > capacity || (capacity >= p.Start && p.good == 0) {
			t.Errorf("capacity %d: good = %d (steps %v)", capacity, p.good, tried)
		}
		if capacity >= p.Start && p.bad-p.good > max(1, p.good/8) {
			t.Errorf("capacity %d: stopped with good %d bad %d (steps %v)", capacity, p.good, p.bad, tried)
		}
		// Growth is geometric: few steps.
		if len(tried) > 20 {
			t.Errorf("capacity %d: %d steps", capacity, len(tried))
		}
		t.Logf("capacity %d: %v", capacity, tried)
	}
}

func TestProbeStopsAtMax(t *testing.T) {
	p := NewProbe()
	p.Max = 10
	tried := drive(t, p, 1000)
	if last := tried[len(tried)-1]; last != 10 {
		t.Errorf("steps %v, want to end at 10", tried)
	}
}

func TestProbeOverloadedAtStart(t *testing.T) {
	p := NewProbe()
	p.Start = 8
	tried := drive(t, p, 0)
	if last := tried[len(tried)-1]; last != 1 {
		t.Errorf("steps %v, want to go down to 1", tried)
	}
}

func TestProbeThreshold(t *testing.T) {
	p := NewProbe()
	if p.Overloaded(StepResult{Concurrency: 2, Requests: 100, Misses: 9}) {
		t.Error("9% overloaded")
	}
	if !p.Overloaded(StepResult{Concurrency: 2, Requests: 100, Misses: 10}) {
		t.Error("10% not overloaded")
	}
	if !p.Overloaded(StepResult{Concurrency: 2}) {
		t.Error("a step with nothing finished must be overloaded")
	}
}

// TestProbeNoisy checks that random noise near the threshold never makes
// the probe leave its bounds or run forever.
func TestProbeNoisy(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	for trial := range 200 {
		p := NewProbe()
		c := p.Start
		done := false
		for step := 0; step < 200 && !done; step++ {
			missRate := float64(c) / 60 * (0.05 + 0.1*r.Float64())
			res := StepResult{Concurrency: c, Requests: 1000, Misses: int64(missRate * 1000)}
			var next int
			next, done = p.Next(res)
			if !done {
				if next < 1 || next > p.Max {
					t.Fatalf("trial %d: next %d", trial, next)
				}
				c = next
			}
		}
		if !done {
			t.Fatalf("trial %d: no end", trial)
		}
	}
}

// Package retry runs an operation again after a failure, waiting between
// tries with exponential backoff and jitter. Every retry loop between nodes
// uses it, so the waits are named in one place per loop (a Policy) and nodes
// that fail together do not retry in step (SNS §3.5: randomized timers keep
// a cluster's components from synchronising).
package retry

import (
	"context"
	"math/rand/v2"
	"time"
)

// Policy says how often and how long to retry.
type Policy struct {
	// Attempts is how many tries in all (0: until the context ends).
	Attempts int
	// Base is the wait after the first failure; each later wait grows by
	// Factor (1 or less: constant) up to Max (0: no bound).
	Base   time.Duration
	Max    time.Duration
	Factor float64
}

// Wait returns the wait after the try numbered n (0 for the first): the
// exponential step and up to half of it again at random, so it is never
// shorter than planned (a loop's total wait is at least the sum of its
// steps) and never in step with others.
func (p Policy) Wait(n int) time.Duration {
	d := float64(p.Base)
	for i := 0; i < n && p.Factor > 1; i++ {
		d *= p.Factor
		if p.Max > 0 && d >= float64(p.Max) {
			break
		}
	}
	if p.Max > 0 && d > float64(p.Max) {
		d = float64(p.Max)
	}
	return time.Duration(d + rand.Float64()*d/2)
}

// Do calls op until it succeeds, fails with an error retryable rejects (nil
// retryable: every error is worth another try), the attempts are used up,
// or ctx ends. It returns op's last error, or ctx's if ctx ended first.
func Do(ctx context.Context, p Policy, retryable func(error) bool, op func(ctx context.Context) error) error {
	for n := 0; ; n++ {
		err := op(ctx)
		if err == nil || (retryable != nil && !retryable(err)) {
			return err
		}
		if p.Attempts > 0 && n+1 >= p.Attempts {
			return err
		}
		if !Sleep(ctx, p.Wait(n)) {
			return ctx.Err()
		}
	}
}

// Sleep waits d or until ctx ends, and reports whether it waited it out.
func Sleep(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}

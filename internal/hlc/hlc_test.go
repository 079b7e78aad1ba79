package hlc

import (
	"testing"
	"time"
)

// A node whose wall clock is 500 ms behind still orders its update after an
// update it has observed from a node that is ahead.
func TestSkewedClocksOrderAfterObserved(t *testing.T) {
	base := time.Now()
	ahead := &Clock{now: func() time.Time { return base.Add(500 * time.Millisecond) }}
	behind := &Clock{now: func() time.Time { return base }}
	t1 := ahead.Now()
	behind.Observe(t1)
	t2 := behind.Now()
	if t2 <= t1 {
		t.Fatalf("update after observing %d got %d", t1, t2)
	}
	if t3 := behind.Now(); t3 <= t2 {
		t.Fatal("clock went backwards")
	}
}

func TestMonotonicWithStoppedWallClock(t *testing.T) {
	now := time.Now()
	c := &Clock{now: func() time.Time { return now }}
	prev := c.Now()
	for i := 0; i < 1000; i++ {
		n := c.Now()
		if n <= prev {
			t.Fatal("not strictly increasing")
		}
		prev = n
	}
	if prev.Wall().UnixMilli() != now.UnixMilli() {
		t.Fatal("wall part drifted")
	}
}

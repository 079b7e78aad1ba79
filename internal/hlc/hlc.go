// Package hlc is a hybrid logical clock (Kulkarni et al., 2014): timestamps
// that follow wall time but never go backwards and always exceed every
// timestamp the node has seen from others. Mutable records (profiles,
// passwords) are ordered by them, so a node whose wall clock is behind by
// up to the skew still orders its update after the one it has seen
// (BLUEPRINT invariant 6).
package hlc

import (
	"sync"
	"time"
)

// A Timestamp is wall milliseconds in the high 48 bits and a logical
// counter in the low 16.
type Timestamp uint64

const logicalBits = 16

// Wall returns the wall-clock part.
func (t Timestamp) Wall() time.Time { return time.UnixMilli(int64(t >> logicalBits)) }

// Clock issues timestamps.
type Clock struct {
	mu   sync.Mutex
	last Timestamp
	now  func() time.Time
}

// New returns a clock on the system time.
func New() *Clock { return &Clock{now: time.Now} }

// NewSkewed returns a clock on the system time shifted by skew: a test of a
// cluster whose wall clocks disagree.
func NewSkewed(skew time.Duration) *Clock {
	if skew == 0 {
		return New()
	}
	return &Clock{now: func() time.Time { return time.Now().Add(skew) }}
}

// Now returns a timestamp greater than every one issued or observed before.
func (c *Clock) Now() Timestamp {
	c.mu.Lock()
	defer c.mu.Unlock()
	wall := Timestamp(c.now().UnixMilli()) << logicalBits
	if wall > c.last {
		c.last = wall
	} else {
		c.last++
	}
	return c.last
}

// Observe moves the clock past a timestamp seen from another node.
func (c *Clock) Observe(t Timestamp) {
	c.mu.Lock()
	if t > c.last {
		c.last = t
	}
	c.mu.Unlock()
}

package metrics

import (
	"testing"
	"time"

	"github.com/cockroachdb/pebble"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

// fsyncBuckets reports Pebble's WAL fsync histogram (nanoseconds, on
// pebble.FsyncLatencyBuckets) in seconds on the bounds nearest
// fsyncTargets, each count exactly Pebble's at that bound.
func TestFsyncBucketsInSeconds(t *testing.T) {
	h := prometheus.NewHistogram(prometheus.HistogramOpts{Buckets: pebble.FsyncLatencyBuckets})
	for _, d := range []time.Duration{50 * time.Microsecond, 300 * time.Microsecond, 800 * time.Microsecond,
		3 * time.Millisecond, 40 * time.Millisecond, 2 * time.Second, 30 * time.Second} {
		h.Observe(float64(d))
	}
	var m dto.Metric
	if err := h.Write(&m); err != nil {
		t.Fatal(err)
	}
	count, sum, buckets := fsyncBuckets(m.Histogram)
	if count != 7 {
		t.Errorf("count %d, want 7", count)
	}
	if want := (50e-6 + 300e-6 + 800e-6 + 3e-3 + 40e-3 + 2 + 30); sum < want-1e-9 || sum > want+1e-9 {
		t.Errorf("sum %v s, want %v", sum, want)
	}
	if len(buckets) != len(fsyncTargets) {
		t.Errorf("%d buckets, want one per target (%d): %v", len(buckets), len(fsyncTargets), buckets)
	}
	// Bounds exactly Pebble's (multiples of 100 µs below 5 ms), and the
	// observations at or below each.
	for bound, want := range map[float64]uint64{0.0001: 1, 0.0005: 2, 0.001: 3, 0.005: 4, 10: 6} {
		if got, ok := buckets[bound]; !ok || got != want {
			t.Errorf("bucket le=%v: %d (present %v), want %d; all: %v", bound, got, ok, want, buckets)
		}
	}
	// Above 5 ms Pebble's bounds are exponential: each target has a
	// reported bound within 9%.
	for _, target := range fsyncTargets {
		found := false
		for bound := range buckets {
			if bound <= target*1.09 && bound >= target/1.09 {
				found = true
			}
		}
		if !found {
			t.Errorf("no bucket bound within 9%% of %v s: %v", target, buckets)
		}
	}
}

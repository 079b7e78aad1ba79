package telemetry

import "time"

// Window is how many minutes a Series keeps: the console's charts show the
// last hour.
const Window = 60

// Series turns readings of a counter that only grows (deliveries, logins)
// into counts per minute over the last Window minutes. It keeps the
// counter's reading at the start of each minute; a minute's count is the
// difference between its start and the next one's (or the reading now, for
// the minute in progress). It is a pure value: the caller reads the clock
// and the counter, so tests drive it with any times.
type Series struct {
	last  int64 // the newest minute (Unix minutes) with a start reading; 0: none yet
	start [Window]float64
	known [Window]bool
}

func minuteOf(t time.Time) int64 { return t.Unix() / 60 }

// Observe records the counter's reading v at time now. Call it at least
// once a minute for exact counts: the minutes it did not see (a paused
// process) start with the next reading, so their counts fall on the minute
// before the gap.
func (s *Series) Observe(now time.Time, v float64) {
	m := minuteOf(now)
	if s.last == 0 {
		s.last = m
		s.set(m, v)
		return
	}
	for s.last < m {
		s.last++
		s.set(s.last, v)
		if m-s.last >= Window { // a gap longer than the window: skip to now
			s.last = m - Window
		}
	}
}

func (s *Series) set(m int64, v float64) {
	i := int(m % Window)
	s.start[i], s.known[i] = v, true
}

// Counts returns, given the counter's reading v now, the start of the
// oldest minute shown and the count of each of the last Window minutes,
// oldest first; the last is the minute in progress. Minutes before the
// first reading count 0.
func (s *Series) Counts(now time.Time, v float64) (time.Time, []float64) {
	s.Observe(now, v)
	m := minuteOf(now)
	first := m - Window + 1
	out := make([]float64, Window)
	for k := range Window {
		mk := first + int64(k)
		if mk > s.last || mk <= s.last-Window {
			continue
		}
		i := int(mk % Window)
		if !s.known[i] {
			continue
		}
		end := v
		if mk < m {
			j := int((mk + 1) % Window)
			if !s.known[j] {
				continue
			}
			end = s.start[j]
		}
		out[k] = max(0, end-s.start[i])
	}
	return time.Unix(first*60, 0), out
}

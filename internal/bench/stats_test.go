package bench

import (
	"errors"
	"fmt"
	"io"
	"os"
	"testing"
	"time"

	"github.com/emersion/go-smtp"
)

func TestPercentileNearestRank(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	for p, want := range map[float64]int{50: 50, 90: 90, 99: 99, 100: 100, 0.1: 1} {
		if got := Percentile(s, p); got != time.Duration(want)*time.Millisecond {
			t.Errorf("p%v = %v, want %dms", p, got, want)
		}
	}
	if Percentile(nil, 50) != 0 {
		t.Error("empty")
	}
	one := []time.Duration{7}
	if Percentile(one, 1) != 7 || Percentile(one, 99) != 7 {
		t.Error("single value")
	}
}

func TestSummarize(t *testing.T) {
	in := []time.Duration{3 * time.Millisecond, time.Millisecond, 2 * time.Millisecond, 10 * time.Millisecond}
	s := Summarize(in)
	want := LatencySummary{Count: 4, Mean: 4, P50: 2, P90: 10, P99: 10, Max: 10}
	if s != want {
		t.Errorf("got %+v, want %+v", s, want)
	}
	if in[0] != 3*time.Millisecond {
		t.Error("Summarize sorted its input")
	}
}

func TestStatsAdd(t *testing.T) {
	const dl = 2 * time.Second
	var s Stats
	s.Add(Result{Op: OpSMTP, Latency: time.Second, Delivered: true, BytesSent: 1000}, dl)
	s.Add(Result{Op: OpSMTP, Latency: 3 * time.Second, Delivered: true, BytesSent: 3000}, dl)
	s.Add(Result{Op: OpSMTP, Err: ErrSMTP4xx}, dl)
	// Delivered, then QUIT failed: a delivery and an error.
	s.Add(Result{Op: OpSMTP, Delivered: true, BytesSent: 2000, Err: ErrOther}, dl)
	s.Add(Result{Op: OpPOP, Latency: time.Millisecond, Retrieved: 3, BytesRetrieved: 300}, dl)
	s.Add(Result{Op: OpPOP, Err: ErrPOP, Retrieved: 1, BytesRetrieved: 100}, dl)
	s.Add(Result{Op: OpPOP, Aborted: true}, dl)

	check := func(name string, got, want int64) {
		t.Helper()
		if got != want {
			t.Errorf("%s = %d, want %d", name, got, want)
		}
	}
	check("Requests", s.Requests, 6)
	check("Delivered", s.Delivered, 3)
	check("BytesSent", s.BytesSent, 6000)
	check("POP", s.POP, 1)
	check("Retrieved", s.Retrieved, 4)
	check("Aborted", s.Aborted, 1)
	check("Over smtp", s.Over[OpSMTP], 1)
	check("errors", s.ErrorCount(), 3)
	check("misses", s.Misses(), 4)
	if f := s.MissFraction(); f != 4.0/6 {
		t.Errorf("miss fraction %v", f)
	}
	if m := s.MeanSize(); m != 2000 {
		t.Errorf("mean size %v", m)
	}
	if l := s.Latency(OpSMTP); l.Count != 2 || l.Max != 3000 {
		t.Errorf("smtp latency %+v", l)
	}

	var all Stats
	all.Merge(&s)
	all.Merge(&s)
	check("merged Requests", all.Requests, 12)
	check("merged smtp_4xx", all.Errors[ErrSMTP4xx], 2)
	if l := all.Latency(OpPOP); l.Count != 2 {
		t.Errorf("merged pop latency %+v", l)
	}
}

func TestClassify(t *testing.T) {
	for _, c := range []struct {
		err  error
		want ErrKind
	}{
		{nil, ErrNone},
		{&smtp.SMTPError{Code: 451}, ErrSMTP4xx},
		{fmt.Errorf("wrapped: %w", &smtp.SMTPError{Code: 554}), ErrSMTP5xx},
		{&popError{cmd: "PASS", text: "no"}, ErrPOP},
		{os.ErrDeadlineExceeded, ErrTimeout},
		{io.ErrUnexpectedEOF, ErrOther},
		{errors.New("x"), ErrOther},
	} {
		if got := classify(c.err); got != c.want {
			t.Errorf("classify(%v) = %q, want %q", c.err, got, c.want)
		}
	}
}

func TestBestStep(t *testing.T) {
	steps := []StepReport{
		{Concurrency: 2, MsgsPerSec: 100},
		{Concurrency: 4, MsgsPerSec: 180},
		{Concurrency: 8, MsgsPerSec: 250, Overloaded: true},
		{Concurrency: 6, MsgsPerSec: 300, Partial: true},
		{Concurrency: 5, MsgsPerSec: 190},
	}
	if b := BestStep(steps); b != 4 {
		t.Errorf("best %d, want 4", b)
	}
	if b := BestStep(steps[2:4]); b != 1 {
		t.Errorf("best of bad steps %d, want 1 (the fastest)", b)
	}
	if BestStep(nil) != -1 {
		t.Error("no steps")
	}
}

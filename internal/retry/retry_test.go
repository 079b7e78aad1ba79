package retry

import (
	"context"
	"errors"
	"testing"
	"time"
)

func TestWaitGrowsWithJitterUpToMax(t *testing.T) {
	p := Policy{Base: 100 * time.Millisecond, Max: 400 * time.Millisecond, Factor: 2}
	for n, want := range []time.Duration{100, 200, 400, 400, 400} {
		want *= time.Millisecond
		for i := 0; i < 50; i++ {
			if w := p.Wait(n); w < want || w > want*3/2 {
				t.Fatalf("wait %d = %v, want within [%v, %v]", n, w, want, want*3/2)
			}
		}
	}
}

func TestDoStopsOnSuccessAttemptsAndUnretryable(t *testing.T) {
	p := Policy{Attempts: 3, Base: time.Millisecond}
	boom, fatal := errors.New("boom"), errors.New("fatal")
	tries := 0
	err := Do(context.Background(), p, nil, func(context.Context) error { tries++; return boom })
	if !errors.Is(err, boom) || tries != 3 {
		t.Fatalf("used up: %v after %d tries", err, tries)
	}
	tries = 0
	err = Do(context.Background(), p, func(e error) bool { return e != fatal }, func(context.Context) error { tries++; return fatal })
	if err != fatal || tries != 1 {
		t.Fatalf("unretryable: %v after %d tries", err, tries)
	}
	tries = 0
	err = Do(context.Background(), p, nil, func(context.Context) error {
		if tries++; tries < 2 {
			return boom
		}
		return nil
	})
	if err != nil || tries != 2 {
		t.Fatalf("success on the second: %v after %d tries", err, tries)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	err = Do(ctx, Policy{Base: time.Hour}, nil, func(context.Context) error { return boom })
	if !errors.Is(err, context.Canceled) {
		t.Fatalf("cancelled: %v", err)
	}
}

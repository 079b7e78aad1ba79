package guard

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

func TestSendsLimitPerUserAndWindow(t *testing.T) {
	s := NewSends(3)
	t0 := time.Now()
	for i := 0; i < 3; i++ {
		if ok, n := s.Allow("a@x", t0); !ok || n != i {
			t.Fatalf("message %d: allow %v after %d", i, ok, n)
		}
		s.Note("a@x", t0.Add(time.Duration(i)*time.Minute))
	}
	if ok, n := s.Allow("a@x", t0.Add(3*time.Minute)); ok || n != 3 {
		t.Fatalf("4th message allowed (%d sent)", n)
	}
	if ok, _ := s.Allow("b@x", t0); !ok {
		t.Fatal("another user refused")
	}
	// A message noted from another node, out of order, counts too; the
	// oldest leaves the window first.
	s2 := NewSends(2)
	s2.Note("a@x", t0.Add(10*time.Minute))
	s2.Note("a@x", t0)
	if ok, _ := s2.Allow("a@x", t0.Add(11*time.Minute)); ok {
		t.Fatal("limit ignored a message noted late")
	}
	if ok, n := s2.Allow("a@x", t0.Add(SendWindow)); !ok || n != 1 {
		t.Fatalf("after the first left the window: allow %v, %d", ok, n)
	}
	if ok, _ := NewSends(0).Allow("a@x", t0); !ok {
		t.Fatal("no limit refused")
	}
}

// Take checks and counts in one step: of many sessions of one user taking
// at once, exactly the limit get through; Undo gives a count back.
func TestTakeIsAtomic(t *testing.T) {
	s := NewSends(10)
	now := time.Now()
	var ok atomic.Int32
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if took, _ := s.Take("u@x", now.Add(time.Duration(i)*time.Millisecond)); took {
				ok.Add(1)
			}
		}(i)
	}
	wg.Wait()
	if ok.Load() != 10 {
		t.Fatalf("%d of 50 parallel takes got through, want the limit of 10", ok.Load())
	}
	if took, n := s.Take("u@x", now.Add(time.Second)); took || n != 10 {
		t.Fatalf("take past the limit: %v, %d", took, n)
	}
	// A message not accepted after all gives its count back.
	at := now.Add(49 * time.Millisecond)
	s2 := NewSends(1)
	if took, _ := s2.Take("v@x", at); !took {
		t.Fatal("first take refused")
	}
	s2.Undo("v@x", at)
	if took, _ := s2.Take("v@x", at.Add(time.Millisecond)); !took {
		t.Fatal("take after undo refused")
	}
}

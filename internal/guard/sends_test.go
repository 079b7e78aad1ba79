package guard

import (
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

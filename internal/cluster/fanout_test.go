package cluster

import (
	"context"
	"errors"
	"testing"
	"time"
)

// Ask answers with what arrived in time and, for a node that did not
// answer, its last answer marked stale; it does not wait for a node that
// never answers, and keeps that node's late answer for the next time.
func TestRecallStandsInForLateNodes(t *testing.T) {
	var r Recall[string]
	nodes := []NodeID{"a", "b", "c"}
	const wait = 50 * time.Millisecond
	fresh := func(_ context.Context, n NodeID) (string, error) {
		if n == "c" {
			return "", errors.New("c: refused")
		}
		return string(n) + "1", nil
	}
	got := r.Ask(context.Background(), nodes, wait, fresh)
	if got[0].Value != "a1" || got[1].Value != "b1" || got[0].Stale != nil || got[1].Err != nil {
		t.Fatalf("fresh answers: %+v", got)
	}
	if got[2].Err == nil || got[2].Stale != nil || got[2].Value != "" {
		t.Fatalf("a node that never answered: %+v", got[2])
	}

	release := make(chan struct{})
	late := make(chan struct{})
	got = r.Ask(context.Background(), nodes, wait, func(ctx context.Context, n NodeID) (string, error) {
		if n == "b" {
			<-release // a handler that ignores its deadline
			defer close(late)
			return "b2", nil
		}
		return fresh(ctx, n)
	})
	close(release) // Ask returned without waiting for b
	if b := got[1]; b.Err == nil || b.Stale == nil || b.Value != "b1" || b.Stale.AsOf.IsZero() {
		t.Fatalf("late node: %+v, want its last answer b1 marked stale", b)
	}
	if got[0].Value != "a1" || got[0].Stale != nil {
		t.Fatalf("a: %+v", got[0])
	}
	<-late
	waitFor(t, "b's late answer to be kept", time.Second, func() bool {
		v, st := r.recall("b", time.Now())
		return v == "b2" && st != nil
	})
}

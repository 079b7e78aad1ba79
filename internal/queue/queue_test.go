package queue

import (
	"testing"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
)

// TestDeletedStaysDeleted: once an entry is done or deleted here, a newer
// live state (an attempt's outcome written after the delete) does not
// bring it back; a tombstone left by a move does take the entry back.
func TestDeletedStaysDeleted(t *testing.T) {
	db := openTestDB(t)
	s, err := Open("n-a", db, nil)
	if err != nil {
		t.Fatal(err)
	}
	e := entry("bob@a.example")
	e.Replicas = []cluster.NodeID{"n-a"}
	apply := func(e *Entry, body []byte) replica.Outcome {
		data, err := encode(e)
		if err != nil {
			t.Fatal(err)
		}
		outs, err := s.Apply([]*replica.Update{{Object: objectName(e.ID), Stamp: e.Stamp, Targets: e.Replicas, Data: data, Blob: body}}, nil)
		if err != nil {
			t.Fatal(err)
		}
		return outs[0]
	}
	e.Stamp = replica.Stamp{Clock: 10, Node: "n-a"}
	if o := apply(e, []byte("msg")); o != replica.Applied {
		t.Fatalf("first state: %v", o)
	}
	del := e.Clone()
	del.Stamp.Clock, del.Deleted = 20, true
	if o := apply(del, nil); o != replica.Applied {
		t.Fatalf("delete: %v", o)
	}
	late := e.Clone()
	late.Stamp.Clock = 30
	if o := apply(late, nil); o != replica.Stale {
		t.Fatalf("a live state after the delete: %v, want refused as stale", o)
	}
	if _, ok := s.Get(e.ID); ok {
		t.Fatal("deleted entry came back")
	}

	// Moved away (a state naming other replicas), then moved back.
	m := entry("carol@a.example")
	m.Replicas, m.Stamp = []cluster.NodeID{"n-a"}, replica.Stamp{Clock: 10, Node: "n-a"}
	apply(m, []byte("msg"))
	away := m.Clone()
	away.Replicas, away.Stamp.Clock = []cluster.NodeID{"n-b"}, 20
	apply(away, nil)
	if tomb, ok := s.lookup(m.ID); !ok || !tomb.Deleted || len(tomb.Replicas) != 1 {
		t.Fatalf("tombstone of a move: %+v", tomb)
	}
	back := m.Clone()
	back.Stamp.Clock = 30
	if o := apply(back, []byte("msg")); o != replica.Applied {
		t.Fatalf("moved back: %v", o)
	}
}

func openTestDB(t *testing.T) *store.DB {
	db, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { db.Close() })
	return db
}

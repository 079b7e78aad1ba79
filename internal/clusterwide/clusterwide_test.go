package clusterwide

import (
	"slices"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
)

func update(t *testing.T, name string, clock uint64, node string, deleted bool, data string) *replica.Update {
	t.Helper()
	o := Object{Name: name, Stamp: replica.Stamp{Clock: hlcTS(clock), Node: cluster.NodeID(node)}, Deleted: deleted, Data: []byte(data)}
	b, err := encode(o)
	if err != nil {
		t.Fatal(err)
	}
	return &replica.Update{Object: objectName(name), Stamp: o.Stamp, Data: b}
}

func open(t *testing.T, dir string) (*Store, *store.DB) {
	t.Helper()
	db, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	s, err := Open(db, nil)
	if err != nil {
		t.Fatal(err)
	}
	return s, db
}

// TestApplyNewestWins: the newer stamp wins whatever the order of
// arrival, a tombstone hides the object, bad input is refused, and all of
// it survives a reopen.
func TestApplyNewestWins(t *testing.T) {
	dir := t.TempDir()
	s, db := open(t, dir)
	var heard []string
	s.OnChange(func(o Object) { heard = append(heard, string(o.Data)) })
	outs, err := s.Apply([]*replica.Update{
		update(t, "tls/a", 10, "n1", false, "v10"),
		update(t, "tls/a", 5, "n2", false, "v5"), // older, same batch
		update(t, "tls/b", 7, "n1", false, "b7"),
		{Object: "w/tls/c", Data: []byte("garbage")},
		update(t, "no-slash", 3, "n1", false, "x"),
	}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if want := []replica.Outcome{replica.Applied, replica.Stale, replica.Applied, replica.Failed, replica.Failed}; !slices.Equal(outs, want) {
		t.Fatalf("outcomes %v, want %v", outs, want)
	}
	if !slices.Equal(heard, []string{"v10", "b7"}) {
		t.Errorf("OnChange heard %q", heard)
	}
	// Same clock, higher node breaks the tie; a tombstone hides it.
	s.Apply([]*replica.Update{update(t, "tls/a", 10, "n3", false, "v10n3")}, nil)
	if o, _ := s.Get("tls/a"); string(o.Data) != "v10n3" {
		t.Errorf("tie not broken by node: %q", o.Data)
	}
	before := s.Digest()
	s.Apply([]*replica.Update{update(t, "tls/b", 8, "n1", true, "")}, nil)
	if _, ok := s.Get("tls/b"); ok {
		t.Error("deleted object still there")
	}
	if s.Digest() == before || s.Digest() == 0 {
		t.Error("digest did not change with a tombstone")
	}
	if got := s.List("tls/"); len(got) != 1 || got[0].Name != "tls/a" {
		t.Errorf("List %v", got)
	}
	digest := s.Digest()
	db.Close()
	s, db = open(t, dir)
	defer db.Close()
	if s.Digest() != digest {
		t.Error("digest changed across a reopen")
	}
	if o, ok := s.Get("tls/a"); !ok || string(o.Data) != "v10n3" {
		t.Errorf("after reopen: %q %v", o.Data, ok)
	}
	if outs, _ := s.Apply([]*replica.Update{update(t, "tls/b", 7, "n1", false, "b7")}, nil); outs[0] != replica.Stale {
		t.Error("an update older than the tombstone brought the object back")
	}
}

func TestNeedPush(t *testing.T) {
	peers := []Peer{{ID: "a", Digest: 5}, {ID: "b", Digest: 7}, {ID: "c", Digest: 0}, {ID: "self", Digest: 1}}
	pushed := map[cluster.NodeID][2]uint64{"b": {5, 7}}
	if got := NeedPush("self", 5, peers, pushed); !slices.Equal(got, []cluster.NodeID{"c"}) {
		t.Errorf("NeedPush = %v, want [c] (a agrees, b was pushed this difference already)", got)
	}
	pushed["b"] = [2]uint64{4, 7}
	if got := NeedPush("self", 5, peers, pushed); !slices.Equal(got, []cluster.NodeID{"b", "c"}) {
		t.Errorf("after our set changed: %v", got)
	}
	if got := NeedPush("self", 0, peers, nil); got != nil {
		t.Errorf("a node holding nothing pushed to %v", got)
	}
}

// TestDiffering: a node holding nothing (a front end on Cassandra that
// has not read the table yet, or an empty table) still reads again for a
// peer that holds something, once per difference.
func TestDiffering(t *testing.T) {
	peers := []Peer{{ID: "a", Digest: 5}, {ID: "b", Digest: 0}, {ID: "self", Digest: 9}}
	if got := Differing("self", 0, peers, nil); !slices.Equal(got, []cluster.NodeID{"a"}) {
		t.Errorf("Differing with nothing held = %v, want [a]", got)
	}
	if got := Differing("self", 0, peers, map[cluster.NodeID][2]uint64{"a": {0, 5}}); got != nil {
		t.Errorf("a difference already acted on: %v", got)
	}
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"tls/mail.example.org", "domain/example.org"} {
		if ValidName(ok) != nil {
			t.Errorf("%q refused", ok)
		}
	}
	for _, bad := range []string{"", "tls", "/x", "tls/", "tls/a b", "tls/a\x00"} {
		if ValidName(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func hlcTS(c uint64) hlc.Timestamp { return hlc.Timestamp(c) }

// TestSweepForgetsOldTombstones: tombstones older than the cutoff go,
// newer ones and live objects stay, and the sweep survives a reopen.
func TestSweepForgetsOldTombstones(t *testing.T) {
	dir := t.TempDir()
	s, db := open(t, dir)
	at := func(d time.Duration) uint64 { return uint64(time.Now().Add(d).UnixMilli()) << 16 }
	s.Apply([]*replica.Update{
		update(t, "acme-http/old", at(-10*24*time.Hour), "n1", true, ""),
		update(t, "acme-http/new", at(-time.Hour), "n1", true, ""),
		update(t, "tls/live", at(-10*24*time.Hour), "n1", false, "cert"),
	}, nil)
	n, err := s.Sweep(time.Now().Add(-7 * 24 * time.Hour))
	if err != nil || n != 1 {
		t.Fatalf("Sweep = %d, %v; want 1", n, err)
	}
	db.Close()
	s, db = open(t, dir)
	defer db.Close()
	s.mu.Lock()
	_, old := s.objects["acme-http/old"]
	_, recent := s.objects["acme-http/new"]
	s.mu.Unlock()
	if old || !recent {
		t.Errorf("after reopen: old tombstone kept %v, recent one kept %v", old, recent)
	}
	if _, ok := s.Get("tls/live"); !ok {
		t.Error("a live object was swept")
	}
}

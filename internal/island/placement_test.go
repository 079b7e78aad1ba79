package island_test

import (
	"errors"
	"fmt"
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/island"
)

func TestBucketsMatchUserMap(t *testing.T) {
	if island.Buckets != cluster.Buckets {
		t.Fatalf("island.Buckets = %d, cluster.Buckets = %d: the table must have one entry per user-map bucket",
			island.Buckets, cluster.Buckets)
	}
}

// node is a live member as the wiring will see it: the user map's member
// and the island from its node meta.
type node struct {
	cluster.Member
	Island string
}

func islandOf(n node) string { return n.Island }

func ids(ns []node) []cluster.NodeID {
	out := make([]cluster.NodeID, len(ns))
	for i, n := range ns {
		out[i] = n.ID
	}
	return out
}

// rankNodes ranks nodes as the user map does (cluster.Ranked), carrying
// their islands along.
func rankNodes(b uint8, ns []node) []node {
	ms := make([]cluster.Member, len(ns))
	byID := map[cluster.NodeID]node{}
	for i, n := range ns {
		ms[i] = n.Member
		byID[n.ID] = n
	}
	var out []node
	for _, m := range cluster.Ranked(b, ms) {
		out = append(out, byID[m.ID])
	}
	return out
}

// TestPlaceOneIsland: for every bucket of random clusters, everything Place
// returns is in the bucket's island, the island's every live member is a
// mail candidate, and the writer and profile nodes are exactly those the
// user map's ranking picks among the island's members alone.
func TestPlaceOneIsland(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 17))
	for c := range 50 {
		isl := []string{"east", "north", "south", "west"}[:1+r.IntN(4)]
		tab, err := island.Initial(isl)
		if err != nil {
			t.Fatal(err)
		}
		var live []node
		for i := range 2 + r.IntN(12) {
			live = append(live, node{cluster.Member{ID: cluster.NodeID(fmt.Sprintf("n%02d", i)), Boot: 1}, isl[r.IntN(len(isl))]})
		}
		// A node whose island the table does not have yet.
		live = append(live, node{cluster.Member{ID: "newcomer", Boot: 1}, "spare"})
		for b := range island.Buckets {
			bucket := uint8(b)
			pl, err := island.Place(bucket, tab, rankNodes(bucket, live), islandOf, 2)
			want := tab.Island(bucket)
			var members []node
			for _, n := range live {
				if n.Island == want {
					members = append(members, n)
				}
			}
			if len(members) == 0 {
				var nl *island.NoLiveMemberError
				if !errors.As(err, &nl) || nl.Bucket != bucket || nl.Island != want {
					t.Fatalf("case %d bucket %d: island %s has no live member, got %v", c, b, want, err)
				}
				continue
			}
			if err != nil {
				t.Fatalf("case %d bucket %d: %v", c, b, err)
			}
			alone := rankNodes(bucket, members)
			if pl.Island != want || !slices.Equal(ids(pl.Mail), ids(alone)) {
				t.Fatalf("case %d bucket %d: mail candidates %v, want %v of island %s", c, b, ids(pl.Mail), ids(alone), want)
			}
			if pl.Writer.ID != alone[0].ID || !slices.Equal(ids(pl.Profile), ids(alone[:min(2, len(alone))])) {
				t.Fatalf("case %d bucket %d: writer %s profile %v, want the island's top of %v", c, b, pl.Writer.ID, ids(pl.Profile), ids(alone))
			}
			if slices.ContainsFunc(pl.Mail, func(n node) bool { return n.ID == "newcomer" }) {
				t.Fatalf("case %d bucket %d: a node of an island without buckets was placed", c, b)
			}
		}
	}
}

func TestPlaceNoLiveMember(t *testing.T) {
	tab, _ := island.Initial([]string{"a", "b"})
	live := []node{{cluster.Member{ID: "n1"}, "a"}, {cluster.Member{ID: "n2"}, "a"}}
	_, err := island.Place(1, tab, live, islandOf, 2) // bucket 1 is b's
	var nl *island.NoLiveMemberError
	if !errors.As(err, &nl) || err.Error() != "bucket 1: island b has no live member" {
		t.Fatalf("bucket of a dead island: %v", err)
	}
	pl, err := island.Place(0, tab, live, islandOf, 5)
	if err != nil || len(pl.Profile) != 2 || pl.Writer.ID != "n1" {
		t.Fatalf("more profile replicas than members: %+v, %v", pl, err)
	}
	// Appending to Profile must not write into Mail.
	pl, _ = island.Place(0, tab, live, islandOf, 1)
	_ = append(pl.Profile, node{cluster.Member{ID: "x"}, "a"})
	if pl.Mail[1].ID != "n2" {
		t.Fatal("Profile shares Mail's spare capacity")
	}
	if _, err := island.Place(0, island.Table{}, live, islandOf, 2); err == nil {
		t.Fatal("placed without a table")
	}
}

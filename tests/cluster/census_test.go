package cluster_test

// The census: after a fault run whose nodes hold fewer copies than the
// acknowledged messages need, every node is stopped and its store read
// directly, to say which messages have fewer copies than their records
// claim and what the other listed replicas keep of them.

import (
	"fmt"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
)

// censusHolder is one node's record of a message.
type censusHolder struct {
	node string
	c    mailbox.Census
}

// census stops every node and reports the messages held (with their
// bytes) by fewer than want nodes: how many, grouped by what their records
// say, with a few examples.
func census(t *testing.T, nodes []*Node, want int) {
	byObject := map[string][]censusHolder{}
	managers := map[string]*mailbox.Manager{}
	for _, n := range nodes {
		n.Stop()
		db, err := store.Open(n.Data)
		if err != nil {
			t.Logf("census: %s: %v", n.ID, err)
			continue
		}
		defer db.Close()
		mm := mailbox.New(db)
		managers[n.ID] = mm
		err = mm.Census(func(c mailbox.Census) error {
			key := c.User + " " + c.Message.ID
			byObject[key] = append(byObject[key], censusHolder{node: n.ID, c: c})
			return nil
		})
		if err != nil {
			t.Logf("census: %s: %v", n.ID, err)
		}
	}
	kinds := map[string]int{}
	var examples []string
	total, short := 0, 0
	for key, hs := range byObject {
		total++
		var with []string
		for _, h := range hs {
			if h.c.Body {
				with = append(with, h.node)
			}
		}
		if len(with) >= want {
			continue
		}
		short++
		// What the records say, and what the listed replicas that lack
		// the message keep of it.
		h := hs[0]
		var listed []string
		for _, r := range h.c.Message.Replicas {
			state := "gone"
			if mm := managers[string(r)]; mm != nil {
				stamp, deleted, err := mm.Tombstone(h.c.User, h.c.Message.ID)
				switch {
				case err != nil:
					state = "error " + err.Error()
				case slices.Contains(with, string(r)):
					state = "holds"
				case deleted:
					state = "tombstone " + stampOrder(stamp, h.c.Stamp)
				case stamp.IsZero():
					state = "nothing"
				default:
					state = "record without message " + stampOrder(stamp, h.c.Stamp)
				}
			}
			listed = append(listed, state)
		}
		kind := fmt.Sprintf("%d of %d records with bytes, want %d, listed replicas: %s", len(with), len(hs), h.c.Message.Want, strings.Join(listed, ", "))
		kinds[kind]++
		if len(examples) < 15 {
			examples = append(examples, fmt.Sprintf("%s uid %d: on %v (with bytes %v), replicas %v, stamp %v/%s", key, h.c.Message.UID,
				nodesOf(hs), with, ids(h.c.Message.Replicas), h.c.Stamp.Clock, h.c.Stamp.Node))
		}
	}
	t.Logf("census of the stores: %d message objects, %d with fewer than %d copies", total, short, want)
	var ks []string
	for k := range kinds {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	for _, k := range ks {
		t.Logf("  %d: %s", kinds[k], k)
	}
	for _, e := range examples {
		t.Logf("  e.g. %s", e)
	}
}

// stampOrder says how a replica's stamp compares with the holder's.
func stampOrder(a, b replica.Stamp) string {
	switch {
	case a.Less(b):
		return "older than the holder's"
	case b.Less(a):
		return "newer than the holder's"
	}
	return "same as the holder's"
}

func nodesOf(hs []censusHolder) []string {
	var out []string
	for _, h := range hs {
		out = append(out, h.node)
	}
	return out
}

func ids(ns []cluster.NodeID) []string {
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = string(n)
	}
	return out
}

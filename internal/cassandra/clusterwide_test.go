package cassandra_test

// The clusterwide objects on Cassandra (clusterwide.Shared over the
// clusterwide table), against the real Cassandra of this package's test
// binary: the newest stamp wins whatever the order of the writes,
// tombstones hide and old ones are swept, objects are listed by kind; two
// in-process cores on one keyspace (two front ends that do not gossip)
// each load every object at start, and one sees the other's change after a
// refresh, its change handlers hearing of it.

import (
	"context"
	"log/slog"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cassandra"
	"github.com/quillmail/quill/internal/cassandra/cassandratest"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/clusterwide"
	"github.com/quillmail/quill/internal/core"
	"github.com/quillmail/quill/internal/domain"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/replica"
)

// at is an HLC stamp of node n at wall time t.
func at(t time.Time, n string) replica.Stamp {
	return replica.Stamp{Clock: hlc.Timestamp(t.UnixMilli()) << 16, Node: cluster.NodeID(n)}
}

// TestClusterwideSharedTable: the table's rows as a Shared reads them.
func TestClusterwideSharedTable(t *testing.T) {
	ctx := context.Background()
	st := openStore(t, "quill_wide_"+randomName())
	now := time.Now()
	put := func(name string, s replica.Stamp, deleted bool, data string) {
		t.Helper()
		o := clusterwide.Object{Name: name, Stamp: s, Deleted: deleted}
		if !deleted {
			o.Data = []byte(data)
		}
		if err := st.PutObject(ctx, o); err != nil {
			t.Fatal(err)
		}
	}
	// The newer version written first: the older one, written after it,
	// loses in the table as in memory.
	put("domain/example.org", at(now.Add(-time.Second), "n2"), false, "v2")
	put("domain/example.org", at(now.Add(-2*time.Second), "n1"), false, "v1")
	put("alias/b@example.org", at(now, "n1"), false, "b")
	put("alias/a@example.org", at(now, "n1"), false, "a")
	put("alias/gone@example.org", at(now, "n1"), true, "")
	put("alias/old@example.org", at(now.Add(-10*24*time.Hour), "n1"), true, "")

	s, err := clusterwide.OpenShared(ctx, st, nil)
	if err != nil {
		t.Fatal(err)
	}
	if o, ok := s.Get("domain/example.org"); !ok || string(o.Data) != "v2" {
		t.Fatalf("domain after writes newest first: %q %v, want v2", o.Data, ok)
	}
	if got := names(s.List("alias/")); !slices.Equal(got, []string{"alias/a@example.org", "alias/b@example.org"}) {
		t.Fatalf("aliases listed %v: want a and b by name, tombstones left out", got)
	}
	if _, ok := s.Get("alias/gone@example.org"); ok {
		t.Fatal("a tombstone read as an object")
	}

	var mu sync.Mutex
	var heard []string
	s.OnChange(func(o clusterwide.Object) {
		mu.Lock()
		heard = append(heard, o.Name)
		mu.Unlock()
	})
	// Another node's changes: an older version (lost), a newer one and a
	// tombstone, seen at the next read and heard by the handler.
	put("domain/example.org", at(now.Add(-3*time.Second), "n3"), false, "v0")
	put("domain/example.net", at(now, "n3"), false, "net")
	put("alias/b@example.org", at(now.Add(time.Second), "n3"), true, "")
	before := s.Digest()
	n, err := s.Refresh(ctx)
	if err != nil || n != 2 {
		t.Fatalf("Refresh = %d, %v; want 2 applied", n, err)
	}
	if o, _ := s.Get("domain/example.org"); string(o.Data) != "v2" {
		t.Fatalf("an older version won at refresh: %q", o.Data)
	}
	if _, ok := s.Get("alias/b@example.org"); ok {
		t.Fatal("an alias deleted by another node is still there after a refresh")
	}
	mu.Lock()
	if slices.Sort(heard); !slices.Equal(heard, []string{"alias/b@example.org", "domain/example.net"}) {
		t.Errorf("the change handler heard %v", heard)
	}
	mu.Unlock()
	if s.Digest() == before {
		t.Error("digest unchanged by a refresh that applied changes")
	}

	// Tend sweeps the tombstone older than the cutoff, from the table too;
	// the recent one stays.
	s.Tend(ctx, nil, "n1", nil, now.Add(-7*24*time.Hour))
	if _, ok, err := st.Object(ctx, "alias/old@example.org"); err != nil || ok {
		t.Fatalf("old tombstone in the table after a sweep: %v %v", ok, err)
	}
	if o, ok, err := st.Object(ctx, "alias/gone@example.org"); err != nil || !ok || !o.Deleted {
		t.Fatalf("recent tombstone after a sweep: %+v %v %v", o, ok, err)
	}
}

func names(objs []clusterwide.Object) []string {
	var out []string
	for _, o := range objs {
		out = append(out, o.Name)
	}
	return out
}

// TestClusterwideTwoCores: two front ends on one keyspace, not in one
// gossip cluster: what one adds (a domain, an alias) the other holds at its
// start, and a later change after a refresh; a change made through a node
// whose clock is behind the object's stamp still wins.
func TestClusterwideTwoCores(t *testing.T) {
	ctx := context.Background()
	keyspace := "quill_wide2_" + randomName()
	r, err := cassandra.ParseReplication(testRF())
	if err != nil {
		t.Fatal(err)
	}
	cfg := cassandra.Config{Hosts: cassandratest.Hosts(t), Keyspace: keyspace, Replication: r}
	open := func() *core.Core {
		t.Helper()
		c, err := core.New(core.Options{DataDir: t.TempDir(), Log: slog.New(slog.DiscardHandler), Cassandra: &cfg})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { c.Close() })
		return c
	}
	c1 := open()
	if _, err := c1.AddDomain(ctx, domain.Domain{Name: "example.org"}); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.SetAlias(ctx, domain.Alias{Address: "info@example.org", Targets: []string{"dora@example.org"}}); err != nil {
		t.Fatal(err)
	}
	c2 := open()
	if !c2.HasDomain("example.org") || len(c2.Aliases("example.org")) != 1 {
		t.Fatalf("second node at start: domain %v, aliases %v", c2.HasDomain("example.org"), c2.Aliases("example.org"))
	}
	shared := c2.Wide.(*clusterwide.Shared)
	heard := make(chan string, 4)
	shared.OnChange(func(o clusterwide.Object) { heard <- o.Name })
	if err := c1.DeleteAlias(ctx, "info@example.org"); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.AddDomain(ctx, domain.Domain{Name: "example.net"}); err != nil {
		t.Fatal(err)
	}
	if n, err := shared.Refresh(ctx); err != nil || n != 2 {
		t.Fatalf("Refresh = %d, %v; want 2", n, err)
	}
	if len(c2.Aliases("")) != 0 || !c2.HasDomain("example.net") {
		t.Fatalf("second node after a refresh: aliases %v, example.net %v", c2.Aliases(""), c2.HasDomain("example.net"))
	}
	got := []string{<-heard, <-heard}
	if slices.Sort(got); !slices.Equal(got, []string{"alias/info@example.org", "domain/example.net"}) {
		t.Errorf("the second node's handler heard %v", got)
	}

	// An object stamped an hour ahead of both clocks (a node whose clock
	// ran fast): a change made now still wins, on both nodes.
	ahead := clusterwide.Object{Name: "policy/example.org", Stamp: at(time.Now().Add(time.Hour), "fast"), Data: []byte(`{"domain":"example.org"}`)}
	if err := c1.Cass.PutObject(ctx, ahead); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Wide.(*clusterwide.Shared).Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	if _, err := c1.Wide.Put(ctx, c1.Repl, c1.AliveIDs(), ahead.Name, []byte(`{"domain":"example.org","dmarc":"junk"}`), false, replica.One); err != nil {
		t.Fatal(err)
	}
	if _, err := shared.Refresh(ctx); err != nil {
		t.Fatal(err)
	}
	for i, c := range []*core.Core{c1, c2} {
		if o, ok := c.Wide.Get(ahead.Name); !ok || string(o.Data) != `{"domain":"example.org","dmarc":"junk"}` {
			t.Errorf("node %d: the change made after an object stamped ahead: %q", i+1, o.Data)
		}
	}
}

package writer

import (
	"encoding/json"
	"io"
	"log/slog"
	"slices"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
	"github.com/quillmail/quill/internal/userdb"
)

func TestLSNOrder(t *testing.T) {
	ordered := []LSN{{}, {1, 1}, {1, 2}, {1, 10}, {2, 0}, {2, 1}, {100, 0}}
	for i := range ordered {
		for j := range ordered {
			if got, want := ordered[i].Less(ordered[j]), i < j; got != want {
				t.Errorf("%v.Less(%v) = %v, want %v", ordered[i], ordered[j], got, want)
			}
		}
	}
	// A new primary's term is above every term it found, and above its
	// clock, so its first entry orders after the old primary's last.
	old := LSN{Term: 500, Seq: 9000}
	for _, now := range []uint64{0, 10, 500, 501, 10_000} {
		first := LSN{Term: newTerm(old, now), Seq: 1}
		if !old.Less(first) {
			t.Errorf("clock %d: new primary's first LSN %v not after the old primary's %v", now, first, old)
		}
	}
}

func TestMergeEntriesUnionInOrder(t *testing.T) {
	e := func(term, seq uint64, n string) *Entry {
		return &Entry{LSN: LSN{term, seq}, Node: cluster.NodeID(n)}
	}
	a := []*Entry{e(1, 1, "a"), e(1, 2, "a"), e(2, 1, "b")}
	b := []*Entry{e(1, 2, "a"), e(2, 1, "b"), e(2, 2, "b"), e(1, 3, "a")}
	c := []*Entry{e(2, 1, "c")} // a second primary for a moment: kept apart
	got := mergeEntries(a, b, c)
	var keys []string
	for _, x := range got {
		keys = append(keys, string(x.Node)+":"+string(rune('0'+x.LSN.Term))+"."+string(rune('0'+x.LSN.Seq)))
	}
	want := []string{"a:1.1", "a:1.2", "a:1.3", "b:2.1", "c:2.1", "b:2.2"}
	if !slices.Equal(keys, want) {
		t.Fatalf("merged %v, want %v", keys, want)
	}
}

func TestChooseSourceHighestLSNThenRank(t *testing.T) {
	ranked := []cluster.NodeID{"n1", "n2", "n3", "n4"}
	cases := []struct {
		name  string
		heads []Head
		want  cluster.NodeID
		found bool
	}{
		{"all empty", []Head{{Node: "n1"}, {Node: "n2"}}, "", false},
		{"highest LSN wins over rank", []Head{{Node: "n1", LSN: LSN{1, 5}, Count: 5}, {Node: "n3", LSN: LSN{2, 1}, Count: 6}}, "n3", true},
		{"tie goes to the higher rank", []Head{{Node: "n3", LSN: LSN{2, 4}, Count: 4}, {Node: "n2", LSN: LSN{2, 4}, Count: 4}}, "n2", true},
		{"an empty log never wins", []Head{{Node: "n1"}, {Node: "n4", LSN: LSN{1, 1}, Count: 1}}, "n4", true},
		{"unranked after ranked", []Head{{Node: "zz", LSN: LSN{3, 3}, Count: 1}, {Node: "n4", LSN: LSN{3, 3}, Count: 1}}, "n4", true},
	}
	for _, c := range cases {
		h, ok := chooseSource(c.heads, ranked)
		if ok != c.found || h.Node != c.want {
			t.Errorf("%s: chose %q (%v), want %q (%v)", c.name, h.Node, ok, c.want, c.found)
		}
	}
}

func TestToFetchAndWriting(t *testing.T) {
	heads := []Head{
		{Node: "self", LSN: LSN{2, 3}, Count: 3},
		{Node: "same", LSN: LSN{2, 3}, Count: 3},
		{Node: "ahead", LSN: LSN{3, 1}, Count: 4, Busy: true},
		{Node: "older", LSN: LSN{1, 9}, Count: 9},
		{Node: "empty", Busy: true},
	}
	if got, want := toFetch("self", heads), []cluster.NodeID{"ahead", "older"}; !slices.Equal(got, want) {
		t.Errorf("toFetch = %v, want %v", got, want)
	}
	// A node that still writes the bucket and holds a log of it is waited
	// for; one that writes but holds nothing is not (a start-up race).
	if got, want := writing("self", heads), []cluster.NodeID{"ahead"}; !slices.Equal(got, want) {
		t.Errorf("writing = %v, want %v", got, want)
	}
	if got := writing("ahead", heads); len(got) != 0 {
		t.Errorf("a node waits for itself: %v", got)
	}
}

func TestSecondariesAreTheNextRanked(t *testing.T) {
	alive := []cluster.Member{{ID: "a"}, {ID: "b"}, {ID: "c"}, {ID: "d"}}
	var infos []cluster.MemberInfo
	for _, m := range alive {
		infos = append(infos, cluster.MemberInfo{Member: m, State: "alive"})
	}
	for b := 0; b < cluster.Buckets; b++ {
		ranked := cluster.Ranked(uint8(b), alive)
		primary := ranked[0].ID
		eligible, err := cluster.Eligible(uint8(b), infos, island.Table{}, false)
		if err != nil {
			t.Fatal(err)
		}
		got := secondaries(primary, eligible)
		if len(got) != 3 || got[0] != ranked[1].ID || slices.Contains(got, primary) {
			t.Fatalf("bucket %d: secondaries of %s = %v, ranks %v", b, primary, got, ranked)
		}
		// When the primary dies the secondary is the next manager: the
		// user map gives the bucket to the highest-ranked live node.
		rest := slices.DeleteFunc(slices.Clone(alive), func(m cluster.Member) bool { return m.ID == primary })
		if um := cluster.Compute(rest, 1, nil); um.Node[b] != got[0] {
			t.Fatalf("bucket %d: secondary %s, but the map without %s names %s", b, got[0], primary, um.Node[b])
		}
	}
}

// With islands the log stays in the bucket's island: the secondaries are
// its other members, and the secondary is the island's next manager.
func TestSecondariesStayInTheIsland(t *testing.T) {
	table, err := island.Initial([]string{"x", "y"})
	if err != nil {
		t.Fatal(err)
	}
	of := map[cluster.NodeID]string{"a": "x", "b": "x", "c": "y", "d": "y", "e": "y"}
	var alive []cluster.Member
	var infos []cluster.MemberInfo
	for _, id := range []cluster.NodeID{"a", "b", "c", "d", "e"} {
		alive = append(alive, cluster.Member{ID: id})
		mi := cluster.MemberInfo{Member: cluster.Member{ID: id}, State: "alive"}
		mi.Island = of[id]
		infos = append(infos, mi)
	}
	in := func(b uint8, n cluster.NodeID) bool { return of[n] == table.Island(b) }
	um := cluster.ComputeWithin(alive, in, 1, nil)
	for b := 0; b < cluster.Buckets; b++ {
		eligible, err := cluster.Eligible(uint8(b), infos, table, true)
		if err != nil {
			t.Fatal(err)
		}
		primary := um.Node[b]
		got := secondaries(primary, eligible)
		for _, n := range got {
			if of[n] != table.Island(uint8(b)) {
				t.Fatalf("bucket %d of island %s: secondary %s of island %s", b, table.Island(uint8(b)), n, of[n])
			}
		}
		rest := slices.DeleteFunc(slices.Clone(alive), func(m cluster.Member) bool { return m.ID == primary })
		if next := cluster.ComputeWithin(rest, in, 2, nil); next.Node[b] != got[0] {
			t.Fatalf("bucket %d: secondary %s, but the map without %s names %s", b, got[0], primary, next.Node[b])
		}
	}
}

func TestPlanReplay(t *testing.T) {
	up := func(obj string, st uint64, flags string) *replica.Update {
		return &replica.Update{Object: obj, Stamp: replica.Stamp{Clock: hlc.Timestamp(st)}, Data: []byte(flags)}
	}
	p1 := &userdb.Profile{Address: "u@x", Version: 10}
	p2 := &userdb.Profile{Address: "u@x", Version: 20}
	log := []*Entry{
		{LSN: LSN{1, 1}, User: "u@x", Reserve: &ReserveEnds{UIDValidity: 7, UID: 257, ModSeq: 257}},
		{LSN: LSN{1, 2}, User: "u@x", Updates: []*replica.Update{up("m/u@x/1", 5, "seen"), up("m/u@x/2", 5, "seen")}},
		{LSN: LSN{1, 3}, User: "u@x", Profile: p2},
		{LSN: LSN{1, 4}, User: "u@x", Updates: []*replica.Update{up("m/u@x/1", 6, "seen deleted")}},
		{LSN: LSN{2, 1}, User: "u@x", Profile: p1}, // older version logged later: not taken
		{LSN: LSN{2, 2}, User: "u@x", Reserve: &ReserveEnds{UIDValidity: 7, UID: 513, ModSeq: 600}},
		{LSN: LSN{2, 3}, User: "u@x", Updates: []*replica.Update{up("m/u@x/2", 4, "stale")}}, // older stamp
		{LSN: LSN{2, 4}, User: "v@x", Reserve: &ReserveEnds{UIDValidity: 9, UID: 300, ModSeq: 300}},
		{LSN: LSN{2, 5}, User: "u@x", Reserve: &ReserveEnds{UIDValidity: 7, UID: 400, ModSeq: 450}}, // a release
	}
	p := planReplay(log)
	var got []string
	for _, u := range p.Updates {
		got = append(got, u.Object+"="+string(u.Data))
	}
	if want := []string{"m/u@x/2=seen", "m/u@x/1=seen deleted"}; !slices.Equal(got, want) {
		t.Errorf("updates %v, want %v (the newest version of each object, in log order)", got, want)
	}
	u := p.Users["u@x"]
	if u == nil || u.Profile != p2 {
		t.Fatalf("profile to replay: %+v, want version 20", u)
	}
	if r := u.Reserve[7]; r.UID != 400 || r.ModSeq != 450 {
		t.Errorf("reserve of mailbox 7: %+v, want the last logged (400, 450)", r)
	}
	if r := p.Users["v@x"].Reserve[9]; r.UID != 300 {
		t.Errorf("reserve of v@x: %+v", r)
	}
}

func TestReplayProfile(t *testing.T) {
	box := func(v uint32, uid uint32, mod uint64) userdb.MailboxDef {
		return userdb.MailboxDef{Name: "INBOX", UIDValidity: v, UIDReserved: uid, ModSeqReserved: mod}
	}
	cur := &userdb.Profile{Address: "u@x", Version: 30, Mailboxes: []userdb.MailboxDef{box(7, 257, 257)}}
	// The profile replica that took the last reservation died: the
	// current profile is a block behind what the log says.
	ur := &userReplay{Reserve: map[uint32]ReserveEnds{7: {UIDValidity: 7, UID: 513, ModSeq: 520}}}
	np := replayProfile(cur, ur)
	if np == nil || np.Mailboxes[0].UIDReserved != 513 || np.Mailboxes[0].ModSeqReserved != 520 {
		t.Fatalf("replayed profile %+v, want ends raised to 513/520", np)
	}
	if cur.Mailboxes[0].UIDReserved != 257 {
		t.Fatalf("replay changed the current profile in place")
	}
	// Nothing newer logged: nothing to write.
	ur = &userReplay{Reserve: map[uint32]ReserveEnds{7: {UIDValidity: 7, UID: 100, ModSeq: 100}}}
	if np := replayProfile(cur, ur); np != nil {
		t.Fatalf("replay lowers or rewrites ends: %+v", np)
	}
	// A logged mailbox change newer than the profile known is written again.
	logged := &userdb.Profile{Address: "u@x", Version: 40, Mailboxes: []userdb.MailboxDef{box(7, 257, 257), {Name: "Archive", UIDValidity: 8}}}
	np = replayProfile(cur, &userReplay{Profile: logged, Reserve: map[uint32]ReserveEnds{}})
	if np == nil || np.MailboxByName("Archive") == nil {
		t.Fatalf("logged mailbox change not replayed: %+v", np)
	}
	// A deleted user is left alone.
	if np := replayProfile(&userdb.Profile{Address: "u@x", Version: 50, Deleted: true}, ur); np != nil {
		t.Fatalf("replay brings a deleted user back: %+v", np)
	}
}

func TestExpired(t *testing.T) {
	now := time.Now()
	if expired(&Entry{At: now.Add(-redoKeep / 2)}, now, redoKeep) || !expired(&Entry{At: now.Add(-redoKeep - time.Second)}, now, redoKeep) {
		t.Fatal("entries expire at redoKeep")
	}
}

// The log in a real store: entries come back in LSN order per bucket, the
// heads name the highest LSN and whether the node still writes the
// bucket, and a sweep drops the old entries and measures the rest.
func TestRedoLogInStore(t *testing.T) {
	db, err := store.Open(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m := &Manager{self: "n1", log: slog.New(slog.NewTextHandler(io.Discard, nil))}
	r := &redoLog{m: m, db: db, pending: map[uint8]bool{}}
	now := time.Now()
	enc := func(es ...*Entry) [][]byte {
		var out [][]byte
		for _, e := range es {
			v, _ := json.Marshal(e)
			out = append(out, v)
		}
		return out
	}
	if err := r.put(3, enc(
		&Entry{LSN: LSN{2, 1}, Node: "n2", User: "u@x", At: now},
		&Entry{LSN: LSN{1, 7}, Node: "n1", User: "u@x", At: now.Add(-2 * redoKeep)},
		&Entry{LSN: LSN{1, 8}, Node: "n1", User: "u@x", At: now},
	)); err != nil {
		t.Fatal(err)
	}
	if err := r.put(4, enc(&Entry{LSN: LSN{9, 9}, Node: "n1", User: "v@x", At: now})); err != nil {
		t.Fatal(err)
	}
	es, raw, err := r.entries(3)
	if err != nil || len(es) != 3 || len(raw) != 3 {
		t.Fatalf("entries of bucket 3: %d (%v)", len(es), err)
	}
	for i := 1; i < len(es); i++ {
		if !es[i-1].LSN.Less(es[i].LSN) {
			t.Fatalf("entries out of LSN order: %v then %v", es[i-1].LSN, es[i].LSN)
		}
	}
	m.tenure[4] = 1
	heads := r.heads([]uint32{3, 4, 5, 300})
	if len(heads.Heads) != 3 {
		t.Fatalf("heads %v", heads.Heads)
	}
	h3, h4, h5 := heads.Heads[0], heads.Heads[1], heads.Heads[2]
	if h3.Term != 2 || h3.Seq != 1 || h3.Count != 3 || h3.Busy {
		t.Errorf("head of bucket 3: %+v", h3)
	}
	if h4.Term != 9 || h4.Count != 1 || !h4.Busy {
		t.Errorf("head of bucket 4 (managed here): %+v", h4)
	}
	if h5.Count != 0 {
		t.Errorf("head of an empty bucket: %+v", h5)
	}
	r.sweep()
	if es, _, _ := r.entries(3); len(es) != 2 {
		t.Errorf("after the sweep bucket 3 holds %d entries, want 2 (the old one dropped)", len(es))
	}
	if n := m.RedoEntries(); n != 0 {
		t.Errorf("RedoEntries without a log = %d, want 0 (the gauge is exported on every node)", n)
	}
	m.redo = r
	if n := m.RedoEntries(); n != 3 {
		t.Errorf("RedoEntries = %d, want 3", n)
	}
}

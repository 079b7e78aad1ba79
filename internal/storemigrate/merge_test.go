package storemigrate

import (
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cassandra"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/clusterwide"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

func stamp(c int, node string) replica.Stamp {
	return replica.Stamp{Clock: hlc.Timestamp(c), Node: cluster.NodeID("n-" + node)}
}

func TestNewestProfile(t *testing.T) {
	live := &userdb.Profile{Address: "a@x", Version: 5}
	tomb := &userdb.Profile{Address: "a@x", Version: 9, Deleted: true}
	if got := NewestProfile([]*userdb.Profile{live, tomb, nil}); got != tomb {
		t.Fatalf("a delete one replica missed came back: %+v", got)
	}
	newer := &userdb.Profile{Address: "a@x", Version: 12}
	if got := NewestProfile([]*userdb.Profile{tomb, newer}); got != newer {
		t.Fatalf("a user made again after the delete lost: %+v", got)
	}
	if NewestProfile(nil) != nil {
		t.Fatal("a profile out of nothing")
	}
}

func TestMergeMessage(t *testing.T) {
	old := mailbox.Message{UID: 3, ID: "m1", Flags: nil, ModSeq: 3, Version: stamp(10, "a")}
	seen := mailbox.Message{UID: 3, ID: "m1", Flags: []string{`\Seen`}, ModSeq: 7, Version: stamp(20, "b")}
	moved := mailbox.Message{UID: 1, ID: "m1", ModSeq: 9, Version: stamp(30, "b")}
	recs := []Replica{{Node: 1, UIDValidity: 100, Message: seen}, {Node: 0, UIDValidity: 100, Message: old}}

	f := MergeMessage(recs, nil)
	if !f.Keep || f.Message.ModSeq != 7 || f.UIDValidity != 100 || f.Stamp != seen.Version {
		t.Fatalf("the flag change lost to the older replica: %+v", f)
	}
	if len(f.Holders) != 2 || f.Holders[0] != 0 || f.Holders[1] != 1 {
		t.Fatalf("holders %v, want [0 1]", f.Holders)
	}
	// A move: the replica that missed it lists the message in the old
	// mailbox; the newer record places it.
	f = MergeMessage(append(recs, Replica{Node: 1, UIDValidity: 200, Message: moved}), nil)
	if f.UIDValidity != 200 || f.Message.UID != 1 {
		t.Fatalf("moved message placed at %d/%d, want 200/1", f.UIDValidity, f.Message.UID)
	}
	// An expunge on one node, the other still holding the record: gone,
	// with the place to delete and the tombstone's stamp.
	f = MergeMessage(recs, []replica.Stamp{stamp(25, "a")})
	if f.Keep || f.Stamp != stamp(25, "a") || f.Message.UID != 3 {
		t.Fatalf("an expunged message came back: %+v", f)
	}
	// A tombstone older than a record (the message was put back by a
	// later update) does not win.
	if f := MergeMessage(recs, []replica.Stamp{stamp(15, "a")}); !f.Keep {
		t.Fatal("an older tombstone removed a newer record")
	}
	// Equal clocks: the node breaks the tie as replica.Stamp.Less does.
	a := mailbox.Message{UID: 4, ID: "m2", ModSeq: 1, Version: stamp(40, "a")}
	b := mailbox.Message{UID: 4, ID: "m2", ModSeq: 2, Version: stamp(40, "b")}
	f1 := MergeMessage([]Replica{{Node: 0, Message: a}, {Node: 1, Message: b}}, nil)
	f2 := MergeMessage([]Replica{{Node: 1, Message: b}, {Node: 0, Message: a}}, nil)
	if f1.Message.ModSeq != f2.Message.ModSeq {
		t.Fatal("the merge depends on the order the nodes were read in")
	}
}

func TestNewestEntries(t *testing.T) {
	e := func(id string, c int, deleted bool, replicas ...string) *queue.Entry {
		var rs []cluster.NodeID
		for _, r := range replicas {
			rs = append(rs, cluster.NodeID(r))
		}
		return &queue.Entry{ID: id, Stamp: stamp(c, "a"), Deleted: deleted, Replicas: rs}
	}
	got := NewestEntries([][]*queue.Entry{
		{e("q1", 10, false, "n1"), e("q2", 10, false, "n1"), e("q3", 30, true)},
		{e("q1", 20, false, "n1"), e("q2", 5, true), e("q3", 40, false, "n1"), e("q4", 1, false, "n2")},
	})
	want := map[string]struct {
		c       int
		deleted bool
	}{"q1": {20, false}, "q2": {5, true}, "q3": {30, true}, "q4": {1, false}}
	if len(got) != len(want) {
		t.Fatalf("%d entries, want %d", len(got), len(want))
	}
	for i, g := range got {
		w := want[g.ID]
		if int(g.Stamp.Clock) != w.c || g.Deleted != w.deleted {
			t.Errorf("entry %s: stamp %d deleted %v, want %d %v", g.ID, g.Stamp.Clock, g.Deleted, w.c, w.deleted)
		}
		if i > 0 && got[i-1].ID >= g.ID {
			t.Error("entries not sorted by id")
		}
	}
}

func TestNewestObjects(t *testing.T) {
	o := func(name string, c int, deleted bool) clusterwide.Object {
		return clusterwide.Object{Name: name, Stamp: stamp(c, "a"), Deleted: deleted, Data: []byte(name)}
	}
	got := NewestObjects([][]clusterwide.Object{{o("domain/x", 10, false), o("tls/a", 30, true)}, {o("domain/x", 20, true), o("tls/a", 20, false)}})
	if len(got) != 2 || !got[0].Deleted || got[0].Name != "domain/x" || !got[1].Deleted {
		t.Fatalf("objects %+v: want both deleted (the newer stamps)", got)
	}
}

func TestFenceEnds(t *testing.T) {
	box := mailbox.Mailbox{UIDNext: 8, HighestModSeq: 20}
	msgs := []mailbox.Message{{UID: 3, ModSeq: 12}, {UID: 7, ModSeq: 19}}
	// Past everything used, from the fragment records.
	if e := FenceEnds(box, msgs, nil); e != (Ends{UID: 8, ModSeq: 20}) {
		t.Fatalf("ends %+v", e)
	}
	// A message past the records (a fragment record behind), and the
	// reservations of the source and of the destination: the highest of
	// each.
	msgs = append(msgs, mailbox.Message{UID: 9, ModSeq: 25})
	e := FenceEnds(box, msgs, []Ends{{UID: 256, ModSeq: 10}, {UID: 5, ModSeq: 300}})
	if e != (Ends{UID: 256, ModSeq: 300}) {
		t.Fatalf("ends %+v, want 256/300", e)
	}
	if !e.Covers(Ends{UID: 10, ModSeq: 25}) || e.Covers(Ends{UID: 257, ModSeq: 1}) {
		t.Fatal("Covers")
	}
}

func TestMergeBox(t *testing.T) {
	created := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	p := &userdb.Profile{Address: "a@x", Created: created.Add(time.Hour)}
	def := &userdb.MailboxDef{Name: "Work", UIDValidity: 77, Subscribed: true, SpecialUse: `\Archive`}
	frags := []mailbox.Mailbox{{UIDNext: 5, HighestModSeq: 9, Created: created.Add(time.Minute)}, {UIDNext: 9, HighestModSeq: 4, Created: created}}
	mb := MergeBox(p, def, frags, []mailbox.Message{{UID: 12, ModSeq: 3}})
	want := mailbox.Mailbox{ID: 77, Name: "Work", UIDValidity: 77, UIDNext: 13, HighestModSeq: 9, Subscribed: true,
		SpecialUse: `\Archive`, Created: created}
	if mb != want {
		t.Fatalf("box %+v\nwant %+v", mb, want)
	}
	if mb := MergeBox(p, def, nil, nil); mb.UIDNext != 1 || mb.HighestModSeq != 1 || !mb.Created.Equal(p.Created) {
		t.Fatalf("empty box %+v", mb)
	}
}

func TestNativeDefs(t *testing.T) {
	p := &userdb.Profile{Mailboxes: []userdb.MailboxDef{
		{Name: "INBOX", UIDValidity: 1, Subscribed: true, UIDReserved: 300, ModSeqReserved: 300},
		{Name: "Old", UIDValidity: 2},
		{Name: "Empty", UIDValidity: 3, Subscribed: true},
	}}
	rows := []mailbox.Mailbox{{Name: "INBOX", UIDValidity: 1, Subscribed: true}, {Name: "New", UIDValidity: 2, Subscribed: true},
		{Name: "Later", UIDValidity: 4}}
	defs := NativeDefs(p, rows, map[uint32]Ends{1: {UID: 100, ModSeq: 900}, 2: {UID: 50, ModSeq: 60}})
	want := []userdb.MailboxDef{
		{Name: "INBOX", UIDValidity: 1, Subscribed: true, UIDReserved: 300, ModSeqReserved: 900},
		{Name: "New", UIDValidity: 2, Subscribed: true, UIDReserved: 50, ModSeqReserved: 60},
		{Name: "Empty", UIDValidity: 3, Subscribed: true},
		{Name: "Later", UIDValidity: 4},
	}
	if len(defs) != len(want) {
		t.Fatalf("defs %+v", defs)
	}
	for i := range want {
		if defs[i] != want[i] {
			t.Errorf("def %d: %+v, want %+v", i, defs[i], want[i])
		}
	}
}

func TestParseURL(t *testing.T) {
	cfg, err := ParseURL("cassandra://10.0.0.5:9043,10.0.0.6/mail2?rf=dc1:3,dc2:2&write=all&read=ONE")
	if err != nil {
		t.Fatal(err)
	}
	rf, _ := cassandra.ParseReplication("dc1:3,dc2:2")
	wc, _ := cassandra.ParseConsistency("ALL")
	rc, _ := cassandra.ParseConsistency("ONE")
	if strings.Join(cfg.Hosts, " ") != "10.0.0.5:9043 10.0.0.6" || cfg.Keyspace != "mail2" ||
		cfg.Replication.String() != rf.String() || cfg.Write != wc || cfg.Read != rc {
		t.Fatalf("config %+v", cfg)
	}
	if cfg, err := ParseURL("cassandra://h"); err != nil || cfg.Keyspace != "" || len(cfg.Hosts) != 1 {
		t.Fatalf("bare host: %+v %v", cfg, err)
	}
	for _, bad := range []string{"http://h/mail", "cassandra:///mail", "cassandra://h/a/b", "cassandra://h/mail?rf=0",
		"cassandra://h/mail?write=TWO", "cassandra://h/mail?color=red", "cassandra://u@h/mail"} {
		if _, err := ParseURL(bad); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestCompare(t *testing.T) {
	msg := func(uid uint32, flags string, b byte) MessageDigest {
		return MessageDigest{UID: uid, Flags: flags, ModSeq: uint64(uid), Date: 1000, Size: 10, SHA256: [32]byte{b}}
	}
	side := func(msgs ...MessageDigest) *Digest {
		return &Digest{Users: map[string]map[string]*BoxDigest{
			"a@x": {"INBOX": {UIDValidity: 1, Subscribed: true, Messages: msgs}},
		}, Queue: map[string][32]byte{"q1": {1}}, Objects: map[string][32]byte{}}
	}
	a := side(msg(1, "", 1), msg(2, `\seen`, 2), msg(3, "", 3))
	if d := Compare(a, side(msg(1, "", 1), msg(2, `\seen`, 2), msg(3, "", 3))); len(d) != 0 {
		t.Fatalf("equal sides differ: %v", d)
	}
	b := side(msg(1, "", 1), msg(2, "", 2), msg(4, "", 4))
	b.Users["b@x"] = map[string]*BoxDigest{}
	delete(b.Queue, "q1")
	b.Users["a@x"]["INBOX"].Messages[0].SHA256 = [32]byte{9}
	d := strings.Join(Compare(a, b), "\n")
	for _, w := range []string{`mailbox "INBOX" uid 1: SHA-256`, `uid 2: flags (\seen), destination ()`, "uid 3: missing at the destination",
		"uid 4: at the destination only", "user b@x: at the destination only", "queue entry q1: missing at the destination"} {
		if !strings.Contains(d, w) {
			t.Errorf("differences lack %q:\n%s", w, d)
		}
	}
	if flagSet([]string{`\Seen`, "$Label", `\seen`}) != `$label \seen` {
		t.Errorf("flag set %q", flagSet([]string{`\Seen`, "$Label", `\seen`}))
	}
}

func TestEndMark(t *testing.T) {
	msgs := []mailbox.Message{{UID: 1, ModSeq: 4}, {UID: 3, ModSeq: 6}}
	for _, c := range []struct {
		box    mailbox.Mailbox
		msgs   []mailbox.Message
		uid    uint32
		modseq uint64
		ok     bool
	}{
		{mailbox.Mailbox{UIDNext: 4, HighestModSeq: 6}, msgs, 0, 0, false},  // the messages say it all
		{mailbox.Mailbox{UIDNext: 9, HighestModSeq: 6}, msgs, 8, 6, true},   // the last ones expunged
		{mailbox.Mailbox{UIDNext: 4, HighestModSeq: 11}, msgs, 2, 11, true}, // an expunge was the last change
		{mailbox.Mailbox{UIDNext: 3, HighestModSeq: 5}, []mailbox.Message{{UID: 1, ModSeq: 2}, {UID: 2, ModSeq: 3}}, 0, 0, false},
		{mailbox.Mailbox{UIDNext: 6, HighestModSeq: 9}, nil, 5, 9, true}, // all expunged
		{mailbox.Mailbox{UIDNext: 1, HighestModSeq: 1}, nil, 0, 0, false},
	} {
		uid, modseq, ok := EndMark(c.box, c.msgs)
		if uid != c.uid || modseq != c.modseq || ok != c.ok {
			t.Errorf("EndMark(%+v, %d messages) = %d, %d, %v; want %d, %d, %v", c.box, len(c.msgs), uid, modseq, ok, c.uid, c.modseq, c.ok)
		}
	}
}

func TestClash(t *testing.T) {
	if _, _, ok := Clash([]mailbox.Message{{UID: 1, ID: "a"}, {UID: 2, ID: "b"}}); ok {
		t.Fatal("a clash out of distinct UIDs")
	}
	a, b, ok := Clash([]mailbox.Message{{UID: 1, ID: "a"}, {UID: 3, ID: "b"}, {UID: 3, ID: "c"}})
	if !ok || a.ID != "b" || b.ID != "c" {
		t.Fatalf("clash %v %v %v", a, b, ok)
	}
}

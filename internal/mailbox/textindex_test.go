package mailbox

import (
	"fmt"
	"slices"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/fts"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/store"
)

func bodyQuery(needle string) []fts.Query {
	q, _ := fts.QueryBody(needle)
	return []fts.Query{q}
}

func excluded(t *testing.T, m *Manager, user string, v uint32, needle string) []uint32 {
	t.Helper()
	a, err := m.TextExcluded(user, v, bodyQuery(needle))
	if err != nil {
		t.Fatal(err)
	}
	var uids []uint32
	for _, s := range a.Skip {
		uid := uint32(s >> 32)
		id := fmt.Sprintf("id-%d", uid)
		if uid == 9 {
			id = "id-2" // moved to UID 9 of Archive
		}
		if s != SkipOf(uid, id) {
			t.Fatalf("skip %x does not name message %s", uint64(s), id)
		}
		uids = append(uids, uint32(s>>32))
	}
	return uids
}

func indexAll(t *testing.T, m *Manager) {
	t.Helper()
	for {
		n, err := m.IndexQueued(100)
		if err != nil {
			t.Fatal(err)
		}
		if n == 0 {
			return
		}
	}
}

// The index follows its messages: stored ones are queued and indexed,
// moved ones answer under their new place, expunged ones leave it, and a
// store whose index is gone (or older than the index) is queued again.
func TestTextIndexLifecycle(t *testing.T) {
	m, dir := newManager(t)
	const user = "t@x.org"
	for uid := uint32(1); uid <= 4; uid++ {
		raw := fmt.Sprintf("Subject: s%d\r\n\r\nword%d here\r\n", uid, uid)
		if err := m.StoreAt([]Placed{place(user, "INBOX", v1, uid, uint64(uid))}, fmt.Sprintf("id-%d", uid), []byte(raw), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	if n, _ := m.TextQueued(); n != 4 {
		t.Fatalf("%d queued, want 4", n)
	}
	// A search first indexes its user's waiting messages.
	if got := excluded(t, m, user, v1, "word2"); !slices.Equal(got, []uint32{1, 3, 4}) {
		t.Fatalf("BODY word2 excludes %v, want [1 3 4]", got)
	}
	if n, _ := m.TextQueued(); n != 0 {
		t.Fatalf("%d still queued after a search", n)
	}

	// Move id-2 to UID 9 of another mailbox (a newer version of its object).
	o := &Object{User: user, ID: "id-2", Mailbox: "Archive", UIDValidity: v1 + 1, UID: 9, ModSeq: 10, Size: 20,
		Date: time.Now(), Replicas: []cluster.NodeID{m.Self}, Want: 1}
	apply := func(o *Object) {
		t.Helper()
		stamp := replica.Stamp{Clock: hlc.Timestamp(time.Now().UnixNano()), Node: m.Self}
		u, err := o.Update(stamp, o.Replicas, nil)
		if err != nil {
			t.Fatal(err)
		}
		if outs, err := m.Apply([]*replica.Update{u}, nil); err != nil || outs[0] != replica.Applied {
			t.Fatalf("apply: %v %v", outs, err)
		}
	}
	apply(o)
	if got := excluded(t, m, user, v1, "word3"); !slices.Equal(got, []uint32{1, 4}) {
		t.Fatalf("after the move, INBOX BODY word3 excludes %v, want [1 4] (2 moved away)", got)
	}
	if got := excluded(t, m, user, v1+1, "word3"); !slices.Equal(got, []uint32{9}) {
		t.Fatalf("after the move, Archive BODY word3 excludes %v, want [9]", got)
	}
	if n, _ := m.TextQueued(); n != 0 {
		t.Fatalf("a move queued %d messages; it keeps the document", n)
	}
	// Expunge id-3: its document goes.
	apply(&Object{User: user, ID: "id-3", Deleted: true, Replicas: []cluster.NodeID{m.Self}})
	if got := excluded(t, m, user, v1, "word1"); !slices.Equal(got, []uint32{4}) {
		t.Fatalf("after expunge, BODY word1 excludes %v, want [4]", got)
	}

	// A reopened store keeps the index; one whose index keys are gone is
	// queued again when its version key is gone too.
	m = reopen(t, m, dir)
	db := m.db
	if got := excluded(t, m, user, v1, "word1"); !slices.Equal(got, []uint32{4}) {
		t.Fatalf("after reopening, BODY word1 excludes %v, want [4]", got)
	}
	b := db.NewBatch()
	for _, k := range []byte{store.KindText} {
		p := store.KindPrefix(k)
		b.DeleteRange(p, store.UpperBound(p))
	}
	b.Delete(textVersionKey())
	if err := b.Commit(store.Sync); err != nil {
		t.Fatal(err)
	}
	m = New(db)
	m.Self = "n-test"
	if err := m.queueUnindexed(); err != nil {
		t.Fatal(err)
	}
	if n, _ := m.TextQueued(); n != 3 {
		t.Fatalf("%d queued after the index was dropped, want the 3 messages held", n)
	}
	indexAll(t, m)
	if got := excluded(t, m, user, v1+1, "word2"); len(got) != 0 {
		t.Fatalf("rebuilt: Archive BODY word2 excludes %v, want none", got)
	}
	if got := excluded(t, m, user, v1+1, "word3"); !slices.Equal(got, []uint32{9}) {
		t.Fatalf("rebuilt: Archive BODY word3 excludes %v, want [9]", got)
	}
	if got := excluded(t, m, user, v1, "word4"); !slices.Equal(got, []uint32{1}) {
		t.Fatalf("rebuilt: BODY word4 excludes %v, want [1]", got)
	}
}

// The indexer leaves a message for TextIndexDelay: one expunged before
// then is never read, one that stays is indexed once it is due, and
// entries without a time (a store queued again whole) are due at once.
func TestTextIndexDelay(t *testing.T) {
	m, _ := newManager(t)
	const user = "d@x.org"
	for uid := uint32(1); uid <= 3; uid++ {
		raw := fmt.Sprintf("Subject: s%d\r\n\r\nword%d here\r\n", uid, uid)
		if err := m.StoreAt([]Placed{place(user, "INBOX", v1, uid, uint64(uid))}, fmt.Sprintf("id-%d", uid), []byte(raw), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	now := time.Now()
	if n, more, _, err := m.indexFrom(nil, textIndexBatch, now.Add(-time.Minute).UnixNano()); err != nil || n != 0 || more {
		t.Fatalf("a minute's delay took %d entries (more %v, err %v), want none due", n, more, err)
	}
	// id-1 goes before it is due: its entry goes with it.
	stamp := replica.Stamp{Clock: hlc.Timestamp(time.Now().UnixNano()), Node: m.Self}
	u, err := (&Object{User: user, ID: "id-1", Deleted: true, Replicas: []cluster.NodeID{m.Self}}).Update(stamp, []cluster.NodeID{m.Self}, nil)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := m.Apply([]*replica.Update{u}, nil); err != nil {
		t.Fatal(err)
	}
	if n, _ := m.TextQueued(); n != 2 {
		t.Fatalf("%d queued after an expunge, want 2", n)
	}
	// id-3 is queued again without a time: due at once.
	if err := m.db.Set(toIndexKey(user, "id-3"), nil, store.NoSync); err != nil {
		t.Fatal(err)
	}
	if n, _, _, err := m.indexFrom(nil, textIndexBatch, now.Add(-time.Minute).UnixNano()); err != nil || n != 1 {
		t.Fatalf("took %d entries (err %v), want the one without a time", n, err)
	}
	if n, _, _, err := m.indexFrom(nil, textIndexBatch, time.Now().UnixNano()); err != nil || n != 1 {
		t.Fatalf("took %d entries once due (err %v), want 1", n, err)
	}
	if n, _ := m.TextQueued(); n != 0 {
		t.Fatalf("%d still queued", n)
	}
	ut := m.lockText(user)
	next := ut.next
	ut.mu.Unlock()
	if next != 3 {
		t.Fatalf("next document %d, want 3 (two indexed, the expunged one never)", next)
	}
	if got := excluded(t, m, user, v1, "word2"); !slices.Equal(got, []uint32{3}) {
		t.Fatalf("BODY word2 excludes %v, want [3]", got)
	}
}

// A store indexed under layout 1 kept a vocabulary key per term beside its
// posting: the upgrade drops them (every user's), queues nothing that has
// a document, and substring searches still find their terms (now from the
// postings' keys).
func TestTextIndexUpgradeDropsVocabulary(t *testing.T) {
	m, dir := newManager(t)
	users := []string{"a@x.org", "b@y.org", "c@z.org"}
	for _, user := range users {
		for uid := uint32(1); uid <= 3; uid++ {
			raw := fmt.Sprintf("Subject: s%d\r\n\r\nword%d here\r\n", uid, uid)
			if err := m.StoreAt([]Placed{place(user, "INBOX", v1, uid, uint64(uid))}, fmt.Sprintf("id-%d", uid), []byte(raw), time.Now()); err != nil {
				t.Fatal(err)
			}
		}
	}
	indexAll(t, m)
	vocab := func() (n int) {
		it, err := m.db.PrefixIter(nil, store.KindPrefix(store.KindText))
		if err != nil {
			t.Fatal(err)
		}
		defer it.Close()
		for it.First(); it.Valid(); it.Next() {
			if _, rest, ok := splitUserKey(it.Key()); ok && rest != "" && rest[0] == textVocab {
				n++
			}
		}
		return n
	}
	if n := vocab(); n != 0 {
		t.Fatalf("layout %s wrote %d vocabulary keys", textIndexVersion, n)
	}
	// Make it a layout-1 store: a vocabulary key per posting.
	b := m.db.NewBatch()
	it, err := m.db.PrefixIter(nil, store.KindPrefix(store.KindText))
	if err != nil {
		t.Fatal(err)
	}
	for it.First(); it.Valid(); it.Next() {
		if user, rest, ok := splitUserKey(it.Key()); ok && rest != "" && rest[0] == textPost {
			k := append(store.UserPrefix(store.KindText, user), textVocab)
			b.Set(append(k, rest[1:]...), nil)
		}
	}
	it.Close()
	b.Set(textVersionKey(), []byte("1"))
	if err := b.Commit(store.Sync); err != nil {
		t.Fatal(err)
	}
	if n := vocab(); n < 3*3 {
		t.Fatalf("%d vocabulary keys written for the test, want at least 9", n)
	}
	m = reopen(t, m, dir)
	if err := m.queueUnindexed(); err != nil {
		t.Fatal(err)
	}
	if n := vocab(); n != 0 {
		t.Fatalf("%d vocabulary keys left after the upgrade", n)
	}
	if n, _ := m.TextQueued(); n != 0 {
		t.Fatalf("the upgrade queued %d messages that have documents", n)
	}
	for _, user := range users {
		// "ord2" is a substring of the term word2: found through the
		// vocabulary, so messages 1 and 3 are left out.
		if got := excluded(t, m, user, v1, "ord2"); !slices.Equal(got, []uint32{1, 3}) {
			t.Fatalf("%s: BODY ord2 excludes %v, want [1 3]", user, got)
		}
	}
}

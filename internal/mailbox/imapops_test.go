package mailbox

import (
	"testing"
	"time"
)

func TestExpungeDeletedOnlyTakesDeleted(t *testing.T) {
	m, _ := newManager(t)
	u := "u@x.org"
	for i := 0; i < 3; i++ {
		if _, err := m.Deliver([]string{u}, []byte("Subject: x\r\n\r\nx\r\n"), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	mb := inbox(t, m, u)
	if _, _, err := m.StoreFlags(u, mb.ID, []uint32{1, 3}, FlagsAdd, []string{`\Deleted`}, 0); err != nil {
		t.Fatal(err)
	}
	// UID 3 loses \Deleted before the expunge commits: it must stay.
	if _, _, err := m.StoreFlags(u, mb.ID, []uint32{3}, FlagsRemove, []string{`\deleted`}, 0); err != nil {
		t.Fatal(err)
	}
	before := inbox(t, m, u).HighestModSeq
	gone, err := m.ExpungeDeleted(u, mb.ID, []uint32{1, 2, 3, 9})
	if err != nil {
		t.Fatal(err)
	}
	if len(gone) != 1 || gone[0] != 1 {
		t.Fatalf("expunged %v, want [1]", gone)
	}
	msgs, _ := m.Messages(u, mb.ID)
	if len(msgs) != 2 || msgs[0].UID != 2 || msgs[1].UID != 3 {
		t.Fatalf("left %+v", msgs)
	}
	if after := inbox(t, m, u).HighestModSeq; after <= before {
		t.Fatalf("HIGHESTMODSEQ %d -> %d", before, after)
	}
	if gone, err := m.ExpungeDeleted(u, mb.ID, []uint32{2, 3}); err != nil || len(gone) != 0 {
		t.Fatalf("nothing deleted: %v %v", gone, err)
	}
}

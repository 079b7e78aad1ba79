package mailbox

import (
	"testing"
	"time"
)

// A MOVE (or COPY) within one mailbox must not put UIDNEXT back: the source
// and destination are one record (RFC 9051 §2.3.1.1, UIDs never reused).
func TestMoveWithinMailboxKeepsUIDNext(t *testing.T) {
	m, _ := newManager(t)
	u := "u@x.org"
	if err := m.EnsureUser(u); err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 2; i++ {
		if _, err := m.Deliver([]string{u}, []byte("Subject: x\r\n\r\nx\r\n"), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	mb := inbox(t, m, u)
	res, err := m.Copy(u, mb.ID, []uint32{1}, "INBOX", true)
	if err != nil {
		t.Fatal(err)
	}
	if len(res.DstUIDs) != 1 || res.DstUIDs[0] != 3 {
		t.Fatalf("moved to UIDs %v, want [3]", res.DstUIDs)
	}
	mb = inbox(t, m, u)
	if mb.UIDNext != 4 {
		t.Fatalf("UIDNEXT %d after move within the mailbox, want 4", mb.UIDNext)
	}
	if _, err := m.Copy(u, mb.ID, []uint32{2}, "INBOX", false); err != nil {
		t.Fatal(err)
	}
	msgs, _ := m.Messages(u, mb.ID)
	if len(msgs) != 3 || msgs[0].UID != 2 || msgs[1].UID != 3 || msgs[2].UID != 4 {
		t.Fatalf("messages %+v", msgs)
	}
	if body, err := m.Body(u, msgs[1].ID); err != nil || string(body) != "Subject: x\r\n\r\nx\r\n" {
		t.Fatalf("moved body %q %v", body, err)
	}
}

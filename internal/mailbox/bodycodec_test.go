package mailbox

import (
	"bytes"
	"crypto/rand"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/replica"
)

// mailText is a message of ordinary text, as mail mostly is.
func mailText(n int) []byte {
	var b strings.Builder
	b.WriteString("From: Alice Example <alice@example.org>\r\nTo: bob@example.org\r\nSubject: the quarterly figures\r\n")
	b.WriteString("Date: Sat, 28 Nov 2026 13:00:00 +0000\r\nMessage-ID: <1234@example.org>\r\n\r\n")
	words := strings.Fields("the figures for this quarter are in and they look better than we feared when we last met " +
		"please read the attached notes before the meeting on thursday and tell me what you think of the plan")
	for i := 0; b.Len() < n; i++ {
		b.WriteString(words[(i*7)%len(words)])
		if i%12 == 11 {
			b.WriteString("\r\n")
		} else {
			b.WriteByte(' ')
		}
	}
	return []byte(b.String())
}

func TestBodyCodecRoundTrip(t *testing.T) {
	random := make([]byte, 4000)
	rand.Read(random)
	for _, c := range []struct {
		name       string
		raw        []byte
		compressed bool
	}{
		{"text", mailText(5000), true},
		{"small", []byte("Subject: x\r\n\r\nhi\r\n"), false},
		{"empty", nil, false},
		{"incompressible", random, false},
		// A body that starts like a frame is always stored as one, so it
		// cannot be mistaken for one when read.
		{"magic", append(append([]byte{}, zstdMagic...), "not a frame"...), true},
	} {
		v := encodeBody(c.raw)
		if got := bytes.HasPrefix(v, zstdMagic); got != c.compressed {
			t.Errorf("%s: compressed %v, want %v", c.name, got, c.compressed)
		}
		raw, err := decodeBody(v)
		if err != nil || !bytes.Equal(raw, c.raw) {
			t.Errorf("%s: round trip: %v (%d bytes back of %d)", c.name, err, len(raw), len(c.raw))
		}
	}
	if v := encodeBody(mailText(5000)); len(v) > 5000/2 {
		t.Errorf("mail text compressed to only %d of 5000 bytes", len(v))
	}
}

// Bodies stored before compression (the bytes as they are) still read,
// even one that begins with the zstd magic but is no frame.
func TestBodyWrittenBeforeCompressionReads(t *testing.T) {
	m, _ := newManager(t)
	if err := m.StoreAt([]Placed{place("a@x.org", "INBOX", v1, 1, 1)}, "id-1", []byte("x\r\n"), time.Now()); err != nil {
		t.Fatal(err)
	}
	for i, old := range [][]byte{mailText(3000), append(append([]byte{}, zstdMagic...), "\x00\x01 plain"...)} {
		if err := m.db.Set(bodyKey("a@x.org", "id-1"), old, nil); err != nil {
			t.Fatal(err)
		}
		got, err := m.Body("a@x.org", "id-1")
		if err != nil || !bytes.Equal(got, old) {
			t.Fatalf("old body %d: %v, %q", i, err, got)
		}
	}
}

// A damaged compressed body is an error, not its compressed bytes.
func TestBodyDamagedFrameIsAnError(t *testing.T) {
	v := encodeBody(mailText(5000))
	v[len(v)/2] ^= 0xff
	if _, err := decodeBody(v); err == nil {
		t.Fatal("damaged frame read without error")
	}
}

// A message stored under an id minted here is stored without reading what
// it replaces; the same update again, and an older one in the same batch,
// are still found stale.
func TestMintedIDStoredOnceThenStale(t *testing.T) {
	m, _ := newManager(t)
	id := m.NewMessageID()
	o := &Object{User: "a@x.org", ID: id, Mailbox: "INBOX", UIDValidity: v1, UID: 1, ModSeq: 1, Size: 5000,
		Date: time.Now(), Replicas: []cluster.NodeID{m.Self}, Want: 1}
	newer, err := o.Update(replica.Stamp{Clock: 20, Node: m.Self}, o.Replicas, mailText(5000))
	if err != nil {
		t.Fatal(err)
	}
	older, err := o.Update(replica.Stamp{Clock: 10, Node: m.Self}, o.Replicas, []byte("older\r\n"))
	if err != nil {
		t.Fatal(err)
	}
	outs, err := m.Apply([]*replica.Update{newer, older}, nil)
	if err != nil || fmt.Sprint(outs) != fmt.Sprint([]replica.Outcome{replica.Applied, replica.Stale}) {
		t.Fatalf("first apply: %v %v", outs, err)
	}
	outs, err = m.Apply([]*replica.Update{newer}, nil)
	if err != nil || outs[0] != replica.Stale {
		t.Fatalf("again: %v %v", outs, err)
	}
	if b, err := m.Body("a@x.org", id); err != nil || !bytes.Equal(b, mailText(5000)) {
		t.Fatalf("body: %v", err)
	}
}

// A new delivery (an id minted here, a UID past the fragment's UIDNEXT)
// reads only its mailbox record: not the object record, the body or the
// UID it would replace (issue 16: three such reads per message showed in
// the profile).
func TestNewMessageReadsOnlyItsMailbox(t *testing.T) {
	m, _ := newManager(t)
	store1 := func(uid uint32) {
		t.Helper()
		if err := m.StoreAt([]Placed{place("a@x.org", "INBOX", v1, uid, uint64(uid))}, m.NewMessageID(), mailText(5000), time.Now()); err != nil {
			t.Fatal(err)
		}
	}
	store1(1) // makes the fragment (a scan of the user's mailboxes, and the counters)
	before := m.db.PointReads()
	store1(2)
	if n := m.db.PointReads() - before; n != 1 {
		t.Fatalf("a new message took %d point reads, want 1 (its mailbox record)", n)
	}
	// A UID below UIDNEXT is checked (two writers in a partition may hand
	// out the same one).
	if err := m.StoreAt([]Placed{place("a@x.org", "INBOX", v1, 1, 3)}, m.NewMessageID(), mailText(100), time.Now()); !errors.Is(err, ErrUIDTaken) {
		t.Fatalf("taken UID: %v", err)
	}
}

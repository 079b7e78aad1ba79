package usermgr

import (
	"errors"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/store"
	"github.com/quillmail/quill/internal/userdb"
)

func TestRebuildFromHardState(t *testing.T) {
	dir := t.TempDir()
	db, err := store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	boxes := mailbox.New(db)
	m := New("n1", userdb.New(db), boxes)
	if _, err := m.AddUser("Alice@Example.org", "pw1"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.AddUser("bob@example.net", "pw2"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.AddUser("alice@example.org", "x"); !errors.Is(err, userdb.ErrExists) {
		t.Fatalf("duplicate add: %v", err)
	}
	boxes.Deliver([]string{"alice@example.org"}, []byte("hi\r\n"), time.Now())
	db.Close()

	// A fresh process: soft state comes back only from the scan.
	db, err = store.Open(dir)
	if err != nil {
		t.Fatal(err)
	}
	defer db.Close()
	m = New("n1", userdb.New(db), mailbox.New(db))
	if _, err := m.Lookup("alice@example.org"); err == nil {
		t.Fatal("soft state present before rebuild")
	}
	if err := m.Rebuild(nil); err != nil {
		t.Fatal(err)
	}
	if len(m.Users()) != 2 {
		t.Fatalf("users after rebuild: %v", m.Users())
	}
	if !m.ServesDomain("EXAMPLE.org") || !m.ServesDomain("example.net") || m.ServesDomain("other.org") {
		t.Fatal("domains wrong after rebuild")
	}
	if mm := m.MailMap("alice@example.org"); len(mm) != 1 || mm[0] != "n1" {
		t.Fatalf("mail map %v", mm)
	}
	if mm := m.MailMap("bob@example.net"); len(mm) != 0 {
		t.Fatalf("bob has no mail but mail map %v", mm)
	}
	if _, err := m.Authenticate("alice@example.org", "pw1"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Authenticate("alice@example.org", "pw1"); err != nil {
		t.Fatal("cached login failed:", err)
	}
	if _, err := m.Authenticate("alice@example.org", "bad"); !errors.Is(err, ErrBadPassword) {
		t.Fatalf("wrong password: %v", err)
	}
	if _, err := m.Authenticate("nobody@example.org", "pw1"); !errors.Is(err, ErrUnknownUser) {
		t.Fatalf("unknown user: %v", err)
	}
	if err := m.SetPassword("alice@example.org", "new"); err != nil {
		t.Fatal(err)
	}
	if _, err := m.Authenticate("alice@example.org", "pw1"); err == nil {
		t.Fatal("old password still accepted after change (stale cache)")
	}
	if err := m.DeleteUser("bob@example.net"); err != nil {
		t.Fatal(err)
	}
	if m.ServesDomain("example.net") {
		t.Fatal("domain still served after its last user left")
	}
}

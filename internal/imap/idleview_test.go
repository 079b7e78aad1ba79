package imap

import (
	"fmt"
	"strings"
	"testing"
)

// A writer's view let go when idle (writer.DropIdleViews) loads again at
// its next use with the same messages, flags and UIDs, and changes and
// deliveries after that land in it as before.
func TestIdleViewLetGoLoadsAgain(t *testing.T) {
	e := newEnv(t)
	for i := range 3 {
		e.deliver(fmt.Sprintf("Subject: %d\r\n\r\nbody %d\r\n", i, i))
	}
	a := e.raw(true)
	a.ok("SELECT INBOX")
	a.ok(`STORE 2 +FLAGS (\Flagged)`)
	before := a.ok("UID FETCH 1:* (FLAGS)")
	a.ok("LOGOUT")

	if n := e.core.Writers.DropIdleViews(0); n == 0 {
		t.Fatal("no idle view was let go")
	}
	b := e.raw(true)
	if u := b.ok("SELECT INBOX"); !has(u, "* 3 EXISTS") {
		t.Fatalf("SELECT after the view was let go: %q", u)
	}
	after := b.ok("UID FETCH 1:* (FLAGS)")
	// \Recent went to the first session only.
	if fmt.Sprint(after) != strings.NewReplacer(` \Recent`, "", `\Recent`, "").Replace(fmt.Sprint(before)) {
		t.Fatalf("FETCH before the view was let go %q, after %q", before, after)
	}
	b.ok(`STORE 3 +FLAGS (\Seen)`)
	b.ok("UNSELECT")
	if n := e.core.Writers.DropIdleViews(0); n == 0 {
		t.Fatal("no idle view was let go the second time")
	}
	e.deliver("Subject: 4\r\n\r\nbody 4\r\n")
	u := b.ok("SELECT INBOX")
	f := b.ok("UID FETCH 3:* (FLAGS)")
	if !has(u, "* 4 EXISTS") || !has(f, `* 3 FETCH (UID 3 FLAGS (\Seen))`) || !has(f, `* 4 FETCH (UID 4 FLAGS (\Recent))`) {
		t.Fatalf("after a change, a second let-go and a delivery: %q %q", u, f)
	}
}

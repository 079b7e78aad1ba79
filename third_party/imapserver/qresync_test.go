package imapserver

import (
	"fmt"
	"strings"
	"sync"
	"testing"

	"github.com/emersion/go-imap/v2"
)

// qresyncSession is the test session with QRESYNC: it notes the SELECT
// parameters it is given and answers a UID FETCH VANISHED with a fixed
// VANISHED (EARLIER) first.
type qresyncSession struct {
	*testSession
	seen *qresyncSeen
}

type qresyncSeen struct {
	mu     sync.Mutex
	params []string
}

func (s qresyncSession) QResync(w *FetchWriter, p *QResyncParams) error {
	known, match := "-", "-"
	if p.KnownUIDs != nil {
		known = p.KnownUIDs.String()
	}
	if p.SeqMatch != nil {
		match = p.SeqMatch.Seqs.String() + "/" + p.SeqMatch.KnownUIDs.String()
	}
	s.seen.mu.Lock()
	s.seen.params = append(s.seen.params, fmt.Sprintf("%d %d %s %s", p.UIDValidity, p.ModSeq, known, match))
	s.seen.mu.Unlock()
	return nil
}

func (s qresyncSession) HighestModSeq() uint64 { return 42 }

func (s qresyncSession) Fetch(w *FetchWriter, numSet imap.NumSet, options *imap.FetchOptions) error {
	if w.Vanished() {
		if err := w.WriteVanishedEarlier(imap.UIDSetNum(7, 9)); err != nil {
			return err
		}
	}
	return s.testSession.Fetch(w, numSet, options)
}

func (s qresyncSession) Expunge(w *ExpungeWriter, uids *imap.UIDSet) error {
	if w.QResync() {
		return w.WriteVanished(imap.UIDSetNum(1))
	}
	return s.testSession.Expunge(w, uids)
}

// TestQResyncParsing covers row 28: ENABLE QRESYNC (which enables
// CONDSTORE), SELECT's QRESYNC parameters reaching the session, the UID
// FETCH modifier VANISHED and the BAD answers RFC 7162 §3.2.5 and §3.2.6
// ask for.
func TestQResyncParsing(t *testing.T) {
	seen := &qresyncSeen{}
	ts := newTestServer(t, func(o *Options) {
		o.Caps[imap.CapQResync] = struct{}{}
		newSession := o.NewSession
		o.NewSession = func(c *Conn) (Session, *GreetingData, error) {
			s, greeting, err := newSession(c)
			if err != nil {
				return nil, nil, err
			}
			return qresyncSession{s.(*testSession), seen}, greeting, nil
		}
	})
	c := ts.login()
	if l := c.cmd("C", "CAPABILITY"); !strings.Contains(l[0], " QRESYNC") {
		t.Fatalf("CAPABILITY: %q", l)
	}
	c.expectCmd("S", "SELECT INBOX (QRESYNC (1 2))", "S BAD [CLIENTBUG] QRESYNC must be enabled first (ENABLE QRESYNC)")
	c.expectCmd("E", "ENABLE QRESYNC", "* ENABLED QRESYNC", "E OK ENABLE completed")
	for _, sel := range []string{
		"SELECT INBOX (QRESYNC (1 2))",
		"EXAMINE INBOX (QRESYNC (3 4 1:5,9))",
		"SELECT INBOX (CONDSTORE QRESYNC (5 6 (1:2 3,8)))",
		"SELECT INBOX (QRESYNC (7 8 1:9 (1:2 3,8)))",
	} {
		if l := c.cmd("S", sel); !strings.HasPrefix(l[len(l)-1], "S OK ") {
			t.Fatalf("%s: %q", sel, l)
		}
	}
	seen.mu.Lock()
	got := strings.Join(seen.params, "; ")
	seen.mu.Unlock()
	if want := "1 2 - -; 3 4 1:5,9 -; 5 6 - 1:2/3,8; 7 8 1:9 1:2/3,8"; got != want {
		t.Errorf("QRESYNC parameters: got %q, want %q", got, want)
	}
	for _, bad := range []string{"(QRESYNC (0 1))", "(QRESYNC (1))", "(QRESYNC 1 2)", "(QRESYNC (1 2 (1:2)))", "(QRESYNC (1 2 1 (1 2) 3))", "(QRESYNC (1 2) QRESYNC (1 2))"} {
		if l := c.cmd("B", "SELECT INBOX "+bad); !strings.HasPrefix(l[len(l)-1], "B BAD ") {
			t.Fatalf("SELECT INBOX %s: %q", bad, l)
		}
	}
	// QRESYNC enabled CONDSTORE: FETCH responses carry MODSEQ.
	c.expectCmd("F", "UID FETCH 1:* (FLAGS) (CHANGEDSINCE 6 VANISHED)",
		"* VANISHED (EARLIER) 7,9", "* 3 FETCH (UID 12 FLAGS (\\Flagged) MODSEQ (7))", "F OK UID FETCH completed")
	for _, bad := range []string{"FETCH 1 (FLAGS) (CHANGEDSINCE 1 VANISHED)", "UID FETCH 1 (FLAGS) (VANISHED)"} {
		if l := c.cmd("B", bad); !strings.HasPrefix(l[len(l)-1], "B BAD ") {
			t.Fatalf("%s: %q", bad, l)
		}
	}
	c.expectCmd("X", "EXPUNGE", "* VANISHED 1", "X OK [HIGHESTMODSEQ 42] EXPUNGE completed")

	// Without ENABLE QRESYNC, VANISHED is refused.
	d := ts.login()
	d.cmd("S", "SELECT INBOX")
	if l := d.cmd("B", "UID FETCH 1 (FLAGS) (CHANGEDSINCE 1 VANISHED)"); !strings.HasPrefix(l[len(l)-1], "B BAD ") {
		t.Fatalf("VANISHED without ENABLE QRESYNC: %q", l)
	}
}

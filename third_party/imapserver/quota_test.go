package imapserver

import (
	"strings"
	"testing"

	"github.com/emersion/go-imap/v2"
)

// quotaSession is the test session with one quota root, "", that limits
// every mailbox.
type quotaSession struct{ *testSession }

func (quotaSession) QuotaResources() []imap.QuotaResourceType {
	return []imap.QuotaResourceType{imap.QuotaResourceStorage, imap.QuotaResourceMessage}
}

var testQuota = QuotaData{Root: "", Resources: []QuotaResource{
	{Name: imap.QuotaResourceStorage, Usage: 10, Limit: 512}, {Name: imap.QuotaResourceMessage, Usage: 3, Limit: 1000}}}

func (s quotaSession) GetQuotaRoot(mailbox string) ([]QuotaData, error) {
	if err := mailboxError(mailbox); err != nil {
		return nil, err
	}
	return []QuotaData{testQuota}, nil
}

func (quotaSession) GetQuota(root string) (*QuotaData, error) {
	if root != "" {
		return nil, &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeNonExistent, Text: "no such quota root"}
	}
	q := testQuota
	return &q, nil
}

// TestQuotaCommands covers row 30: GETQUOTA, GETQUOTAROOT and their
// responses, SETQUOTA refused, the QUOTA capabilities.
func TestQuotaCommands(t *testing.T) {
	ts := newTestServer(t, func(o *Options) {
		o.Caps[imap.CapQuota] = struct{}{}
		newSession := o.NewSession
		o.NewSession = func(c *Conn) (Session, *GreetingData, error) {
			s, greeting, err := newSession(c)
			if err != nil {
				return nil, nil, err
			}
			return quotaSession{s.(*testSession)}, greeting, nil
		}
	})
	pre, _ := ts.dial()
	if l := pre.cmd("Q", `GETQUOTA ""`); !strings.HasPrefix(l[len(l)-1], "Q BAD") {
		t.Fatalf("GETQUOTA before login: %q", l)
	}
	c := ts.login()
	caps := c.cmd("C", "CAPABILITY")[0]
	for _, want := range []string{" QUOTA ", " QUOTA=RES-STORAGE", " QUOTA=RES-MESSAGE"} {
		if !strings.Contains(caps+" ", want) {
			t.Errorf("CAPABILITY lacks %q: %s", want, caps)
		}
	}
	c.expectCmd("R", "GETQUOTAROOT INBOX", `* QUOTAROOT INBOX ""`, `* QUOTA "" (STORAGE 10 512 MESSAGE 3 1000)`, "R OK GETQUOTAROOT completed")
	c.expectCmd("G", `GETQUOTA ""`, `* QUOTA "" (STORAGE 10 512 MESSAGE 3 1000)`, "G OK GETQUOTA completed")
	c.expectCmd("S", `SETQUOTA "" (STORAGE 512)`, "S NO [NOPERM] Quotas are set by the administrator")
	for _, bad := range []string{"GETQUOTA", "GETQUOTAROOT", `SETQUOTA "" STORAGE 1`, `SETQUOTA "" (STORAGE x)`} {
		if l := c.cmd("B", bad); !strings.HasPrefix(l[len(l)-1], "B BAD") {
			t.Errorf("%s: %q", bad, l)
		}
	}
	if l := c.cmd("N", `GETQUOTA "x"`); !strings.HasPrefix(l[len(l)-1], "N NO [NONEXISTENT]") {
		t.Errorf(`GETQUOTA "x": %q`, l)
	}
}

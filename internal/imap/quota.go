package imap

import (
	"errors"
	"fmt"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/third_party/imapserver"
)

// QUOTA (RFC 9208). A user has one quota root, "", that covers all their
// mailboxes: the limits are the profile's (bytes and messages), set by the
// administrator, and the usage is what the user's writer counts over every
// mailbox, so every node reports the same figures. APPEND and COPY that
// would pass a limit fail with NO [OVERQUOTA] (§5.1); MOVE does not change
// what the root holds and is never refused. Delivery checks the same limits
// (proxy.CheckRecipient). A user without limits has no quota root. The
// quota of the user's domain (over all its users) refuses APPEND and COPY
// the same way; it is not shown as a root of its own (GETQUOTA reports the
// user's), since RFC 9208 roots are per user here.

// quotaRoot is the name of a user's one quota root.
const quotaRoot = ""

// QuotaResources implements imapserver.SessionQuota.
func (s *session) QuotaResources() []imap.QuotaResourceType {
	return []imap.QuotaResourceType{imap.QuotaResourceStorage, imap.QuotaResourceMessage}
}

// GetQuotaRoot implements imapserver.SessionQuota.
func (s *session) GetQuotaRoot(name string) ([]imapserver.QuotaData, error) {
	what := fmt.Sprintf("GETQUOTAROOT %q", name)
	_, u, err := s.srv.store.MailboxUsage(s.ctx(), s.user, name)
	if err != nil {
		return nil, storeErr(what, err)
	}
	if q := quotaData(u); q != nil {
		return []imapserver.QuotaData{*q}, nil
	}
	return nil, nil
}

// GetQuota implements imapserver.SessionQuota.
func (s *session) GetQuota(root string) (*imapserver.QuotaData, error) {
	what := fmt.Sprintf("GETQUOTA %q", root)
	if root != quotaRoot {
		return nil, no(imap.ResponseCodeNonExistent, "%s: no such quota root", what)
	}
	_, u, err := s.srv.store.MailboxUsage(s.ctx(), s.user, "")
	if err != nil {
		return nil, storeErr(what, err)
	}
	q := quotaData(u)
	if q == nil {
		return nil, no(imap.ResponseCodeNonExistent, "%s: no quota is set for %s", what, s.user)
	}
	return q, nil
}

// quotaData is the QUOTA response for a usage: the resources that have a
// limit (STORAGE in units of 1024 octets, usage rounded up), or nil.
func quotaData(u mailbox.Usage) *imapserver.QuotaData {
	q := &imapserver.QuotaData{Root: quotaRoot}
	if u.QuotaStorage > 0 {
		q.Resources = append(q.Resources, imapserver.QuotaResource{Name: imap.QuotaResourceStorage,
			Usage: (u.Storage + 1023) / 1024, Limit: max(u.QuotaStorage/1024, 1)})
	}
	if u.QuotaMessages > 0 {
		q.Resources = append(q.Resources, imapserver.QuotaResource{Name: imap.QuotaResourceMessage,
			Usage: u.Messages, Limit: u.QuotaMessages})
	}
	if len(q.Resources) == 0 {
		return nil
	}
	return q
}

// checkQuota refuses adding n messages of size bytes in all when u, read
// with the destination mailbox in the same writer call (MailboxUsage, so a
// limit set while the session is open applies at once), says they would
// pass a limit.
func checkQuota(what string, u mailbox.Usage, n, size int64) error {
	if u.Over(n, size) {
		return no(imap.ResponseCodeOverQuota, "%s: over quota (%s in use)", what, u)
	}
	return nil
}

// checkDomainQuota refuses adding n messages of size bytes in all that
// would take the user's domain past the domain's quota (issue 14: the same
// limit delivery holds to). It has no quota root of its own here: GETQUOTA
// shows the user's.
func (s *session) checkDomainQuota(what string, n, size int64) error {
	err := s.srv.store.DomainRoom(s.ctx(), s.user, n, size)
	if errors.Is(err, userdb.ErrOverQuota) {
		return no(imap.ResponseCodeOverQuota, "%s: over the quota of the domain", what)
	}
	if err != nil {
		return storeErr(what, err)
	}
	return nil
}

package imapserver

import (
	"strings"

	"github.com/emersion/go-imap/v2"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
)

// quill: QUOTA (RFC 9208), which upstream beta.8 does not serve:
// GETQUOTA, GETQUOTAROOT and their QUOTA and QUOTAROOT responses. Limits
// are set by the administrator, so QUOTASET is not offered and SETQUOTA is
// answered NO [NOPERM].

// QuotaResource is one resource of a quota root: what is used and the
// limit, in the resource's units (STORAGE in units of 1024 octets).
type QuotaResource struct {
	Name  imap.QuotaResourceType
	Usage int64
	Limit int64
}

// QuotaData is a QUOTA response: a quota root and its limited resources.
type QuotaData struct {
	Root      string
	Resources []QuotaResource
}

// SessionQuota is a session that supports QUOTA.
type SessionQuota interface {
	Session
	// QuotaResources are the resource types the session can limit, for
	// the QUOTA=RES-* capabilities.
	QuotaResources() []imap.QuotaResourceType
	// GetQuotaRoot returns the quota roots of a mailbox, each with its
	// resources (none when nothing limits the mailbox).
	GetQuotaRoot(mailbox string) ([]QuotaData, error)
	// GetQuota returns a quota root's resources.
	GetQuota(root string) (*QuotaData, error)
}

func (c *Conn) quotaSession() (SessionQuota, error) {
	s, ok := c.session.(SessionQuota)
	if !ok || !c.server.options.caps().Has(imap.CapQuota) {
		return nil, &imap.Error{Type: imap.StatusResponseTypeBad, Text: "Unknown command"}
	}
	return s, nil
}

func (c *Conn) handleGetQuota(dec *imapwire.Decoder) error {
	var root string
	if !dec.ExpectSP() || !dec.ExpectAString(&root) || !dec.ExpectCRLF() {
		return dec.Err()
	}
	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		return err
	}
	s, err := c.quotaSession()
	if err != nil {
		return err
	}
	q, err := s.GetQuota(root)
	if err != nil {
		return err
	}
	if len(q.Resources) == 0 { // quota-list needs one resource at least
		return &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeNonExistent, Text: "No limits under this quota root"}
	}
	return c.writeQuota(q)
}

func (c *Conn) handleGetQuotaRoot(dec *imapwire.Decoder) error {
	var mailbox string
	if !dec.ExpectSP() || !dec.ExpectMailbox(&mailbox) || !dec.ExpectCRLF() {
		return dec.Err()
	}
	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		return err
	}
	s, err := c.quotaSession()
	if err != nil {
		return err
	}
	all, err := s.GetQuotaRoot(mailbox)
	if err != nil {
		return err
	}
	var roots []QuotaData
	for _, q := range all {
		if len(q.Resources) > 0 { // quota-list needs one resource at least
			roots = append(roots, q)
		}
	}
	enc := newResponseEncoder(c)
	enc.Atom("*").SP().Atom("QUOTAROOT").SP().Mailbox(mailbox)
	for _, q := range roots {
		enc.SP().String(q.Root)
	}
	err = enc.CRLF()
	enc.end()
	if err != nil {
		return err
	}
	for i := range roots {
		if err := c.writeQuota(&roots[i]); err != nil {
			return err
		}
	}
	return nil
}

// handleSetQuota reads SETQUOTA (RFC 9208 §4.1.3) and refuses it: limits
// are the administrator's.
func (c *Conn) handleSetQuota(dec *imapwire.Decoder) error {
	var root string
	if !dec.ExpectSP() || !dec.ExpectAString(&root) || !dec.ExpectSP() {
		return dec.Err()
	}
	err := dec.ExpectList(func() error {
		var name string
		var limit int64
		if !dec.ExpectAtom(&name) || !dec.ExpectSP() || !dec.ExpectNumber64(&limit) {
			return dec.Err()
		}
		return nil
	})
	if err != nil {
		return err
	}
	if !dec.ExpectCRLF() {
		return dec.Err()
	}
	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		return err
	}
	if _, err := c.quotaSession(); err != nil {
		return err
	}
	return &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeNoPerm,
		Text: "Quotas are set by the administrator"}
}

func (c *Conn) writeQuota(q *QuotaData) error {
	enc := newResponseEncoder(c)
	defer enc.end()
	enc.Atom("*").SP().Atom("QUOTA").SP().String(q.Root).SP()
	enc.List(len(q.Resources), func(i int) {
		r := q.Resources[i]
		enc.Atom(strings.ToUpper(string(r.Name))).SP().Number64(r.Usage).SP().Number64(r.Limit)
	})
	return enc.CRLF()
}

// quotaCaps are the QUOTA capabilities of a session that supports it.
func quotaCaps(s SessionQuota) []imap.Cap {
	caps := []imap.Cap{imap.CapQuota}
	for _, r := range s.QuotaResources() {
		caps = append(caps, imap.Cap("QUOTA=RES-"+string(r)))
	}
	return caps
}

package imap

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"sort"
	"strings"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-sasl"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/retry"
	"github.com/quillmail/quill/internal/saslsrv"
	"github.com/quillmail/quill/internal/writer"
	"github.com/quillmail/quill/third_party/imapserver"
	"github.com/xdg-go/scram"
)

func sprintf(format string, args ...any) string { return fmt.Sprintf(format, args...) }

// session is one IMAP connection: the authenticated user and, when a
// mailbox is selected, this session's view of it.
type session struct {
	srv  *Server
	conn *imapserver.Conn
	// life ends with the session (the change subscription runs under
	// it); each command runs under the command's context (ctx).
	life context.Context
	end  context.CancelFunc

	user    string
	changes <-chan mailbox.Change
	unsub   func()
	// notify is the NOTIFY SET in force, nil without (notify.go).
	notify   *notifyState
	failures int

	sel *selected
	// last is the selection SELECT, EXAMINE or UNSELECT ended: selecting
	// the same mailbox again while it has not changed takes its messages
	// instead of listing them all again (reselect).
	last *selected
}

// Response codes not named by the library.
const (
	codeExpungeIssued imap.ResponseCode = "EXPUNGEISSUED" // RFC 5530
	codeReadOnly      imap.ResponseCode = "READ-ONLY"     // RFC 9051 §7.1
	codeUseAttr       imap.ResponseCode = "USEATTR"       // RFC 6154 §6
)

func no(code imap.ResponseCode, format string, args ...any) error {
	return &imap.Error{Type: imap.StatusResponseTypeNo, Code: code, Text: fmt.Sprintf(format, args...)}
}

func bad(format string, args ...any) error {
	return &imap.Error{Type: imap.StatusResponseTypeBad, Code: imap.ResponseCodeClientBug, Text: fmt.Sprintf(format, args...)}
}

// storeErr turns a mailbox manager error into the IMAP answer that names the
// mailbox and the cause.
func storeErr(what string, err error) error {
	var ie *imap.Error
	switch {
	case errors.As(err, &ie):
		return err
	case errors.Is(err, mailbox.ErrNoMailbox):
		return no(imap.ResponseCodeNonExistent, "%s: no such mailbox", what)
	case errors.Is(err, mailbox.ErrMailboxExists):
		return no(imap.ResponseCodeAlreadyExists, "%s: mailbox already exists", what)
	case errors.Is(err, mailbox.ErrBadName):
		// Not the error's text: from another node it names that node.
		return no(imap.ResponseCodeCannot, "%s: invalid mailbox name (RFC 9051 §5.1)", what)
	case errors.Is(err, writer.ErrTooManySubscriptions):
		return no(imap.ResponseCodeLimit, "%s: too many subscriptions to names with no mailbox", what)
	default:
		return err // logged by the library, answered NO [SERVERBUG]
	}
}

// ctx is the context of the command being run: it ends when the client
// hangs up (imapserver.Options.CommandContext) or the session ends.
func (s *session) ctx() context.Context {
	if s.conn == nil {
		return s.life
	}
	return s.conn.Context()
}

func (s *session) Close() error {
	s.stopNotify()
	s.end()
	if s.unsub != nil {
		s.unsub()
		s.unsub = nil
	}
	s.sel = nil
	s.srv.removeSession(s)
	return nil
}

// Login checks the password through the user manager (Porcupine §2.3.2:
// the proxy authenticates, then finds the user's mailbox fragments).
func (s *session) Login(username, password string) error {
	return s.finishLogin(saslsrv.Credentials{Mechanism: "LOGIN command", User: username, Password: password}, nil)
}

// AuthenticateMechanisms implements imapserver.SessionSASL; the library
// advertises them only where a login may be made (RFC 8314 §3).
func (s *session) AuthenticateMechanisms() []string { return saslsrv.Mechanisms }

// Authenticate implements imapserver.SessionSASL: AUTHENTICATE ends in
// finishLogin like LOGIN, so every mechanism has the same checks, delays
// and lockouts.
func (s *session) Authenticate(mech string) (sasl.Server, error) {
	if err := s.loginRefused("", mech); err != nil {
		return nil, err
	}
	srv, err := saslsrv.New(mech, func(user string) (scram.StoredCredentials, error) {
		return s.srv.auth.SCRAMKeys(s.ctx(), user)
	}, s.finishLogin)
	if errors.Is(err, saslsrv.ErrUnsupported) {
		return nil, no("", "AUTHENTICATE: mechanism %.40q not supported; offered: %s", mech, strings.Join(saslsrv.Mechanisms, " "))
	}
	if err != nil {
		return nil, err
	}
	return saslErrors{srv}, nil
}

// loginRefused refuses a login before any credential is looked at: after
// too many failures on this connection, or from an address locked out.
// AUTHENTICATE asks it before the exchange starts, so a SCRAM exchange
// from a locked-out address never reaches the proof (which would tell a
// right guess from a wrong one).
func (s *session) loginRefused(user, mech string) error {
	if s.failures >= maxFailedLogins {
		metrics.Login("imap", metrics.LoginLockedOut)
		s.conn.Bye("Too many failed logins")
		return imapserver.ErrAuthFailed
	}
	if logins := s.srv.cfg.Logins; logins != nil {
		remote := s.conn.NetConn().RemoteAddr()
		if err := logins.LoginAllowed(remote); err != nil {
			s.failures++
			metrics.Login("imap", metrics.LoginLockedOut)
			s.srv.cfg.Logger.Warn("login refused: address locked out", "user", user, "mech", mech, "remote", remote.String())
			return no(imap.ResponseCodeUnavailable, "too many failed logins from your address; try again later")
		}
	}
	return nil
}

// saslErrors answers a malformed SASL message with BAD, naming what was
// wrong, instead of the library's NO [SERVERBUG].
type saslErrors struct{ sasl.Server }

func (e saslErrors) Next(resp []byte) ([]byte, bool, error) {
	ch, done, err := e.Server.Next(resp)
	if errors.Is(err, saslsrv.ErrMalformed) {
		return nil, false, &imap.Error{Type: imap.StatusResponseTypeBad, Text: err.Error()}
	}
	return ch, done, err
}

// finishLogin ends a LOGIN or AUTHENTICATE: it checks the credentials (a
// password through the user manager, or a SCRAM proof already checked),
// applies the address's lockout and the failure delay, and opens the
// session's view of the user's mail.
func (s *session) finishLogin(creds saslsrv.Credentials, exErr error) error {
	username := creds.User
	if err := s.loginRefused(username, creds.Mechanism); err != nil {
		return err
	}
	remote := s.conn.NetConn().RemoteAddr()
	o := saslsrv.Check(s.ctx(), s.srv.auth, s.srv.cfg.Logins, remote, s.srv.cfg.AuthFailDelay, creds, exErr)
	if o.Err != nil && !o.Wrong {
		// Not a wrong password: the user's manager could not be asked
		// (RFC 5530 UNAVAILABLE, try again later).
		ref := fmt.Sprintf("%08x", rand.Uint32())
		metrics.Login("imap", metrics.LoginUnavailable)
		s.srv.cfg.Logger.Warn("login unavailable", "user", username, "mech", creds.Mechanism, "err", o.Err, "ref", ref)
		return no(imap.ResponseCodeUnavailable, "login for %s: temporarily unavailable, try again later (reference %s)", username, ref)
	}
	if o.Err != nil {
		s.failures++
		metrics.Login("imap", metrics.LoginFailed)
		s.srv.cfg.Logger.Info("imap: login failed", "user", username, "mech", creds.Mechanism, "remote", remote.String(), "err", o.Err, "delay", o.Delay)
		if o.Delay > 0 {
			retry.Sleep(s.ctx(), o.Delay) // ends early if the client hangs up
		}
		return imapserver.ErrAuthFailed
	}
	prof := o.Profile
	if err := s.srv.store.EnsureUser(s.ctx(), prof.Address); err != nil {
		ref := fmt.Sprintf("%08x", rand.Uint32())
		metrics.Login("imap", metrics.LoginUnavailable)
		s.srv.cfg.Logger.Warn("login: mailboxes unavailable", "user", prof.Address, "err", err, "ref", ref)
		return no(imap.ResponseCodeUnavailable, "login for %s: mailboxes unavailable, try again later (reference %s)", prof.Address, ref)
	}
	s.user = prof.Address
	metrics.Login("imap", metrics.LoginOK)
	s.changes, s.unsub = s.srv.store.Subscribe(s.life, s.user)
	s.srv.cfg.Logger.Info("imap: logged in", "user", s.user, "mech", creds.Mechanism, "remote", remote.String())
	return nil
}

// AppendLimit implements imapserver.SessionAppendLimit (RFC 7889).
func (s *session) AppendLimit() uint32 { return uint32(s.srv.cfg.MaxMessageBytes) }

// ClientID implements imapserver.SessionID.
func (s *session) ClientID(fields []string) {}

func (s *session) Namespace() (*imap.NamespaceData, error) {
	return &imap.NamespaceData{Personal: []imap.NamespaceDescriptor{{Prefix: "", Delim: rune(mailbox.Separator[0])}}}, nil
}

func (s *session) condStore() bool { return s.conn.EnabledCaps().Has(imap.CapCondStore) }
func (s *session) rev2() bool      { return s.conn.EnabledCaps().Has(imap.CapIMAP4rev2) }

// --- mailbox commands (RFC 9051 §6.3)

// parentsOf returns the superior hierarchical names of name, outermost
// first: "a/b/c" gives "a", "a/b".
func parentsOf(name string) []string {
	var out []string
	for i := 0; i < len(name); i++ {
		if name[i] == mailbox.Separator[0] {
			out = append(out, name[:i])
		}
	}
	return out
}

func (s *session) Create(name string, options *imap.CreateOptions) error {
	// A trailing delimiter declares the intent to create children (RFC
	// 9051 §6.3.4); the name itself is made without it.
	name = strings.TrimSuffix(name, mailbox.Separator)
	if strings.EqualFold(name, mailbox.Inbox) {
		return no(imap.ResponseCodeAlreadyExists, "CREATE INBOX: INBOX always exists")
	}
	if err := mailbox.ValidateName(name); err != nil {
		return no(imap.ResponseCodeCannot, "CREATE %q: %v", name, err)
	}
	use := ""
	if options != nil && len(options.SpecialUse) > 0 {
		if len(options.SpecialUse) > 1 {
			return no(codeUseAttr, "CREATE %q: only one special-use attribute per mailbox", name)
		}
		switch a := options.SpecialUse[0]; a {
		case imap.MailboxAttrAll, imap.MailboxAttrArchive, imap.MailboxAttrDrafts, imap.MailboxAttrFlagged,
			imap.MailboxAttrJunk, imap.MailboxAttrSent, imap.MailboxAttrTrash:
			use = string(a)
		default:
			return no(codeUseAttr, "CREATE %q: %s is not a special-use attribute", name, a)
		}
	}
	// RFC 9051 §6.3.4: create the superior names the new one needs.
	for _, p := range parentsOf(name) {
		if _, err := s.srv.store.Mailbox(s.ctx(), s.user, p); errors.Is(err, mailbox.ErrNoMailbox) {
			if _, err := s.srv.store.CreateMailbox(s.ctx(), s.user, p, ""); err != nil && !errors.Is(err, mailbox.ErrMailboxExists) {
				return storeErr(fmt.Sprintf("CREATE %q (parent %q)", name, p), err)
			}
		}
	}
	if _, err := s.srv.store.CreateMailbox(s.ctx(), s.user, name, use); err != nil {
		return storeErr(fmt.Sprintf("CREATE %q", name), err)
	}
	return nil
}

func (s *session) Delete(name string) error {
	if strings.EqualFold(name, mailbox.Inbox) {
		return no(imap.ResponseCodeCannot, "DELETE INBOX: INBOX cannot be deleted")
	}
	mb, err := s.srv.store.Mailbox(s.ctx(), s.user, name)
	if err != nil {
		return storeErr(fmt.Sprintf("DELETE %q", name), err)
	}
	if err := s.srv.store.DeleteMailbox(s.ctx(), s.user, name); err != nil {
		return storeErr(fmt.Sprintf("DELETE %q", name), err)
	}
	s.srv.recent.forget(s.user, mb.ID)
	return nil
}

func (s *session) Rename(oldName, newName string, options *imap.RenameOptions) error {
	newName = strings.TrimSuffix(newName, mailbox.Separator)
	what := fmt.Sprintf("RENAME %q to %q", oldName, newName)
	if err := mailbox.ValidateName(newName); err != nil {
		return no(imap.ResponseCodeCannot, "%s: %v", what, err)
	}
	if canonInbox(newName, '/') == canonInbox(oldName, '/') {
		return no(imap.ResponseCodeAlreadyExists, "%s: same name", what)
	}
	if strings.EqualFold(newName, mailbox.Inbox) {
		return no(imap.ResponseCodeAlreadyExists, "%s: INBOX always exists", what)
	}
	if strings.HasPrefix(newName, oldName+mailbox.Separator) {
		return no(imap.ResponseCodeCannot, "%s: a mailbox cannot move below itself", what)
	}
	if _, err := s.srv.store.Mailbox(s.ctx(), s.user, oldName); err != nil {
		return storeErr(what, err)
	}
	if err := s.srv.store.RenameMailbox(s.ctx(), s.user, oldName, newName); err != nil {
		return storeErr(what, err)
	}
	// RFC 9051 §6.3.6: superior names of the new name are created.
	for _, p := range parentsOf(newName) {
		if _, err := s.srv.store.Mailbox(s.ctx(), s.user, p); errors.Is(err, mailbox.ErrNoMailbox) {
			if _, err := s.srv.store.CreateMailbox(s.ctx(), s.user, p, ""); err != nil && !errors.Is(err, mailbox.ErrMailboxExists) {
				return storeErr(what, err)
			}
		}
	}
	return nil
}

func (s *session) Subscribe(name string) error {
	if err := s.srv.store.SetSubscribed(s.ctx(), s.user, name, true); err != nil {
		return storeErr(fmt.Sprintf("SUBSCRIBE %q", name), err)
	}
	return nil
}

func (s *session) Unsubscribe(name string) error {
	if err := s.srv.store.SetSubscribed(s.ctx(), s.user, name, false); err != nil {
		return storeErr(fmt.Sprintf("UNSUBSCRIBE %q", name), err)
	}
	return nil
}

// listEntry is a mailbox or an implied parent (a name that only exists as
// the superior of others, RFC 9051 §6.3.9: \NonExistent / \Noselect).
type listEntry struct {
	name     string
	mb       *mailbox.Mailbox // nil for an implied parent
	children bool
	// subscribed: a subscription to a name with no mailbox; subOnly: the
	// entry is there only for subscriptions (not listed without SUBSCRIBED).
	subscribed, subOnly bool
}

func (s *session) listEntries() ([]*listEntry, error) {
	boxes, subs, err := s.srv.store.MailboxList(s.ctx(), s.user)
	if err != nil {
		return nil, err
	}
	byName := map[string]*listEntry{}
	for i := range boxes {
		byName[boxes[i].Name] = &listEntry{name: boxes[i].Name, mb: &boxes[i]}
	}
	for _, n := range subs {
		if byName[n] == nil {
			byName[n] = &listEntry{name: n, subscribed: true, subOnly: true}
		}
	}
	entries := make([]*listEntry, 0, len(byName))
	for _, e := range byName {
		entries = append(entries, e)
	}
	for _, c := range entries {
		for _, p := range parentsOf(c.name) {
			e := byName[p]
			if e == nil {
				e = &listEntry{name: p, subOnly: true}
				byName[p] = e
			}
			if !c.subOnly {
				e.children, e.subOnly = true, false
			}
		}
	}
	out := make([]*listEntry, 0, len(byName))
	for _, e := range byName {
		out = append(out, e)
	}
	sort.Slice(out, func(i, j int) bool { return out[i].name < out[j].name })
	return out, nil
}

func (s *session) List(w *imapserver.ListWriter, ref string, patterns []string, options *imap.ListOptions) error {
	delim := mailbox.Separator[0]
	if len(patterns) == 0 {
		// RFC 9051 §6.3.9: an empty pattern asks for the delimiter and
		// the root of the reference.
		root := ""
		if i := strings.IndexByte(ref, delim); i >= 0 {
			root = ref[:i+1]
		}
		return w.WriteList(&imap.ListData{Attrs: []imap.MailboxAttr{imap.MailboxAttrNoSelect}, Delim: rune(delim), Mailbox: root})
	}
	entries, err := s.listEntries()
	if err != nil {
		return err
	}
	lsub := w.LSub()
	matches := func(name string) bool {
		for _, p := range patterns {
			full := p
			if ref != "" && !strings.HasPrefix(p, string(delim)) {
				full = ref + p
			}
			if matchMailbox(name, full, delim) {
				return true
			}
		}
		return false
	}
	// A parent is listed for its subscribed descendants (RECURSIVEMATCH's
	// CHILDINFO, LSUB's \Noselect) only when one of them is not listed
	// itself: it then stands for what the patterns leave out (RFC 5258
	// §3.5, RFC 3501 §6.3.9).
	unlistedSubChild := map[string]bool{}
	for _, c := range entries {
		if (c.subscribed || (c.mb != nil && c.mb.Subscribed)) && !matches(c.name) {
			for _, p := range parentsOf(c.name) {
				unlistedSubChild[p] = true
			}
		}
	}
	for _, e := range entries {
		if !matches(e.name) || (e.subOnly && !options.SelectSubscribed) {
			continue
		}
		subscribed := (e.mb != nil && e.mb.Subscribed) || e.subscribed
		var childInfo *imap.ListDataChildInfo
		noSelect := e.mb == nil
		if options.SelectSubscribed && !subscribed {
			switch {
			case lsub && unlistedSubChild[e.name]:
				// RFC 3501 §6.3.9: LSUB "%" shows an unsubscribed
				// parent of subscribed names as \Noselect.
				noSelect = true
			case options.SelectRecursiveMatch && unlistedSubChild[e.name]:
				childInfo = &imap.ListDataChildInfo{Subscribed: true}
			default:
				continue
			}
		}
		if options.SelectSpecialUse && (e.mb == nil || e.mb.SpecialUse == "") {
			continue
		}
		data := &imap.ListData{Delim: rune(delim), Mailbox: e.name, ChildInfo: childInfo}
		switch {
		case !noSelect:
		case e.subscribed && lsub:
			// LSUB's \Noselect says a name is not itself subscribed.
		case e.subscribed && options.SelectSubscribed:
			// RFC 5258 §3: a subscribed name with no mailbox; \NonExistent
			// implies \Noselect.
			data.Attrs = append(data.Attrs, imap.MailboxAttrNonExistent)
		case options.SelectSubscribed:
			data.Attrs = append(data.Attrs, imap.MailboxAttrNoSelect)
		default:
			data.Attrs = append(data.Attrs, imap.MailboxAttrNonExistent, imap.MailboxAttrNoSelect)
		}
		if e.children {
			data.Attrs = append(data.Attrs, imap.MailboxAttrHasChildren)
		} else {
			data.Attrs = append(data.Attrs, imap.MailboxAttrHasNoChildren)
		}
		if subscribed && (options.SelectSubscribed || options.ReturnSubscribed) {
			data.Attrs = append(data.Attrs, imap.MailboxAttrSubscribed)
		}
		if e.mb != nil && e.mb.SpecialUse != "" {
			data.Attrs = append(data.Attrs, imap.MailboxAttr(e.mb.SpecialUse))
		}
		if options.ReturnStatus != nil && e.mb != nil {
			st, err := s.status(e.mb, options.ReturnStatus)
			if err != nil {
				return err
			}
			data.Status = st
		}
		if err := w.WriteList(data); err != nil {
			return err
		}
	}
	return nil
}

func (s *session) Status(name string, options *imap.StatusOptions) (*imap.StatusData, error) {
	mb, err := s.srv.store.Mailbox(s.ctx(), s.user, name)
	if err != nil {
		return nil, storeErr(fmt.Sprintf("STATUS %q", name), err)
	}
	return s.status(mb, options)
}

func (s *session) status(mb *mailbox.Mailbox, options *imap.StatusOptions) (*imap.StatusData, error) {
	data := &imap.StatusData{Mailbox: mb.Name, UIDNext: imap.UID(mb.UIDNext), UIDValidity: mb.UIDValidity, HighestModSeq: mb.HighestModSeq}
	if options.NumMessages || options.NumUnseen || options.NumDeleted || options.Size || options.NumRecent || options.DeletedStorage {
		msgs, err := s.srv.store.Messages(s.ctx(), s.user, mb.ID)
		if err != nil {
			return nil, err
		}
		var num, unseen, deleted uint32
		var size, delSize int64
		uids := make([]uint32, len(msgs))
		for i := range msgs {
			m := &msgs[i]
			uids[i] = m.UID
			num++
			size += m.Size
			if !m.HasFlag(`\Seen`) {
				unseen++
			}
			if m.HasFlag(`\Deleted`) {
				deleted++
				delSize += m.Size
			}
		}
		recent := s.srv.recent.count(s.user, mb.ID, uids)
		data.NumMessages, data.NumUnseen, data.NumDeleted, data.NumRecent = &num, &unseen, &deleted, &recent
		data.Size, data.DeletedStorage = &size, &delSize
	}
	if options.AppendLimit {
		l := s.AppendLimit()
		data.AppendLimit = &l
	}
	return data, nil
}

// maxAppendFlags bounds the flags of one APPEND or STORE; real clients send
// a handful.
const maxFlags = 128

func (s *session) Append(name string, r imap.LiteralReader, options *imap.AppendOptions) (*imap.AppendData, error) {
	what := fmt.Sprintf("APPEND to %q", name)
	if r.Size() > s.srv.cfg.MaxMessageBytes {
		return nil, no(imap.ResponseCodeTooBig, "%s: message of %d bytes is over the limit of %d", what, r.Size(), s.srv.cfg.MaxMessageBytes)
	}
	raw, err := io.ReadAll(io.LimitReader(r, s.srv.cfg.MaxMessageBytes+1))
	if err != nil {
		return nil, err
	}
	msgs, err := s.newMessages(what, name, []imapserver.AppendMessage{{Options: *options, Data: raw}})
	if err != nil {
		return nil, err
	}
	mb, msg, err := s.srv.store.Append(s.ctx(), s.user, name, msgs[0].Raw, msgs[0].Flags, msgs[0].Date)
	if err != nil {
		return nil, storeErr(what, err)
	}
	return &imap.AppendData{UID: imap.UID(msg.UID), UIDValidity: mb.UIDValidity}, nil
}

// AppendMulti implements imapserver.SessionMultiAppend (RFC 3502): the
// messages of one APPEND, stored all or none.
func (s *session) AppendMulti(name string, in []imapserver.AppendMessage) (*imapserver.MultiAppendData, error) {
	what := fmt.Sprintf("APPEND of %d messages to %q", len(in), name)
	msgs, err := s.newMessages(what, name, in)
	if err != nil {
		return nil, err
	}
	mb, stored, err := s.srv.store.AppendMulti(s.ctx(), s.user, name, msgs)
	if err != nil {
		return nil, storeErr(what, err)
	}
	out := &imapserver.MultiAppendData{UIDValidity: mb.UIDValidity}
	for _, m := range stored {
		out.UIDs = append(out.UIDs, imap.UID(m.UID))
	}
	return out, nil
}

// newMessages checks an APPEND's messages (the mailbox exists, each is
// within the size limit and the flag limit, all of them within the
// user's quota) and returns them as the store takes them.
func (s *session) newMessages(what, name string, in []imapserver.AppendMessage) ([]mailbox.NewMessage, error) {
	_, usage, err := s.srv.store.MailboxUsage(s.ctx(), s.user, name)
	if err != nil {
		if errors.Is(err, mailbox.ErrNoMailbox) {
			// RFC 9051 §6.3.12: TRYCREATE when the mailbox does not exist.
			return nil, no(imap.ResponseCodeTryCreate, "%s: no such mailbox", what)
		}
		return nil, storeErr(what, err)
	}
	out := make([]mailbox.NewMessage, 0, len(in))
	var total int64
	for i, m := range in {
		if int64(len(m.Data)) > s.srv.cfg.MaxMessageBytes {
			return nil, no(imap.ResponseCodeTooBig, "%s: message %d of %d bytes is over the limit of %d", what, i+1, len(m.Data), s.srv.cfg.MaxMessageBytes)
		}
		if len(m.Options.Flags) > maxFlags {
			return nil, bad("%s: more than %d flags", what, maxFlags)
		}
		flags := make([]string, 0, len(m.Options.Flags))
		for _, f := range m.Options.Flags {
			flags = append(flags, string(f))
		}
		date := m.Options.Time
		if date.IsZero() {
			date = time.Now()
		}
		total += int64(len(m.Data))
		out = append(out, mailbox.NewMessage{Raw: m.Data, Flags: flags, Date: date})
	}
	if err := checkQuota(what, usage, int64(len(in)), total); err != nil {
		return nil, err
	}
	if err := s.checkDomainQuota(what, int64(len(in)), total); err != nil {
		return nil, err
	}
	return out, nil
}

// --- selection

func (s *session) Select(name string, options *imap.SelectOptions) (*imap.SelectData, error) {
	if s.sel != nil {
		s.last = s.sel
	}
	s.sel = nil
	what := fmt.Sprintf("SELECT %q", name)
	if options.ReadOnly {
		what = fmt.Sprintf("EXAMINE %q", name)
	}
	mb, err := s.srv.store.Mailbox(s.ctx(), s.user, name)
	if err != nil {
		return nil, storeErr(what, err)
	}
	sel := &selected{id: mb.ID, name: mb.Name, uidValidity: mb.UIDValidity, readOnly: options.ReadOnly,
		modSeq: mb.HighestModSeq}
	if prev := reselect(s.last, mb); prev != nil {
		// Nothing changed since the last selection of this mailbox:
		// its messages (and the sort keys and ids it read) stand.
		sel.msgs, sel.sortCache, sel.emailIDs = prev.msgs, prev.sortCache, prev.emailIDs
	} else {
		msgs, err := s.srv.store.Messages(s.ctx(), s.user, mb.ID)
		if err != nil {
			return nil, err
		}
		sel.msgs = make([]*msgState, 0, len(msgs))
		for i := range msgs {
			sel.msgs = append(sel.msgs, newMsgState(&msgs[i]))
		}
	}
	s.last = nil
	maxUID := uint32(0)
	if len(sel.msgs) > 0 {
		maxUID = sel.msgs[len(sel.msgs)-1].uid
	}
	firstRecent := s.srv.recent.claim(s.user, mb.ID, maxUID, options.ReadOnly)
	data := &imap.SelectData{UIDNext: imap.UID(mb.UIDNext), UIDValidity: mb.UIDValidity, HighestModSeq: mb.HighestModSeq}
	for i, m := range sel.msgs {
		m.recent = m.uid >= firstRecent
		if m.recent {
			data.NumRecent++
		}
		if data.FirstUnseenSeqNum == 0 && !m.has(`\Seen`) {
			data.FirstUnseenSeqNum = uint32(i + 1)
		}
	}
	sel.uidHigh = maxUID
	sel.uidNext = mb.UIDNext
	data.NumMessages = uint32(len(sel.msgs))
	data.Flags = sel.mailboxFlags()
	sel.flagsSent = flagSetKey(data.Flags)
	data.PermanentFlags = sel.permanentFlags(data.Flags)
	if s.rev2() {
		data.List = &imap.ListData{Delim: rune(mailbox.Separator[0]), Mailbox: mb.Name}
	}
	s.sel = sel
	return data, nil
}

func (s *session) Unselect() error {
	s.last, s.sel = s.sel, nil
	return nil
}

// reselect returns the selection that ended last when it shows mailbox mb
// as it is now: the same mailbox (id and UIDVALIDITY), synced to its
// HIGHESTMODSEQ and UIDNEXT (every flag change, expunge and delivery moves
// one of them; the writer shows neither past a change in flight), with no
// message expunged elsewhere still numbered. Nil otherwise: the messages
// are listed again.
func reselect(last *selected, mb *mailbox.Mailbox) *selected {
	if last == nil || last.id != mb.ID || last.uidValidity != mb.UIDValidity || last.modSeq != mb.HighestModSeq ||
		last.uidNext != mb.UIDNext || last.ghosts > 0 {
		return nil
	}
	return last
}

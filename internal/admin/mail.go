package admin

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/migrate"
	"github.com/quillmail/quill/internal/userdb"
)

// Mail is a user's mailboxes as IMAP sees them (proxy.IMAPStore): what the
// mail API (`quill import`, `quill export`) reads and writes goes through
// the user's mailbox writer on the bucket's manager, as a client's
// APPEND, STORE and FETCH do, so UIDs, replication, quotas and the text
// index treat imported mail as any other.
type Mail interface {
	MailboxList(ctx context.Context, user string) ([]mailbox.Mailbox, []string, error)
	MailboxUsage(ctx context.Context, user, name string) (*mailbox.Mailbox, mailbox.Usage, error)
	CreateMailbox(ctx context.Context, user, name, specialUse string) (*mailbox.Mailbox, error)
	SetSubscribed(ctx context.Context, user, name string, on bool) error
	Messages(ctx context.Context, user string, id uint64) ([]mailbox.Message, error)
	Body(ctx context.Context, user, id string) ([]byte, error)
	Append(ctx context.Context, user, name string, raw []byte, flags []string, date time.Time) (*mailbox.Mailbox, mailbox.Message, error)
	StoreFlags(ctx context.Context, user string, mbox uint64, uids []uint32, op mailbox.FlagOp, flags []string, unchangedSince uint64) ([]mailbox.Message, []uint32, error)
}

// maxAPIFlags bounds the flags of one message, as IMAP's APPEND and STORE
// do (imap.maxFlags).
const maxAPIFlags = 128

// maxFlagUIDs bounds the UIDs of one flag change request.
const maxFlagUIDs = 10000

// mailStatus maps an error of the mail API to its HTTP status: what the
// caller named is missing (404), exists (409), is refused for the user's
// quota (507) or is malformed (400); anything else is the cluster failing
// for now (503), which a rerun gets past.
func mailStatus(err error) int {
	switch {
	case errors.Is(err, userdb.ErrNotFound), errors.Is(err, mailbox.ErrNoMailbox), errors.Is(err, mailbox.ErrNoMessage):
		return http.StatusNotFound
	case errors.Is(err, mailbox.ErrMailboxExists):
		return http.StatusConflict
	case errors.Is(err, userdb.ErrOverQuota):
		return http.StatusInsufficientStorage
	case errors.Is(err, mailbox.ErrBadName):
		return http.StatusBadRequest
	default:
		return http.StatusServiceUnavailable
	}
}

// mailboxJSON is one mailbox in the mail API.
type mailboxJSON struct {
	Name        string `json:"name"`
	SpecialUse  string `json:"special_use,omitempty"`
	Subscribed  bool   `json:"subscribed"`
	UIDValidity uint32 `json:"uidvalidity,omitempty"`
	UIDNext     uint32 `json:"uidnext,omitempty"`
}

func toMailboxJSON(m *mailbox.Mailbox) mailboxJSON {
	return mailboxJSON{Name: m.Name, SpecialUse: m.SpecialUse, Subscribed: m.Subscribed, UIDValidity: m.UIDValidity, UIDNext: m.UIDNext}
}

// mailboxesJSON is GET /api/users/{address}/mailboxes: the mailboxes,
// subscriptions to names without one, and the largest message the node
// takes (so an import can tell what it will refuse before sending it).
type mailboxesJSON struct {
	Mailboxes      []mailboxJSON `json:"mailboxes"`
	Subscriptions  []string      `json:"subscriptions,omitempty"`
	MaxMessageSize int64         `json:"max_message_size"`
}

// userOf returns the path's user, normalized, once the user is known.
func (s *Server) userOf(w http.ResponseWriter, r *http.Request) (string, bool) {
	if s.Mail == nil {
		writeError(w, http.StatusNotFound, errors.New("no mail API on this node"))
		return "", false
	}
	user := userdb.Normalize(r.PathValue("address"))
	prof, _, err := s.Users.Lookup(r.Context(), user)
	if err == nil && prof.Deleted {
		err = fmt.Errorf("user %s: %w", user, userdb.ErrNotFound)
	}
	if err != nil {
		writeError(w, mailStatus(err), err)
		return "", false
	}
	return user, true
}

func (s *Server) listMailboxes(w http.ResponseWriter, r *http.Request) {
	user, ok := s.userOf(w, r)
	if !ok {
		return
	}
	boxes, subs, err := s.Mail.MailboxList(r.Context(), user)
	if err != nil {
		writeError(w, mailStatus(err), err)
		return
	}
	out := mailboxesJSON{Mailboxes: []mailboxJSON{}, Subscriptions: subs, MaxMessageSize: s.MaxMessageBytes}
	for i := range boxes {
		out.Mailboxes = append(out.Mailboxes, toMailboxJSON(&boxes[i]))
	}
	writeJSON(w, http.StatusOK, out)
}

// specialUseOK are the RFC 6154 uses a mailbox may be made with.
var specialUseOK = []string{"", `\Sent`, `\Drafts`, `\Trash`, `\Junk`, `\Archive`, `\All`, `\Flagged`}

// ensureMailbox is POST /api/users/{address}/mailboxes: the mailbox is
// made unless it exists (201, or 200 with it as it is), and subscribed
// when asked. A rerun of an import asks again and changes nothing.
func (s *Server) ensureMailbox(w http.ResponseWriter, r *http.Request) {
	user, ok := s.userOf(w, r)
	if !ok {
		return
	}
	var req mailboxJSON
	if err := readJSON(r, &req); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	if !slices.Contains(specialUseOK, req.SpecialUse) {
		writeError(w, http.StatusBadRequest, fmt.Errorf("mailbox %q: special use %q is not one of %s", req.Name, req.SpecialUse, strings.Join(specialUseOK[1:], " ")))
		return
	}
	if err := mailbox.ValidateName(req.Name); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	code := http.StatusOK
	mb, _, err := s.Mail.MailboxUsage(r.Context(), user, req.Name)
	if errors.Is(err, mailbox.ErrNoMailbox) {
		mb, err = s.Mail.CreateMailbox(r.Context(), user, req.Name, req.SpecialUse)
		code = http.StatusCreated
	}
	if err != nil {
		writeError(w, mailStatus(err), err)
		return
	}
	if req.Subscribed && !mb.Subscribed {
		if err := s.Mail.SetSubscribed(r.Context(), user, mb.Name, true); err != nil {
			writeError(w, mailStatus(err), err)
			return
		}
		mb.Subscribed = true
	}
	if code == http.StatusCreated {
		s.Logger.Info("mailbox created", "user", user, "mailbox", mb.Name)
	}
	writeJSON(w, code, toMailboxJSON(mb))
}

// messageJSON is one message in a listing (a line of NDJSON).
type messageJSON struct {
	UID   uint32    `json:"uid"`
	ID    string    `json:"id"`
	Size  int64     `json:"size"`
	Date  time.Time `json:"date"`
	Flags []string  `json:"flags"`
	// Key is migrate.Key of the message, when the listing asked (keys=1).
	Key string `json:"key,omitempty"`
}

// listMessages is GET /api/users/{address}/messages?mailbox=NAME: one
// JSON object per line, UID order; with keys=1 each carries its
// migrate.Key, for which every body is read (an import's rerun needs
// them; an export does not).
func (s *Server) listMessages(w http.ResponseWriter, r *http.Request) {
	user, ok := s.userOf(w, r)
	if !ok {
		return
	}
	name := r.URL.Query().Get("mailbox")
	mb, _, err := s.Mail.MailboxUsage(r.Context(), user, name)
	if err != nil {
		writeError(w, mailStatus(err), err)
		return
	}
	msgs, err := s.Mail.Messages(r.Context(), user, mb.ID)
	if err != nil {
		writeError(w, mailStatus(err), err)
		return
	}
	keys := r.URL.Query().Get("keys") == "1"
	w.Header().Set("Content-Type", "application/x-ndjson")
	w.Header().Set("X-Quill-UIDValidity", strconv.FormatUint(uint64(mb.UIDValidity), 10))
	w.WriteHeader(http.StatusOK)
	bw := bufio.NewWriter(w)
	enc := json.NewEncoder(bw)
	for _, m := range msgs {
		out := messageJSON{UID: m.UID, ID: m.ID, Size: m.Size, Date: m.Date.UTC(), Flags: migrate.CleanFlags(m.Flags)}
		if keys {
			raw, err := s.Mail.Body(r.Context(), user, m.ID)
			if err != nil {
				// The listing is cut short; the client sees no end line
				// and fails rather than taking the message for missing.
				s.Logger.Warn("message listing cut short", "user", user, "mailbox", mb.Name, "uid", m.UID, "err", err)
				bw.Flush()
				return
			}
			out.Key = migrate.KeyOf(raw)
		}
		if err := enc.Encode(out); err != nil {
			return // the client went away
		}
	}
	// The end line: a listing without it was cut short.
	enc.Encode(map[string]int{"end": len(msgs)})
	bw.Flush()
}

// getMessage is GET /api/users/{address}/messages/{id}: the message's bytes.
func (s *Server) getMessage(w http.ResponseWriter, r *http.Request) {
	user, ok := s.userOf(w, r)
	if !ok {
		return
	}
	raw, err := s.Mail.Body(r.Context(), user, r.PathValue("id"))
	if err != nil {
		writeError(w, mailStatus(err), err)
		return
	}
	w.Header().Set("Content-Type", "message/rfc822")
	w.Header().Set("Content-Length", strconv.Itoa(len(raw)))
	w.Write(raw)
}

// appendMessage is POST /api/users/{address}/messages?mailbox=NAME
// [&flag=F...][&date=RFC3339]: the body is the message, stored as an IMAP
// APPEND stores it (the mailbox must exist; the size limit and the
// user's quota apply). The answer names its UID.
func (s *Server) appendMessage(w http.ResponseWriter, r *http.Request) {
	user, ok := s.userOf(w, r)
	if !ok {
		return
	}
	q := r.URL.Query()
	name := q.Get("mailbox")
	flags := q["flag"]
	if len(flags) > maxAPIFlags {
		writeError(w, http.StatusBadRequest, fmt.Errorf("more than %d flags", maxAPIFlags))
		return
	}
	for _, f := range flags {
		if !migrate.ValidFlag(f) {
			writeError(w, http.StatusBadRequest, fmt.Errorf("flag %q: not a system flag or an IMAP atom", f))
			return
		}
	}
	date := time.Now()
	if d := q.Get("date"); d != "" {
		var err error
		if date, err = time.Parse(time.RFC3339, d); err != nil {
			writeError(w, http.StatusBadRequest, fmt.Errorf("date %q: want RFC 3339 (2006-01-02T15:04:05Z): %w", d, err))
			return
		}
	}
	max := s.MaxMessageBytes
	if max <= 0 {
		max = defaultMaxMessage
	}
	if r.ContentLength > max {
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("message of %d bytes is over the limit of %d (--max-message-size)", r.ContentLength, max))
		return
	}
	raw, err := io.ReadAll(io.LimitReader(r.Body, max+1))
	switch {
	case err != nil:
		writeError(w, http.StatusBadRequest, fmt.Errorf("message: %w", err))
		return
	case int64(len(raw)) > max:
		writeError(w, http.StatusRequestEntityTooLarge, fmt.Errorf("message over the limit of %d bytes (--max-message-size)", max))
		return
	case len(raw) == 0:
		writeError(w, http.StatusBadRequest, errors.New("empty message"))
		return
	}
	_, usage, err := s.Mail.MailboxUsage(r.Context(), user, name)
	if err != nil {
		writeError(w, mailStatus(err), err)
		return
	}
	if usage.Over(1, int64(len(raw))) {
		writeError(w, http.StatusInsufficientStorage, fmt.Errorf("user %s: %s: %w", user, usage, userdb.ErrOverQuota))
		return
	}
	mb, msg, err := s.Mail.Append(r.Context(), user, name, raw, flags, date)
	if err != nil {
		writeError(w, mailStatus(err), err)
		return
	}
	writeJSON(w, http.StatusCreated, map[string]any{"mailbox": mb.Name, "uidvalidity": mb.UIDValidity, "uid": msg.UID, "id": msg.ID, "size": msg.Size})
}

// defaultMaxMessage is the size limit of a Server not told one (the
// node's --max-message-size default).
const defaultMaxMessage = 25 << 20

// flagsJSON is POST /api/users/{address}/flags: the flags of the UIDs of
// a mailbox become Flags (an IMAP STORE FLAGS).
type flagsJSON struct {
	Mailbox string   `json:"mailbox"`
	UIDs    []uint32 `json:"uids"`
	Flags   []string `json:"flags"`
}

func (s *Server) setFlags(w http.ResponseWriter, r *http.Request) {
	user, ok := s.userOf(w, r)
	if !ok {
		return
	}
	var req flagsJSON
	if err := json.NewDecoder(io.LimitReader(r.Body, maxRequestBody*16)).Decode(&req); err != nil {
		writeError(w, http.StatusBadRequest, fmt.Errorf("request body: %w", err))
		return
	}
	if len(req.UIDs) == 0 || len(req.UIDs) > maxFlagUIDs || len(req.Flags) > maxAPIFlags {
		writeError(w, http.StatusBadRequest, fmt.Errorf("1 to %d UIDs and at most %d flags", maxFlagUIDs, maxAPIFlags))
		return
	}
	for _, f := range req.Flags {
		if !migrate.ValidFlag(f) {
			writeError(w, http.StatusBadRequest, fmt.Errorf("flag %q: not a system flag or an IMAP atom", f))
			return
		}
	}
	mb, _, err := s.Mail.MailboxUsage(r.Context(), user, req.Mailbox)
	if err != nil {
		writeError(w, mailStatus(err), err)
		return
	}
	updated, failed, err := s.Mail.StoreFlags(r.Context(), user, mb.ID, req.UIDs, mailbox.FlagsSet, req.Flags, 0)
	if err != nil {
		writeError(w, mailStatus(err), err)
		return
	}
	writeJSON(w, http.StatusOK, map[string]any{"updated": len(updated), "failed": failed})
}

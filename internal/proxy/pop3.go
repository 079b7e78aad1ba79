package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/pop3"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/writer"
	"github.com/xdg-go/scram"
)

// POP3 adapts the proxy to the POP3 server's Backend: a maildrop is the
// user's INBOX as its writer sees it, gathered from every fragment in the
// mail map (Porcupine §2.3.2). A fragment node that does not answer hides
// its messages; the session goes on with the rest.
type POP3 struct {
	P   *Proxy
	Log *slog.Logger
}

// Login implements pop3.Backend.
func (b POP3) Login(ctx context.Context, user, password string) (pop3.Maildrop, error) {
	prof, err := b.P.Login(ctx, user, password)
	if errors.Is(err, userdb.ErrNotFound) || errors.Is(err, userdb.ErrPasswordMismatch) {
		return nil, fmt.Errorf("%w: %v", pop3.ErrAuthFailed, err)
	}
	if err != nil {
		// Not the client's fault (the user's manager unreachable, too
		// many checks at once): a temporary failure, not a wrong password.
		return nil, err
	}
	metrics.Sessions.WithLabelValues("pop3").Inc()
	return &maildrop{p: b.P, log: b.Log, user: prof.Address}, nil
}

// SCRAMKeys implements pop3.Backend.
func (b POP3) SCRAMKeys(ctx context.Context, user string) (scram.StoredCredentials, error) {
	return b.P.SCRAMKeys(ctx, user)
}

// Open implements pop3.Backend: the maildrop of a user whose SCRAM proof
// was checked.
func (b POP3) Open(ctx context.Context, user string) (pop3.Maildrop, error) {
	prof, err := b.P.Proven(ctx, user)
	if errors.Is(err, userdb.ErrNotFound) {
		return nil, fmt.Errorf("%w: %v", pop3.ErrAuthFailed, err)
	}
	if err != nil {
		return nil, err
	}
	metrics.Sessions.WithLabelValues("pop3").Inc()
	return &maildrop{p: b.P, log: b.Log, user: prof.Address}, nil
}

type maildrop struct {
	p    *Proxy
	log  *slog.Logger
	user string
	mbox uint64
	at   map[string]location
}

// location is where a message of the maildrop lives.
type location struct {
	nodes []cluster.NodeID
	uid   uint32
}

func (d *maildrop) List(ctx context.Context) ([]pop3.Message, error) {
	ctx, cancel := context.WithTimeout(ctx, writerCallTimeout)
	defer cancel()
	rep, err := d.p.Writers.For(d.user).Messages(ctx, &writer.MailboxRequest{User: d.user, Name: mailbox.Inbox})
	if err != nil {
		return nil, err
	}
	d.mbox = rep.Mailbox.ID
	d.at = make(map[string]location, len(rep.Messages))
	out := make([]pop3.Message, 0, len(rep.Messages))
	for _, m := range rep.Messages {
		d.at[m.ID] = location{nodes: m.Sources(), uid: m.UID}
		out = append(out, pop3.Message{UID: m.ID, Size: m.Size})
	}
	return out, nil
}

func (d *maildrop) Open(ctx context.Context, uid string) (io.ReadCloser, error) {
	loc, ok := d.at[uid]
	if !ok {
		return nil, fmt.Errorf("message %s: not in this maildrop", uid)
	}
	return d.p.openBody(ctx, loc.nodes, d.user, uid)
}

func (d *maildrop) Delete(ctx context.Context, uids []string) error {
	var imapUIDs []uint32
	for _, u := range uids {
		if loc, ok := d.at[u]; ok {
			imapUIDs = append(imapUIDs, loc.uid)
		}
	}
	if len(imapUIDs) == 0 {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, writerCallTimeout)
	defer cancel()
	_, err := d.p.Writers.For(d.user).Expunge(ctx, &writer.FlagsRequest{User: d.user, ID: d.mbox, UIDs: imapUIDs})
	return err
}

func (d *maildrop) Close() error { return nil }

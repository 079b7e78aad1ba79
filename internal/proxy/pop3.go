package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/pop3"
)

// POP3 adapts the proxy to the POP3 server's Backend: a maildrop is the
// user's INBOX, gathered from the fragments of the mail map.
type POP3 struct{ P *Proxy }

// Login implements pop3.Backend.
func (b POP3) Login(ctx context.Context, user, password string) (pop3.Maildrop, error) {
	prof, err := b.P.Login(ctx, user, password)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", pop3.ErrAuthFailed, err)
	}
	return &maildrop{p: b.P, user: prof.Address}, nil
}

type maildrop struct {
	p     *Proxy
	user  string
	mbox  uint64
	byUID map[string]uint32
}

func (d *maildrop) List(ctx context.Context) ([]pop3.Message, error) {
	mb, err := d.p.Boxes.Mailbox(d.user, mailbox.Inbox)
	if errors.Is(err, mailbox.ErrNoMailbox) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	msgs, err := d.p.Boxes.Messages(d.user, mb.ID)
	if err != nil {
		return nil, err
	}
	d.mbox = mb.ID
	d.byUID = make(map[string]uint32, len(msgs))
	out := make([]pop3.Message, len(msgs))
	for i, m := range msgs {
		out[i] = pop3.Message{UID: m.ID, Size: m.Size}
		d.byUID[m.ID] = m.UID
	}
	return out, nil
}

func (d *maildrop) Open(ctx context.Context, uid string) (io.ReadCloser, error) {
	return d.p.Boxes.OpenBody(d.user, uid)
}

func (d *maildrop) Delete(ctx context.Context, uids []string) error {
	imapUIDs := make([]uint32, 0, len(uids))
	for _, u := range uids {
		if n, ok := d.byUID[u]; ok {
			imapUIDs = append(imapUIDs, n)
		}
	}
	if len(imapUIDs) == 0 {
		return nil
	}
	_, err := d.p.Boxes.Expunge(d.user, d.mbox, imapUIDs)
	return err
}

func (d *maildrop) Close() error { return nil }

package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sort"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/pop3"
)

// POP3 adapts the proxy to the POP3 server's Backend: a maildrop is the
// user's INBOX, gathered from every fragment in the mail map (Porcupine
// §2.3.2). A fragment node that does not answer hides its messages for the
// session; the session goes on with the rest.
type POP3 struct {
	P   *Proxy
	Log *slog.Logger
}

// Login implements pop3.Backend.
func (b POP3) Login(ctx context.Context, user, password string) (pop3.Maildrop, error) {
	prof, err := b.P.Login(ctx, user, password)
	if err != nil {
		return nil, fmt.Errorf("%w: %v", pop3.ErrAuthFailed, err)
	}
	return &maildrop{p: b.P, log: b.Log, user: prof.Address}, nil
}

type maildrop struct {
	p    *Proxy
	log  *slog.Logger
	user string
	at   map[string]location
}

// location is where a message of the maildrop lives.
type location struct {
	node    cluster.NodeID
	mailbox uint64
	uid     uint32
}

func (d *maildrop) List(ctx context.Context) ([]pop3.Message, error) {
	_, mailMap, err := d.p.Users.Lookup(ctx, d.user)
	if err != nil {
		return nil, err
	}
	type entry struct {
		pop3.Message
		order string
	}
	var all []entry
	d.at = map[string]location{}
	for _, n := range mailMap {
		var rep *ListReply
		if n == d.p.Self {
			rep, err = d.p.LocalList(ctx, &ListRequest{User: d.user})
		} else {
			rep = &ListReply{}
			err = d.p.Peers.Call(ctx, n, "mailbox.List", &ListRequest{User: d.user}, rep)
		}
		if err != nil {
			d.log.Warn("fragment unavailable, its messages are hidden this session", "user", d.user, "node", n, "err", err)
			continue
		}
		for _, m := range rep.Messages {
			if _, dup := d.at[m.ID]; dup {
				continue
			}
			d.at[m.ID] = location{node: n, mailbox: rep.Mailbox, uid: m.UID}
			all = append(all, entry{pop3.Message{UID: m.ID, Size: m.Size}, m.ID})
		}
	}
	// Message ids begin with their arrival time, so sorting by id lists
	// the fragments' messages oldest first.
	sort.Slice(all, func(i, j int) bool { return all[i].order < all[j].order })
	out := make([]pop3.Message, len(all))
	for i, e := range all {
		out[i] = e.Message
	}
	return out, nil
}

func (d *maildrop) Open(ctx context.Context, uid string) (io.ReadCloser, error) {
	loc, ok := d.at[uid]
	if !ok {
		return nil, fmt.Errorf("message %s: not in this maildrop", uid)
	}
	if loc.node == d.p.Self {
		return d.p.Boxes.OpenBody(d.user, uid)
	}
	var rep BodyReply
	if err := d.p.Peers.Call(ctx, loc.node, "mailbox.Body", &BodyRequest{User: d.user, ID: uid}, &rep); err != nil {
		return nil, err
	}
	return io.NopCloser(bytes.NewReader(rep.Raw)), nil
}

func (d *maildrop) Delete(ctx context.Context, uids []string) error {
	type key struct {
		node    cluster.NodeID
		mailbox uint64
	}
	groups := map[key][]uint32{}
	for _, u := range uids {
		if loc, ok := d.at[u]; ok {
			k := key{loc.node, loc.mailbox}
			groups[k] = append(groups[k], loc.uid)
		}
	}
	var firstErr error
	for k, us := range groups {
		req := &ExpungeRequest{User: d.user, Mailbox: k.mailbox, UIDs: us}
		var err error
		if k.node == d.p.Self {
			_, err = d.p.LocalExpunge(ctx, req)
		} else {
			err = d.p.Peers.Call(ctx, k.node, "mailbox.Expunge", req, &struct{}{})
		}
		if err != nil && firstErr == nil {
			firstErr = fmt.Errorf("delete on %s: %w", k.node, err)
		}
	}
	return firstErr
}

func (d *maildrop) Close() error { return nil }

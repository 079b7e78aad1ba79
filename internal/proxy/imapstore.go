package proxy

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"slices"
	"sync"
	"time"

	"github.com/hashicorp/golang-lru/simplelru"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/fts"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/mimepart"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/writer"
	"github.com/xdg-go/scram"
)

// IMAPStore is the IMAP retrieval proxy's view of a user's mail across the
// cluster (Porcupine §2.3.2): mailbox state and every change go through the
// user's mailbox writer on the bucket's manager (Neptune level 2), bodies
// come straight from the node that stores them. It satisfies imap.Store, so
// the IMAP server has one code path for one node and for many.
type IMAPStore struct {
	P *Proxy

	mu sync.Mutex
	// where remembers, for the whereUsers users whose views were read last,
	// the nodes of each message id of each mailbox's last view the writer
	// sent (*boxSources by user): bodies are fetched there without asking
	// it. A user past the bound, or a message not in the last view, is
	// found through the mail map instead.
	where *simplelru.LRU
}

// whereUsers bounds IMAPStore.where: about 100 bytes a message, so 256
// users of 1,000 messages each hold about 25 MB, and a node's memory does
// not grow with every user who ever opened a mailbox on it.
const whereUsers = 256

// boxSources are a user's message locations, by mailbox ID and message id.
type boxSources map[uint64]map[string][]cluster.NodeID

// opTimeout bounds one IMAP operation's round trips to the writer and the
// fragments.
const opTimeout = 30 * time.Second

// versionPoll is how often a session's subscription asks the user's writer
// whether anything changed: changes made through other nodes reach an IDLE
// session within this time.
const versionPoll = 500 * time.Millisecond

// op bounds one operation of a command, under the command's context (which
// ends when the client hangs up).
func withOpTimeout(ctx context.Context) (context.Context, context.CancelFunc) {
	return context.WithTimeout(ctx, opTimeout)
}

// IMAPAuth authenticates IMAP logins through the proxy and counts the
// sessions they open (the IMAP server counts every login's outcome).
type IMAPAuth struct{ P *Proxy }

// Login implements imap.Authenticator.
func (a IMAPAuth) Login(ctx context.Context, user, password string) (*userdb.Profile, error) {
	p, err := a.P.Login(ctx, user, password)
	if err != nil {
		return nil, err
	}
	metrics.Sessions.WithLabelValues("imap").Inc()
	return p, nil
}

// SCRAMKeys implements imap.Authenticator.
func (a IMAPAuth) SCRAMKeys(ctx context.Context, user string) (scram.StoredCredentials, error) {
	return a.P.SCRAMKeys(ctx, user)
}

// Proven implements imap.Authenticator.
func (a IMAPAuth) Proven(ctx context.Context, user string) (*userdb.Profile, error) {
	p, err := a.P.Proven(ctx, user)
	if err != nil {
		return nil, err
	}
	metrics.Sessions.WithLabelValues("imap").Inc()
	return p, nil
}

// EnsureUser implements imap.Store; a user's mailboxes are made with the
// profile.
func (s *IMAPStore) EnsureUser(ctx context.Context, user string) error { return nil }

// Mailboxes implements imap.Store.
func (s *IMAPStore) Mailboxes(ctx context.Context, user string) ([]mailbox.Mailbox, error) {
	l, _, err := s.MailboxList(ctx, user)
	return l, err
}

// MailboxList implements imap.Store.
func (s *IMAPStore) MailboxList(ctx context.Context, user string) ([]mailbox.Mailbox, []string, error) {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	rep, err := s.P.Writers.For(user).Mailboxes(ctx, &writer.MailboxRequest{User: user})
	if err != nil {
		return nil, nil, err
	}
	return rep.Mailboxes, rep.Subscriptions, nil
}

// MailboxUsage implements imap.Store.
func (s *IMAPStore) MailboxUsage(ctx context.Context, user, name string) (*mailbox.Mailbox, mailbox.Usage, error) {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	rep, err := s.P.usage(ctx, user)
	if err != nil || name == "" {
		return nil, rep.Usage, err
	}
	want := mailbox.NormName(name)
	for i := range rep.Mailboxes {
		if rep.Mailboxes[i].Name == want {
			return &rep.Mailboxes[i], rep.Usage, nil
		}
	}
	return nil, rep.Usage, fmt.Errorf("user %s mailbox %q: %w", user, name, mailbox.ErrNoMailbox)
}

// DomainRoom implements imap.Store.
func (s *IMAPStore) DomainRoom(ctx context.Context, user string, n, size int64) error {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	return s.P.DomainRoom(ctx, user, n, size)
}

func (s *IMAPStore) find(ctx context.Context, user string, match func(*mailbox.Mailbox) bool, what string) (*mailbox.Mailbox, error) {
	all, err := s.Mailboxes(ctx, user)
	if err != nil {
		return nil, err
	}
	for i := range all {
		if match(&all[i]) {
			return &all[i], nil
		}
	}
	return nil, fmt.Errorf("user %s mailbox %s: %w", user, what, mailbox.ErrNoMailbox)
}

// Mailbox implements imap.Store.
func (s *IMAPStore) Mailbox(ctx context.Context, user, name string) (*mailbox.Mailbox, error) {
	want := mailbox.NormName(name)
	return s.find(ctx, user, func(m *mailbox.Mailbox) bool { return m.Name == want }, fmt.Sprintf("%q", name))
}

// MailboxByID implements imap.Store; a mailbox's id is its UIDVALIDITY.
func (s *IMAPStore) MailboxByID(ctx context.Context, user string, id uint64) (*mailbox.Mailbox, error) {
	return s.find(ctx, user, func(m *mailbox.Mailbox) bool { return m.ID == id }, fmt.Sprintf("id %d", id))
}

// Messages implements imap.Store.
func (s *IMAPStore) Messages(ctx context.Context, user string, id uint64) ([]mailbox.Message, error) {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	user = userdb.Normalize(user)
	rep, err := s.P.Writers.For(user).Messages(ctx, &writer.MailboxRequest{User: user, ID: id})
	if err != nil {
		return nil, err
	}
	out := make([]mailbox.Message, len(rep.Messages))
	w := make(map[string][]cluster.NodeID, len(rep.Messages))
	var last []cluster.NodeID
	for i, m := range rep.Messages {
		out[i] = m.Message
		// Most messages of a mailbox have the same nodes: one slice
		// serves them all.
		if src := m.Sources(); !slices.Equal(src, last) {
			last = src
		}
		w[m.ID] = last
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.where == nil {
		s.where, _ = simplelru.NewLRU(whereUsers, nil) // errs only for a size <= 0
	}
	v, _ := s.where.Get(user)
	boxes, _ := v.(boxSources)
	if boxes == nil {
		boxes = boxSources{}
		s.where.Add(user, boxes)
	}
	boxes[id] = w
	return out, nil
}

// sources returns the nodes of a message of user from the last views read.
func (s *IMAPStore) sources(user, id string) ([]cluster.NodeID, bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.where == nil {
		return nil, false
	}
	boxes, _ := s.where.Peek(user)
	bs, _ := boxes.(boxSources)
	for _, w := range bs {
		if n, ok := w[id]; ok {
			return n, true
		}
	}
	return nil, false
}

// Body implements imap.Store.
func (s *IMAPStore) Body(ctx context.Context, user, id string) ([]byte, error) {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	user = userdb.Normalize(user)
	n, ok := s.sources(user, id)
	if ok || s.P.Shared != nil {
		return s.P.body(ctx, n, user, id)
	}
	// Not in a view this node has seen: ask the nodes of the mail map.
	_, mailMap, err := s.P.Users.Lookup(ctx, user)
	if err != nil {
		return nil, err
	}
	for _, n := range mailMap {
		if b, err := s.P.body(ctx, []cluster.NodeID{n}, user, id); err == nil {
			return b, nil
		}
	}
	return nil, fmt.Errorf("user %s message %s: %w", user, id, mailbox.ErrNoMessage)
}

// Append implements imap.Store (IMAP APPEND): stored like a delivery, into
// the named mailbox, with its flags and date.
func (s *IMAPStore) Append(ctx context.Context, user, name string, raw []byte, flags []string, date time.Time) (*mailbox.Mailbox, mailbox.Message, error) {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	user = userdb.Normalize(user)
	mb, err := s.Mailbox(ctx, user, name)
	if err != nil {
		return nil, mailbox.Message{}, err
	}
	// Once the literal is in, the message is stored and its UID confirmed
	// whether or not the client stays: a hang-up between the writer's
	// allocation and its confirmation would hide every later UID of the
	// mailbox until the allocation expires (as for SMTP DATA).
	pctx, pcancel := withOpTimeout(context.WithoutCancel(ctx))
	defer pcancel()
	stored, err := s.P.place(pctx, []string{user}, mb.Name, flags, raw, date)
	if err != nil {
		return nil, mailbox.Message{}, err
	}
	mb, err = s.Mailbox(pctx, user, name)
	return mb, stored[user], err
}

// AppendMulti implements imap.Store (IMAP MULTIAPPEND, RFC 3502): every
// message is stored, or none. A guard UID is allocated first: the writer
// shows sessions no UID above one in flight, so the messages, each stored
// and confirmed like an APPEND after it, stay hidden until the guard is
// given up, and then appear together. When one cannot be stored, those
// stored before are expunged while still hidden. The guard is a gap in
// the mailbox's UIDs. If this node dies between the first store and the
// end, the writer drops the guard (allocTimeout, or the node leaving) and
// what was stored appears: the append is atomic against failures to
// store, not against the loss of the node doing it.
func (s *IMAPStore) AppendMulti(ctx context.Context, user, name string, msgs []mailbox.NewMessage) (*mailbox.Mailbox, []mailbox.Message, error) {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	user = userdb.Normalize(user)
	mb, err := s.Mailbox(ctx, user, name)
	if err != nil {
		return nil, nil, err
	}
	// As for APPEND: once the literals are in, the outcome no longer
	// depends on the client staying. Storing has multiAppendBudget, well
	// within the guard's allocTimeout; the rollback and the release have
	// their own time.
	pctx, pcancel := context.WithTimeout(context.WithoutCancel(ctx), multiAppendBudget)
	defer pcancel()
	actx, acancel := context.WithTimeout(pctx, writerCallTimeout)
	guard, err := s.P.Writers.For(user).Alloc(actx, &writer.AllocRequest{User: user, Mailbox: mb.Name, From: s.P.member(s.P.Self)})
	acancel()
	if err != nil {
		return nil, nil, err
	}
	release := func() {
		s.P.confirm(context.WithoutCancel(ctx), &writer.ConfirmRequest{Place: guard.Place, Cancel: true, Unused: true})
	}
	stored := make([]mailbox.Message, 0, len(msgs))
	var written []uint32 // every UID confirmed, with the copies of failed attempts
	track := func(_ string, m mailbox.Message) { written = append(written, m.UID) }
	for i, m := range msgs {
		var placed map[string]mailbox.Message
		err := appendFault(i)
		if err == nil {
			placed, err = s.P.placeTracked(pctx, []string{user}, mb.Name, m.Flags, m.Raw, m.Date, track)
		}
		if err == nil {
			stored = append(stored, placed[user])
			continue
		}
		err = fmt.Errorf("message %d of %d: %w", i+1, len(msgs), err)
		if len(written) > 0 {
			rctx, rcancel := withOpTimeout(context.WithoutCancel(ctx))
			gone, xerr := s.expunge(rctx, user, mb.ID, written, false)
			rcancel()
			if xerr == nil && len(gone) < len(written) {
				xerr = fmt.Errorf("%d of %d expunged", len(gone), len(written))
			}
			if xerr != nil {
				err = fmt.Errorf("%w; the %d messages stored before it could not all be removed: %v", err, len(written), xerr)
			}
		}
		release()
		return nil, nil, err
	}
	release()
	// The mailbox as the session reports it (APPENDUID's UIDVALIDITY).
	return &mailbox.Mailbox{ID: mb.ID, Name: mb.Name, UIDValidity: guard.Place.UIDValidity}, stored, nil
}

// multiAppendBudget bounds the storing of one MULTIAPPEND: past it, what
// was stored is removed and the command fails, before the writer could
// drop the guard as abandoned (allocTimeout, a minute).
const multiAppendBudget = 30 * time.Second

// appendFault is called before each message of a MULTIAPPEND is stored;
// an error fails that message. Only tests set it (SetAppendFaultForTest).
var appendFault = func(i int) error { return nil }

// SetAppendFaultForTest makes f run before message i (from 0) of every
// MULTIAPPEND is stored, its error failing that message, until the
// returned function restores the default.
func SetAppendFaultForTest(f func(i int) error) (restore func()) {
	old := appendFault
	appendFault = f
	return func() { appendFault = old }
}

// CreateMailbox implements imap.Store.
func (s *IMAPStore) CreateMailbox(ctx context.Context, user, name, specialUse string) (*mailbox.Mailbox, error) {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	return s.P.Writers.For(user).Create(ctx, &writer.MailboxRequest{User: user, Name: name, SpecialUse: specialUse})
}

// DeleteMailbox implements imap.Store.
func (s *IMAPStore) DeleteMailbox(ctx context.Context, user, name string) error {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	return s.P.Writers.For(user).Delete(ctx, &writer.MailboxRequest{User: user, Name: name})
}

// RenameMailbox implements imap.Store.
func (s *IMAPStore) RenameMailbox(ctx context.Context, user, from, to string) error {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	return s.P.Writers.For(user).Rename(ctx, &writer.MailboxRequest{User: user, Name: from, NewName: to})
}

// SetSubscribed implements imap.Store.
func (s *IMAPStore) SetSubscribed(ctx context.Context, user, name string, on bool) error {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	return s.P.Writers.For(user).Subscribe(ctx, &writer.MailboxRequest{User: user, Name: name, On: on})
}

// StoreFlags implements imap.Store.
func (s *IMAPStore) StoreFlags(ctx context.Context, user string, mbox uint64, uids []uint32, op mailbox.FlagOp, flags []string, unchangedSince uint64) ([]mailbox.Message, []uint32, error) {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	rep, err := s.P.Writers.For(user).StoreFlags(ctx, &writer.FlagsRequest{User: user, ID: mbox, UIDs: uids,
		Op: op, Flags: flags, UnchangedSince: unchangedSince})
	if err != nil {
		return nil, nil, err
	}
	return rep.Updated, rep.Failed, nil
}

func (s *IMAPStore) expunge(ctx context.Context, user string, mbox uint64, uids []uint32, onlyDeleted bool) ([]uint32, error) {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	rep, err := s.P.Writers.For(user).Expunge(ctx, &writer.FlagsRequest{User: user, ID: mbox, UIDs: uids,
		OnlyDeleted: onlyDeleted})
	if err != nil {
		return nil, err
	}
	return rep.UIDs, nil
}

// Expunge implements imap.Store.
func (s *IMAPStore) Expunge(ctx context.Context, user string, mbox uint64, uids []uint32) ([]uint32, error) {
	return s.expunge(ctx, user, mbox, uids, false)
}

// ExpungeDeleted implements imap.Store.
func (s *IMAPStore) ExpungeDeleted(ctx context.Context, user string, mbox uint64, uids []uint32) ([]uint32, error) {
	return s.expunge(ctx, user, mbox, uids, true)
}

// Copy implements imap.Store.
func (s *IMAPStore) Copy(ctx context.Context, user string, src uint64, uids []uint32, dst string, move bool) (*mailbox.CopyResult, error) {
	ctx, cancel := withOpTimeout(ctx)
	defer cancel()
	rep, err := s.P.Writers.For(user).Copy(ctx, &writer.CopyRequest{User: user, ID: src, UIDs: uids,
		Dest: dst, Move: move})
	if err != nil {
		return nil, err
	}
	d := rep.Dest
	return &mailbox.CopyResult{Dest: &d, SrcUIDs: rep.SrcUIDs, DstUIDs: rep.DstUIDs}, nil
}

// Subscribe implements imap.Store: changes the writer makes on this node
// arrive at once; changes made through another node are noticed by polling
// the writer's change counter every versionPoll.
func (s *IMAPStore) Subscribe(ctx context.Context, user string) (<-chan mailbox.Change, func()) {
	user = userdb.Normalize(user)
	out := make(chan mailbox.Change, 16)
	local, unsub := s.P.Writers.Subscribe(user)
	stop := make(chan struct{})
	send := func(c mailbox.Change) {
		select {
		case out <- c:
		default:
		}
	}
	version := func() (uint64, error) {
		vctx, cancel := context.WithTimeout(ctx, versionPoll*4)
		defer cancel()
		rep, err := s.P.Writers.For(user).Version(vctx, &writer.MailboxRequest{User: user})
		if err != nil {
			return 0, err
		}
		return rep.Version, nil
	}
	// The baseline is read before Subscribe returns, so a change made
	// right after it (before the first tick) is not taken for the
	// baseline and missed.
	last, err := version()
	first := err != nil
	go func() {
		t := time.NewTicker(versionPoll)
		defer t.Stop()
		for {
			select {
			case <-stop:
				return
			case <-ctx.Done():
				return
			case c := <-local:
				send(c)
			case <-t.C:
				v, err := version()
				if err != nil {
					continue
				}
				if first || v != last {
					send(mailbox.Change{User: user})
				}
				last, first = v, false
			}
		}
	}()
	var once sync.Once
	return out, func() { once.Do(func() { close(stop); unsub() }) }
}

// textTimeout bounds one node's answer from its text index: a node that
// does not answer in time only leaves its messages to be read.
const textTimeout = 2 * time.Second

// TextExcluded implements imap.TextIndex: it asks the text index of every
// live node of the user's mail map, at once, which messages of the mailbox
// cannot match every query and which certainly match each, and returns
// the unions. A message is left out, or taken as a match, if any node
// holding it says so (each replica indexes the same bytes); a node that
// fails or is late says nothing, which costs only reading.
func (s *IMAPStore) TextExcluded(ctx context.Context, user string, mbox uint64, queries []fts.Query) (*mailbox.TextAnswer, error) {
	if s.P.Shared != nil {
		// No text index on the shared store yet: nothing is excluded,
		// SEARCH reads the bodies.
		return unionAnswers(nil, len(queries)), nil
	}
	user = userdb.Normalize(user)
	_, mailMap, err := s.P.Users.Lookup(ctx, user)
	if err != nil {
		return nil, err
	}
	live := map[cluster.NodeID]bool{s.P.Self: true}
	for _, mi := range s.P.Peers.Alive() {
		live[mi.ID] = true
	}
	ctx, cancel := context.WithTimeout(ctx, textTimeout)
	defer cancel()
	req := &mailbox.TextRequest{User: user, UIDValidity: uint32(mbox), Queries: queries}
	var (
		mu      sync.Mutex
		wg      sync.WaitGroup
		answers []*mailbox.TextAnswer
	)
	for _, n := range mailMap {
		if !live[n] {
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			a, err := s.P.Boxes.On(s.P.Peers, n).TextExcluded(ctx, req)
			if err != nil {
				return
			}
			mu.Lock()
			answers = append(answers, a)
			mu.Unlock()
		}()
	}
	wg.Wait()
	return unionAnswers(answers, len(queries)), nil
}

// unionAnswers joins the text indexes' answers of several nodes.
func unionAnswers(answers []*mailbox.TextAnswer, queries int) *mailbox.TextAnswer {
	if len(answers) == 1 {
		return answers[0]
	}
	union := func(lists [][]mailbox.TextSkip) []mailbox.TextSkip {
		list := slices.Concat(lists...)
		slices.Sort(list)
		return slices.Compact(list)
	}
	out := &mailbox.TextAnswer{Sure: make([][]mailbox.TextSkip, queries)}
	var skips [][]mailbox.TextSkip
	for _, a := range answers {
		skips = append(skips, a.Skip)
	}
	out.Skip = union(skips)
	for i := range queries {
		var sure [][]mailbox.TextSkip
		for _, a := range answers {
			if i < len(a.Sure) {
				sure = append(sure, a.Sure[i])
			}
		}
		out.Sure[i] = union(sure)
	}
	return out
}

// heldHere reports whether this node's own store holds message id of the
// user (the native store, and this node among its sources), so that a read
// of part of it can go to the file instead of fetching the body whole.
func (s *IMAPStore) heldHere(user, id string) bool {
	nodes, ok := s.sources(user, id)
	return ok && s.P.Shared == nil && slices.Contains(nodes, s.P.Self)
}

// OpenRange implements imap.BodyRanger: a message held on this node is read
// only in the range asked, from its file for a large body
// (mailbox.OpenBody); one held only elsewhere is fetched whole from a
// holder and cut.
func (s *IMAPStore) OpenRange(ctx context.Context, user, id string, off, n int64) (io.ReadCloser, int64, error) {
	user = userdb.Normalize(user)
	if s.heldHere(user, id) {
		if r, err := s.P.Boxes.OpenBody(user, id); err == nil {
			off = min(off, r.Size())
			n = min(n, r.Size()-off)
			return struct {
				io.Reader
				io.Closer
			}{io.NewSectionReader(r, off, n), r}, n, nil
		}
	}
	b, err := s.Body(ctx, user, id)
	if err != nil {
		return nil, 0, err
	}
	off = min(off, int64(len(b)))
	b = b[off : off+min(n, int64(len(b))-off)]
	return io.NopCloser(bytes.NewReader(b)), int64(len(b)), nil
}

// OpenParts implements imap.BodyParter: a large body held on this node is
// opened with its part table, so a FETCH of its sections reads only their
// ranges. A message held only on other nodes gets no table and is fetched
// whole from a holder (Body), as before: a range read across the cluster
// would need a new RPC, and the reads a client makes of one message
// (structure, then parts) would each cross it.
func (s *IMAPStore) OpenParts(ctx context.Context, user, id string) (mailbox.BodyReader, *mimepart.Table, error) {
	user = userdb.Normalize(user)
	if !s.heldHere(user, id) {
		return nil, nil, nil
	}
	r, t, err := s.P.Boxes.OpenParts(user, id)
	if err != nil {
		// Not here after all (moved, or expunged and swept): read
		// whole from wherever it is.
		return nil, nil, nil
	}
	return r, t, nil
}

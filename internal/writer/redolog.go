package writer

// The REDO log's I/O (the decisions are in redo.go): entries in the node's
// store (one fsync'd Pebble batch per append, which Pebble's commit
// pipeline groups with concurrent ones), the append to the secondary, the
// three-phase recovery of a bucket a node starts managing, and the
// truncation of old entries.

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/nodepb"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/store"
	"github.com/quillmail/quill/internal/userdb"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
)

const (
	// redoKeep is how long an entry stays in the log. By then every change
	// it carries has been applied by a live message replica and is in that
	// replica's update log (pushed every second until each target has it)
	// and on the profile's replicas; it matches goneKeep, the writer's own
	// memory of what it removed.
	redoKeep = 10 * time.Minute
	// redoSweep is how often old entries are dropped and the log's length
	// measured (the quill_redo_entries gauge is as of the last sweep).
	redoSweep = 30 * time.Second
	// redoAppendTimeout bounds one append to a secondary: one that does
	// not answer in time (paused, not yet declared dead) is passed over
	// for the next-ranked live node.
	redoAppendTimeout = 2 * time.Second
	// redoAskTimeout bounds a recovery's question to one node (its heads,
	// its entries); a node that does not answer holds nothing the
	// recovery can use.
	redoAskTimeout = 3 * time.Second
	// redoBusyWait bounds how long a recovery waits for another node that
	// still writes the bucket (the old manager, draining in a handoff) to
	// stop before it reads that node's log; redoBusyPoll is how often it
	// asks meanwhile. Past the bound the node is taken for paused.
	redoBusyWait = 10 * time.Second
	redoBusyPoll = 200 * time.Millisecond
	// redoSessionWait is how long an operation waits for its bucket's
	// recovery before the session is told to try again (UNAVAILABLE).
	redoSessionWait = 15 * time.Second
)

// ErrRecovering says a bucket's new primary is still replaying its log: the
// session may try again in a moment (IMAP's UNAVAILABLE).
var ErrRecovering = fmt.Errorf("writer catching up its log after a failover: %w", rpc.ErrUnavailable)

// redoLog is the node's REDO log of the buckets it writes or backs.
type redoLog struct {
	m    *Manager
	db   *store.DB
	repl Replicator

	mu sync.Mutex
	// last is the LSN last handed out per bucket managed here (its Term
	// set by the bucket's recovery).
	last [cluster.Buckets]LSN
	// ready is closed when a bucket's recovery is over (nil: nothing to
	// wait for).
	ready   [cluster.Buckets]chan struct{}
	pending map[uint8]bool
	running bool
}

// EnableRedo gives the writers a REDO log in db, replayed through repl
// (the native store; a storage that replicates every change itself before
// answering, Cassandra, has none).
func (m *Manager) EnableRedo(db *store.DB, repl Replicator) {
	r := &redoLog{m: m, db: db, repl: repl, pending: map[uint8]bool{}}
	m.mu.Lock()
	m.redo = r
	m.mu.Unlock()
	r.measure()
	m.spawn(r.sweepLoop)
}

func redoKey(b uint8, lsn LSN, node cluster.NodeID) []byte {
	k := make([]byte, 0, 18+len(node))
	k = append(k, store.KindRedo, b)
	k = binary.BigEndian.AppendUint64(k, lsn.Term)
	k = binary.BigEndian.AppendUint64(k, lsn.Seq)
	return append(k, node...)
}

// scan calls fn with every entry of bucket b held here (every bucket's if
// all), in key order.
func (r *redoLog) scan(b uint8, all bool, fn func(key, val []byte) error) error {
	lo, hi := []byte{store.KindRedo, b}, []byte{store.KindRedo, b + 1}
	if all || b == cluster.Buckets-1 {
		hi = []byte{store.KindRedo + 1}
	}
	if all {
		lo = []byte{store.KindRedo}
	}
	it, err := r.db.NewIter(&store.IterOptions{LowerBound: lo, UpperBound: hi})
	if err != nil {
		return err
	}
	defer it.Close()
	for it.First(); it.Valid(); it.Next() {
		if err := fn(it.Key(), it.Value()); err != nil {
			return err
		}
	}
	return it.Error()
}

// entries returns bucket b's log held here, in LSN order, and each entry's
// encoding.
func (r *redoLog) entries(b uint8) ([]*Entry, [][]byte, error) {
	var es []*Entry
	var raw [][]byte
	err := r.scan(b, false, func(_, val []byte) error {
		e := &Entry{}
		if err := json.Unmarshal(val, e); err != nil {
			return fmt.Errorf("redo log of bucket %d: %w", b, err)
		}
		es = append(es, e)
		raw = append(raw, slices.Clone(val))
		return nil
	})
	return es, raw, err
}

// put stores encoded entries of bucket b, fsync'd.
func (r *redoLog) put(b uint8, raw [][]byte) error {
	batch := r.db.NewBatch()
	defer batch.Close()
	for _, v := range raw {
		e := &Entry{}
		if err := json.Unmarshal(v, e); err != nil {
			return fmt.Errorf("redo log of bucket %d: entry: %w", b, err)
		}
		if err := batch.Set(redoKey(b, e.LSN, e.Node), v); err != nil {
			return err
		}
	}
	if err := batch.Commit(store.Sync); err != nil {
		return fmt.Errorf("redo log of bucket %d: %w", b, err)
	}
	metrics.RedoFsyncs.Inc()
	return nil
}

// logChanges logs changes of a user of bucket b here and on the bucket's
// secondary, both fsync'd, and returns once both hold them: the caller
// answers its client after that. With no other live node the log is this
// node's alone (a cluster of one).
func (m *Manager) logChanges(ctx context.Context, user string, es ...*Entry) error {
	r := m.redo
	es = slices.DeleteFunc(es, func(e *Entry) bool { return e == nil })
	if r == nil || len(es) == 0 {
		return nil
	}
	b := cluster.Bucket(user)
	raw := make([][]byte, len(es))
	now := time.Now().UTC()
	r.mu.Lock()
	for i, e := range es {
		if r.last[b].Term == 0 {
			r.last[b].Term = newTerm(LSN{}, uint64(m.clock.Now()))
		}
		r.last[b].Seq++
		e.LSN, e.Node, e.User, e.At = r.last[b], m.self, user, now
		raw[i], _ = json.Marshal(e)
	}
	r.mu.Unlock()
	eligible, _ := m.peers.Eligible(b) // none: the secondary's call says why
	remote := make(chan error, 1)
	go func() { remote <- r.toSecondary(ctx, b, secondaries(m.self, eligible), raw) }()
	errLocal := r.put(b, raw)
	errRemote := <-remote
	if errLocal != nil {
		return fmt.Errorf("user %s: %w", user, errLocal)
	}
	metrics.RedoAppends.WithLabelValues("primary").Add(float64(len(raw)))
	if errRemote != nil {
		return fmt.Errorf("user %s: %w", user, errRemote)
	}
	return nil
}

// toSecondary appends entries on the first of the ranked nodes that takes
// them.
func (r *redoLog) toSecondary(ctx context.Context, b uint8, ranked []cluster.NodeID, raw [][]byte) error {
	var errs []error
	for _, n := range ranked {
		c, err := r.client(n)
		if err == nil {
			actx, cancel := context.WithTimeout(ctx, redoAppendTimeout)
			_, err = c.Append(actx, &nodepb.RedoAppendRequest{Bucket: uint32(b), Entries: raw})
			cancel()
		}
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return fmt.Errorf("redo log of bucket %d: append on %s: %w", b, n, err)
		}
		if status.Code(err) == codes.Unimplemented {
			// A node of a version before the log (a rolling upgrade):
			// it cannot back the primary; the next one may.
			continue
		}
		errs = append(errs, fmt.Errorf("%s: %w", n, err))
	}
	if len(errs) == 0 {
		// No other node, or none that keeps a log: the primary's copy
		// is the only one (a cluster of one, or an upgrade under way).
		return nil
	}
	return fmt.Errorf("redo log of bucket %d: no secondary took the entries: %w: %w", b, errors.Join(errs...), rpc.ErrUnavailable)
}

func (r *redoLog) client(n cluster.NodeID) (nodepb.RedoClient, error) {
	cc, err := r.m.peers.Conn(n)
	if err != nil {
		return nil, err
	}
	return nodepb.NewRedoClient(cc), nil
}

// busy says whether this node still writes bucket b.
func (m *Manager) busy(b uint8) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tenure[b] != 0 || m.draining[b] > 0
}

// heads answers a recovery's first phase.
func (r *redoLog) heads(buckets []uint32) *nodepb.RedoHeadsReply {
	out := &nodepb.RedoHeadsReply{}
	for _, b := range buckets {
		if b >= cluster.Buckets {
			continue
		}
		h := &nodepb.RedoHead{Bucket: b, Busy: r.m.busy(uint8(b))}
		r.scan(uint8(b), false, func(key, _ []byte) error {
			if len(key) >= 18 {
				l := LSN{Term: binary.BigEndian.Uint64(key[2:10]), Seq: binary.BigEndian.Uint64(key[10:18])}
				if h.Count == 0 || (LSN{h.Term, h.Seq}).Less(l) {
					h.Term, h.Seq = l.Term, l.Seq
				}
			}
			h.Count++
			return nil
		})
		out.Heads = append(out.Heads, h)
	}
	return out
}

// --- recovery

// opened starts the recovery of a bucket this node just began to manage;
// its writers wait for it (await). Called with m.mu held.
func (r *redoLog) opened(b uint8) {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.last[b] = LSN{}
	if r.m.closed {
		return
	}
	r.ready[b] = make(chan struct{})
	r.pending[b] = true
	if !r.running {
		r.running = true
		r.m.wg.Add(1)
		go func() {
			defer r.m.wg.Done()
			r.recoverLoop()
		}()
	}
}

// await waits for bucket b's recovery, up to redoSessionWait.
func (r *redoLog) await(ctx context.Context, b uint8) error {
	if r == nil {
		return nil
	}
	r.mu.Lock()
	ch := r.ready[b]
	r.mu.Unlock()
	if ch == nil {
		return nil
	}
	t := time.NewTimer(redoSessionWait)
	defer t.Stop()
	select {
	case <-ch:
		return nil
	case <-ctx.Done():
		return fmt.Errorf("bucket %d: %w", b, ErrRecovering)
	case <-t.C:
		return fmt.Errorf("bucket %d: %w", b, ErrRecovering)
	}
}

// recoverLoop recovers the buckets opened, in rounds (a membership change
// opens many at once: one question per node covers them all).
func (r *redoLog) recoverLoop() {
	for {
		r.mu.Lock()
		var bs []uint8
		for b := range r.pending {
			bs = append(bs, b)
		}
		clear(r.pending)
		if len(bs) == 0 || r.m.ctx.Err() != nil {
			r.running = false
			r.mu.Unlock()
			return
		}
		r.mu.Unlock()
		slices.Sort(bs)
		r.recover(bs)
	}
}

// recover runs the three phases for buckets.
func (r *redoLog) recover(bs []uint8) {
	start := time.Now()
	m := r.m
	// Phase 1: the heads of every live node's log, until no node that
	// still writes a bucket holds a log of it (or redoBusyWait passes).
	var heads map[uint8][]Head
	for {
		heads = r.askHeads(bs)
		var waiting []uint8
		for _, b := range bs {
			if len(writing(m.self, heads[b])) > 0 {
				waiting = append(waiting, b)
			}
		}
		if len(waiting) == 0 || time.Since(start) > redoBusyWait || m.ctx.Err() != nil {
			if len(waiting) > 0 {
				m.log.Warn("redo log: recovering buckets another node still writes", "buckets", waiting)
			}
			break
		}
		time.Sleep(redoBusyPoll)
	}
	for _, b := range bs {
		if !m.manages(b) {
			r.done(b)
			continue
		}
		n, err := r.recoverBucket(b, heads[b])
		if err != nil {
			m.log.Warn("redo log: replay incomplete; the entries stay for the next recovery", "bucket", b, "err", err)
		}
		if n > 0 {
			metrics.RedoReplayed.Add(float64(n))
			metrics.RedoRecoverySeconds.Observe(time.Since(start).Seconds())
			m.log.Info("redo log: bucket recovered", "bucket", b, "entries", n, "took", time.Since(start))
		}
		r.done(b)
	}
}

// done ends bucket b's recovery: its writers serve (phase 3).
func (r *redoLog) done(b uint8) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if ch := r.ready[b]; ch != nil {
		close(ch)
		r.ready[b] = nil
	}
}

// manages says whether bucket b is managed here.
func (m *Manager) manages(b uint8) bool {
	m.mu.Lock()
	defer m.mu.Unlock()
	return m.tenure[b] != 0
}

// askHeads asks every live node for its logs' heads of buckets.
func (r *redoLog) askHeads(bs []uint8) map[uint8][]Head {
	req := make([]uint32, len(bs))
	for i, b := range bs {
		req[i] = uint32(b)
	}
	out := map[uint8][]Head{}
	var mu sync.Mutex
	var wg sync.WaitGroup
	for _, a := range r.m.peers.Alive() {
		n := a.ID
		wg.Add(1)
		go func() {
			defer wg.Done()
			var rep *nodepb.RedoHeadsReply
			if n == r.m.self {
				rep = r.heads(req)
			} else {
				c, err := r.client(n)
				if err != nil {
					return
				}
				ctx, cancel := context.WithTimeout(r.m.ctx, redoAskTimeout)
				rep, err = c.Heads(ctx, &nodepb.RedoHeadsRequest{Buckets: req})
				cancel()
				if err != nil {
					r.m.log.Debug("redo log: heads not read", "node", n, "err", err)
					return
				}
			}
			mu.Lock()
			defer mu.Unlock()
			for _, h := range rep.Heads {
				b := uint8(h.Bucket)
				out[b] = append(out[b], Head{Node: n, LSN: LSN{h.Term, h.Seq}, Count: int(h.Count), Busy: h.Busy})
			}
		}()
	}
	wg.Wait()
	return out
}

// recoverBucket catches bucket b's log up from the other live nodes,
// replays it and hands it to the secondary (phase 2); it returns the
// entries replayed.
func (r *redoLog) recoverBucket(b uint8, heads []Head) (int, error) {
	m := r.m
	local, localRaw, err := r.entries(b)
	if err != nil {
		return 0, err
	}
	logs := [][]*Entry{local}
	for _, n := range toFetch(m.self, heads) {
		c, err := r.client(n)
		if err != nil {
			continue
		}
		ctx, cancel := context.WithTimeout(m.ctx, redoAskTimeout)
		rep, err := c.Read(ctx, &nodepb.RedoReadRequest{Bucket: uint32(b)})
		cancel()
		if err != nil {
			m.log.Warn("redo log: entries not read", "bucket", b, "node", n, "err", err)
			continue
		}
		var got []*Entry
		for _, v := range rep.Entries {
			e := &Entry{}
			if json.Unmarshal(v, e) == nil {
				got = append(got, e)
			}
		}
		if err := r.put(b, rep.Entries); err != nil {
			return 0, err
		}
		logs = append(logs, got)
	}
	all := mergeEntries(logs...)
	var highest LSN
	if h, ok := chooseSource(heads, nil); ok {
		highest = h.LSN
	}
	for _, e := range all {
		if highest.Less(e.LSN) {
			highest = e.LSN
		}
	}
	r.mu.Lock()
	r.last[b] = LSN{Term: newTerm(highest, uint64(m.clock.Now()))}
	r.mu.Unlock()
	if len(all) == 0 {
		return 0, nil
	}
	err = r.replay(b, planReplay(all))
	// The secondary of this term holds the whole log too, so the node
	// after this one finds it there.
	raw := localRaw
	if len(all) != len(local) {
		raw = raw[:0]
		for _, e := range all {
			v, _ := json.Marshal(e)
			raw = append(raw, v)
		}
	}
	eligible, _ := m.peers.Eligible(b)
	if serr := r.toSecondary(m.ctx, b, secondaries(m.self, eligible), raw); serr != nil {
		m.log.Warn("redo log: recovered log not handed to the secondary", "bucket", b, "err", serr)
	}
	return len(all), err
}

// replay re-applies a plan: profiles first (mailboxes and reserved ends),
// then the message versions, written again through the replication
// manager (a replica that has a version already keeps it).
func (r *redoLog) replay(b uint8, p replayPlan) error {
	m := r.m
	var errs []error
	for user, ur := range p.Users {
		ctx, cancel := context.WithTimeout(m.ctx, rpc.DefaultTimeout)
		if _, err := m.users.Managed(ctx, user); err != nil {
			cancel()
			return err // the bucket moved on
		}
		cur, err := m.users.Profile(user)
		if err == nil {
			if np := replayProfile(cur, ur); np != nil {
				err = m.users.SaveProfile(ctx, np, 1)
			}
		}
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("user %s: profile: %w", user, err))
		}
	}
	// One write per replica set: the replication manager takes updates of
	// one kind to one set of targets in a request.
	groups := map[string][]*replica.Update{}
	var order []string
	for _, u := range p.Updates {
		k := joinIDs(u.Targets)
		if _, ok := groups[k]; !ok {
			order = append(order, k)
		}
		groups[k] = append(groups[k], u)
	}
	for _, k := range order {
		ups := groups[k]
		ctx, cancel := context.WithTimeout(m.ctx, rpc.DefaultTimeout)
		_, err := r.repl.Write(ctx, &replica.WriteRequest{Policy: replica.One, Updates: ups})
		cancel()
		if err != nil {
			errs = append(errs, fmt.Errorf("%d message versions for %s: %w", len(ups), strings.ReplaceAll(k, ",", " "), err))
		}
	}
	return errors.Join(errs...)
}

// --- truncation

// sweepLoop drops old entries every redoSweep.
func (r *redoLog) sweepLoop() {
	t := time.NewTicker(redoSweep)
	defer t.Stop()
	for {
		select {
		case <-r.m.ctx.Done():
			return
		case <-t.C:
			r.sweep()
		}
	}
}

// sweep drops the entries older than redoKeep and measures the log.
func (r *redoLog) sweep() {
	now := time.Now()
	var old [][]byte
	left := 0
	err := r.scan(0, true, func(key, val []byte) error {
		e := &Entry{}
		if json.Unmarshal(val, e) != nil || expired(e, now, redoKeep) {
			old = append(old, slices.Clone(key))
		} else {
			left++
		}
		return nil
	})
	if err == nil && len(old) > 0 {
		err = r.db.DeleteAll(old, store.NoSync)
	}
	if err != nil {
		r.m.log.Warn("redo log: old entries not dropped", "err", err)
	}
	r.m.redoLen.Store(int64(left))
}

// measure counts the log's entries (at start).
func (r *redoLog) measure() {
	n := 0
	r.scan(0, true, func(_, _ []byte) error { n++; return nil })
	r.m.redoLen.Store(int64(n))
}

// RedoEntries is the length of the node's REDO log as of its last sweep
// (0: no log, the storage replicates by itself).
func (m *Manager) RedoEntries() int {
	if m.redo == nil {
		// No log (the Cassandra store): none held here, and the gauge
		// is still exported, as the dashboard queries it on every node.
		return 0
	}
	return int(m.redoLen.Load())
}

// --- the service

type redoServer struct {
	nodepb.UnimplementedRedoServer
	m *Manager
}

func (s redoServer) Append(_ context.Context, p *nodepb.RedoAppendRequest) (*nodepb.Empty, error) {
	r := s.m.redo
	if r == nil {
		return nil, fmt.Errorf("redo log: not kept on %s (its writers' storage replicates by itself)", s.m.self)
	}
	if p.Bucket >= cluster.Buckets {
		return nil, fmt.Errorf("redo log: no bucket %d", p.Bucket)
	}
	if err := r.put(uint8(p.Bucket), p.Entries); err != nil {
		return nil, err
	}
	metrics.RedoAppends.WithLabelValues("secondary").Add(float64(len(p.Entries)))
	return &nodepb.Empty{}, nil
}

func (s redoServer) Heads(_ context.Context, p *nodepb.RedoHeadsRequest) (*nodepb.RedoHeadsReply, error) {
	if s.m.redo == nil {
		return &nodepb.RedoHeadsReply{}, nil
	}
	return s.m.redo.heads(p.Buckets), nil
}

func (s redoServer) Read(_ context.Context, p *nodepb.RedoReadRequest) (*nodepb.RedoReadReply, error) {
	if s.m.redo == nil || p.Bucket >= cluster.Buckets {
		return &nodepb.RedoReadReply{}, nil
	}
	_, raw, err := s.m.redo.entries(uint8(p.Bucket))
	if err != nil {
		return nil, err
	}
	return &nodepb.RedoReadReply{Entries: raw}, nil
}

// profileEntry is the log entry of a mailbox or subscription change.
func profileEntry(p *userdb.Profile) *Entry { return &Entry{Profile: p.Clone()} }

// updateEntry is the log entry of the message versions changes wrote (the
// successful ones); nil if none.
func updateEntry(changes []*Change) *Entry {
	var ups []*replica.Update
	for _, c := range changes {
		if c.Err != nil {
			continue
		}
		targets := cluster.NodeSet(append(slices.Clone(c.Obj.Replicas), c.Leaving...))
		u, err := c.Obj.Update(c.Stamp, targets, nil)
		if err != nil {
			continue
		}
		ups = append(ups, u)
	}
	if len(ups) == 0 {
		return nil
	}
	return &Entry{Updates: ups}
}

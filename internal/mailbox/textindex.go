package mailbox

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
	"math"
	"slices"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/fts"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/store"
)

// The text index (issue 13, "search that scales"): for each user, the terms
// of the messages this node holds (fts.Terms), so SEARCH BODY, TEXT,
// SUBJECT, FROM and the like skip the messages that cannot match instead of
// reading every one. It sits beside the replicas it describes: a message
// stored here is queued for it in the same batch (KindToIndex), so repair,
// re-homing and a wiped node's refill index what they bring; a message that
// leaves takes its document with it in the same batch.
//
// It is derived data, written without fsync: the queue entry goes in the
// batch that indexes the message, so a crash that loses that batch leaves the
// entry, and the message is indexed again after the restart. A message not
// yet indexed is never left out of a search (it has no document), so a
// search answers the same while the index catches up, only slower.
//
// Keys under UserPrefix(KindText, user):
//
//	'd' doc(4)                  -> UIDVALIDITY(4) UID(4) message id
//	'i' message id              -> doc(4)
//	'p' field 0 term            -> docs, each a uvarint, appended by Merge
//	'n'                         -> the next doc number (4)
//
// A field's vocabulary (the terms a substring query is matched against) is
// its 'p' keys. Layout 1 also kept it as 'v' field 0 term keys, half the
// index's keys for what the postings' keys already say; layout 2 drops
// them (dropVocabKeys).
//
// Postings are only appended: a document that goes (expunge, move away)
// is deleted from 'd' and 'i' and its numbers in postings then name nothing.
// Documents are numbered per user from 1 and never reused.

const (
	textDoc   = 'd'
	textID    = 'i'
	textPost  = 'p'
	textVocab = 'v' // layout 1 only: dropped at the upgrade
	textNext  = 'n'
)

func textKey(user string, sub byte, rest ...[]byte) []byte {
	k := append(store.UserPrefix(store.KindText, user), sub)
	for _, r := range rest {
		k = append(k, r...)
	}
	return k
}

func docBytes(doc uint32) []byte { return binary.BigEndian.AppendUint32(nil, doc) }

func termKey(user string, sub byte, field, term string) []byte {
	return appendTermKey(nil, store.UserPrefix(store.KindText, user), sub, field, term)
}

// appendTermKey appends termKey to k, prefix being the user's text prefix:
// indexing a message writes a key per term, and one buffer for them all
// saves a few allocations per key (the batch copies what it is given).
func appendTermKey(k, prefix []byte, sub byte, field, term string) []byte {
	k = append(append(k, prefix...), sub)
	k = append(append(k, field...), 0)
	return append(k, term...)
}

func toIndexKey(user, id string) []byte {
	return append(store.UserPrefix(store.KindToIndex, user), id...)
}

// docLoc is where a document's message is: its mailbox's UIDVALIDITY and
// its UID (v 0: no document), and which message it is (IDHash).
type docLoc struct{ v, uid, idh uint32 }

// TextSkip names a message a search can leave out: its UID in the high
// half, the hash of its message id in the low half, so skips sort by UID
// and a session leaves a message out only if both agree.
type TextSkip uint64

// SkipOf returns the TextSkip of message id under uid.
func SkipOf(uid uint32, id string) TextSkip { return TextSkip(uint64(uid)<<32 | uint64(idHash(id))) }

func idHash(id string) uint32 {
	h := fnv.New32a()
	h.Write([]byte(id))
	return h.Sum32()
}

// textCacheUsers bounds how many users' documents and vocabularies stay in
// memory between searches.
const textCacheUsers = 32

// textIndex is the node's text index state in memory.
type textIndex struct {
	mu    sync.Mutex
	users map[string]*userText
	wake  chan struct{}
}

// userText is one user's index in memory: loaded on the first search or
// indexing, kept in step by every later change. mu orders a load, an
// indexing commit, a document change and a search for the user.
type userText struct {
	mu     sync.Mutex
	docs   []docLoc // by doc number; nil until loaded
	next   uint32   // next doc number; 0 until read
	vocab  map[string]map[string]struct{}
	terms  map[string][]string
	loaded map[string]bool // vocabularies read from the store
}

// lockText returns the user's userText, locked. An entry is evicted only
// while unlocked, and a holder checks that the entry it locked is still the
// user's: two entries for one user would each miss the other's changes.
func (m *Manager) lockText(user string) *userText {
	for {
		m.text.mu.Lock()
		if m.text.users == nil {
			m.text.users = map[string]*userText{}
		}
		ut := m.text.users[user]
		if ut == nil {
			if len(m.text.users) >= textCacheUsers {
				for u, o := range m.text.users {
					if o.mu.TryLock() {
						delete(m.text.users, u)
						o.mu.Unlock()
						break
					}
				}
			}
			ut = &userText{vocab: map[string]map[string]struct{}{}, terms: map[string][]string{}, loaded: map[string]bool{}}
			m.text.users[user] = ut
		}
		m.text.mu.Unlock()
		ut.mu.Lock()
		m.text.mu.Lock()
		current := m.text.users[user] == ut
		m.text.mu.Unlock()
		if current {
			return ut
		}
		ut.mu.Unlock()
	}
}

// cachedText returns the user's userText, locked, if memory holds it.
func (m *Manager) cachedText(user string) *userText {
	m.text.mu.Lock()
	_, ok := m.text.users[user]
	m.text.mu.Unlock()
	if !ok {
		return nil
	}
	return m.lockText(user)
}

// textChange is a document change a committed batch made: the cache
// follows it once the batch is durable.
type textChange struct {
	user string
	doc  uint32
	loc  docLoc
}

// queueText puts a message held here on the text index's queue, with the
// time it was queued (the indexer leaves it for TextIndexDelay).
func (t *tx) queueText(user, id string) error {
	t.textQueued = true
	return t.b.Set(toIndexKey(user, id), queuedAt(time.Now()))
}

// queuedAt is a queue entry's value: when the message was queued, in Unix
// nanoseconds. An empty value (queueUnindexed, or a store of before the
// delay) is due at once.
func queuedAt(t time.Time) []byte { return binary.BigEndian.AppendUint64(nil, uint64(t.UnixNano())) }

// dueBy reports whether a queue entry's value says it was queued at or
// before cutoff.
func dueBy(v []byte, cutoff int64) bool {
	return len(v) != 8 || int64(binary.BigEndian.Uint64(v)) <= cutoff
}

// moveText points a message's document at its new place (nothing if it
// has none yet), or deletes the document when loc is zero.
func (t *tx) moveText(user, id string, loc docLoc) error {
	v, closer, err := t.b.Get(textKey(user, textID, []byte(id)))
	if errors.Is(err, store.ErrNotFound) {
		if loc.v == 0 {
			return t.b.Delete(toIndexKey(user, id))
		}
		return nil
	}
	if err != nil {
		return err
	}
	doc := binary.BigEndian.Uint32(v)
	closer.Close()
	dk := textKey(user, textDoc, docBytes(doc))
	if loc.v == 0 {
		err = errors.Join(t.b.Delete(dk), t.b.Delete(textKey(user, textID, []byte(id))))
	} else {
		loc.idh = idHash(id)
		err = t.b.Set(dk, docValue(loc, id))
	}
	t.textChanges = append(t.textChanges, textChange{user: user, doc: doc, loc: loc})
	return err
}

func docValue(loc docLoc, id string) []byte {
	b := binary.BigEndian.AppendUint32(nil, loc.v)
	b = binary.BigEndian.AppendUint32(b, loc.uid)
	return append(b, id...)
}

// textCommitted brings the cache in step with a committed batch and wakes
// the indexer.
func (t *tx) textCommitted() {
	for _, c := range t.textChanges {
		ut := t.m.cachedText(c.user)
		if ut == nil {
			continue // not in memory: a later load reads the change
		}
		if ut.docs != nil && int(c.doc) < len(ut.docs) {
			ut.docs[c.doc] = c.loc
		}
		ut.mu.Unlock()
	}
	if t.textQueued {
		t.m.wakeTextIndex()
	}
}

// maxDocTerms bounds the terms one message adds to the index (and so the
// size of the batch that indexes it); a 32 MB text of random words is not
// indexed.
const maxDocTerms = 200_000

func countTerms(terms map[string][]string) int {
	n := 0
	for _, l := range terms {
		n += len(l)
	}
	return n
}

// forgetText drops what memory holds of a user's index (the user's mail
// was deleted).
func (m *Manager) forgetText(user string) {
	ut := m.lockText(user)
	ut.docs, ut.next = nil, 0
	ut.vocab, ut.terms, ut.loaded = map[string]map[string]struct{}{}, map[string][]string{}, map[string]bool{}
	ut.mu.Unlock()
}

// wakeTextIndex tells the indexer there is work queued.
func (m *Manager) wakeTextIndex() {
	m.text.mu.Lock()
	if m.text.wake == nil {
		m.text.wake = make(chan struct{}, 1)
	}
	w := m.text.wake
	m.text.mu.Unlock()
	select {
	case w <- struct{}{}:
	default:
	}
}

// textIndexBatch is how many due queue entries one step of the indexer
// takes; textIndexScan how many it steps over at most looking for them
// (entries not yet due stay where they are).
const (
	textIndexBatch = 256
	textIndexScan  = 16 * textIndexBatch
)

// textIndexGroupBytes bounds the bodies one batch of the index reads and
// writes: a user's messages are indexed together, one Merge per distinct
// term for all of them (a term per message each was most of the keys, and
// so most of the compactions, of the Porcupine workload: issue 16).
const textIndexGroupBytes = 4 << 20

// textIndexIdle is how often an idle indexer looks at its queue anyway,
// and with a delay how often it looks for entries that came due.
const textIndexIdle = 10 * time.Second

// textIndexGather is how long the indexer lets deliveries gather after
// being woken (no delay): every pass starts by stepping over the
// tombstones of the queue entries taken before, which, a pass per
// delivery, cost more under load than the indexing itself. A search
// meanwhile reads what is not indexed yet.
const textIndexGather = 100 * time.Millisecond

// DefaultTextIndexDelay is how long a delivered message waits before the
// indexer reads it (quill serve --text-index-delay). Mail fetched and
// deleted within it, as POP3 clients do, is never indexed: indexing was
// half of a node's CPU under the Porcupine workload, where nothing
// searches (docs/benchmarks.md, "Issue 16: the text index's cost"). A
// SEARCH indexes its user's waiting messages first (catchUpText), so the
// delay does not slow searches of new mail.
const DefaultTextIndexDelay = 30 * time.Second

// RunTextIndex indexes the queued messages until stop closes. It first
// queues every message held here that has no document yet (a store made
// before the index existed, or an index dropped to be rebuilt). Messages
// are indexed once they have waited TextIndexDelay.
func (m *Manager) RunTextIndex(stop <-chan struct{}) {
	m.wakeTextIndex()
	m.text.mu.Lock()
	wake := m.text.wake
	m.text.mu.Unlock()
	if err := m.queueUnindexed(); err != nil {
		m.logf("text index: queueing the messages held here: %v", err)
	}
	delay := m.TextIndexDelay
	period := textIndexIdle
	if delay > 0 && delay < period {
		period = delay
	}
	idle := time.NewTicker(period)
	defer idle.Stop()
	for {
		select {
		case <-stop:
			return
		case <-wake:
			if delay > 0 {
				continue // nothing a delivery queues is due yet: the ticker takes it
			}
			select {
			case <-stop:
				return
			case <-time.After(textIndexGather):
			}
		case <-idle.C:
		}
		cutoff := time.Now().Add(-delay).UnixNano()
		// Each step goes on from where the last one stopped: the entries
		// it took are deleted, and a scan from the start would step over
		// all their tombstones again.
		var from []byte
		for {
			_, more, last, err := m.indexFrom(from, textIndexBatch, cutoff)
			if err != nil {
				m.logf("text index: %v", err)
				break
			}
			if !more {
				break
			}
			from = last
			select {
			case <-stop:
				return
			default:
			}
		}
	}
}

// textIndexVersion names the index's layout: a node whose store was
// indexed under another (or none) queues every message held here that has
// no document, and one of layout 1 drops its vocabulary keys. (A layout
// that changes documents must also drop the old keys.)
const textIndexVersion = "2"

func textVersionKey() []byte {
	return append(store.KindPrefix(store.KindNode), "text-index-version"...)
}

// queueUnindexed queues each message held here that has no document, once
// per layout version.
func (m *Manager) queueUnindexed() error {
	if v, closer, err := m.db.Get(textVersionKey()); err == nil {
		same := string(v) == textIndexVersion
		closer.Close()
		if same {
			return nil
		}
	} else if !errors.Is(err, store.ErrNotFound) {
		return err
	}
	if err := m.dropVocabKeys(); err != nil {
		return err
	}
	b := m.db.NewBatch()
	defer func() { b.Close() }()
	queued := 0
	err := m.eachRecord(func(user string, v []byte) error {
		var msg Message
		if err := decodeMessage(v, &msg); err != nil {
			return nil
		}
		if has, err := m.hasKey(textKey(user, textID, []byte(msg.ID))); err != nil || has {
			return err
		}
		queued++
		if err := b.Set(toIndexKey(user, msg.ID), nil); err != nil {
			return err
		}
		if queued%4096 == 0 {
			if err := b.Commit(store.NoSync); err != nil {
				return err
			}
			b.Close()
			b = m.db.NewBatch()
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := b.Set(textVersionKey(), []byte(textIndexVersion)); err != nil {
		return err
	}
	if queued > 0 {
		m.logf("text index: %d messages held here queued for indexing", queued)
	}
	return b.Commit(store.NoSync)
}

// dropVocabKeys deletes layout 1's vocabulary keys: a range deletion per
// user, found by seeking from one user's text keys to the next's (a
// thousand users are a thousand seeks, not a walk of the whole index).
func (m *Manager) dropVocabKeys() error {
	it, err := m.db.PrefixIter(nil, store.KindPrefix(store.KindText))
	if err != nil {
		return err
	}
	defer it.Close()
	b := m.db.NewBatch()
	defer b.Close()
	users := 0
	for ok := it.First(); ok; {
		user, _, good := splitUserKey(it.Key())
		if !good {
			ok = it.Next()
			continue
		}
		p := store.UserPrefix(store.KindText, user)
		v := append(bytes.Clone(p), textVocab)
		if err := b.DeleteRange(v, store.UpperBound(v)); err != nil {
			return err
		}
		users++
		ok = it.SeekGE(store.UpperBound(p))
	}
	if err := it.Error(); err != nil {
		return err
	}
	if users == 0 {
		return nil
	}
	m.logf("text index: layout %s: vocabulary keys of %d users dropped", textIndexVersion, users)
	return b.Commit(store.NoSync)
}

func (m *Manager) hasKey(k []byte) (bool, error) { return hasIn(m.db, k) }

// splitUserKey splits a key of UserPrefix's layout: kind, bucket, user 0
// rest.
func splitUserKey(k []byte) (user, rest string, ok bool) {
	if len(k) < 3 {
		return "", "", false
	}
	i := bytes.IndexByte(k[2:], 0)
	if i < 0 {
		return "", "", false
	}
	return string(k[2 : 2+i]), string(k[3+i:]), true
}

// TextQueued reports how many messages wait for the text index.
func (m *Manager) TextQueued() (int, error) {
	return m.countKeys(store.KindPrefix(store.KindToIndex))
}

// IndexQueued indexes up to max queued messages, due or not, and reports
// how many queue entries it took.
func (m *Manager) IndexQueued(max int) (int, error) {
	n, _, _, err := m.indexFrom(nil, max, math.MaxInt64)
	return n, err
}

// indexFrom indexes up to max queued messages queued at or before cutoff
// (Unix nanoseconds) whose entries come after the key from (all when nil).
// It reports how many it took, whether it stopped at a limit before the
// queue's end, and the last entry it looked at.
func (m *Manager) indexFrom(from []byte, max int, cutoff int64) (int, bool, []byte, error) {
	p := store.KindPrefix(store.KindToIndex)
	lower := p
	if from != nil {
		lower = append(bytes.Clone(from), 0)
	}
	it, err := m.db.NewIter(&store.IterOptions{LowerBound: lower, UpperBound: store.UpperBound(p)})
	if err != nil {
		return 0, false, nil, err
	}
	var (
		users  []string
		ids    [][]string
		last   []byte
		taken  int
		looked int
	)
	for it.First(); it.Valid() && taken < max && looked < textIndexScan; it.Next() {
		looked++
		last = bytes.Clone(it.Key())
		user, id, ok := splitUserKey(it.Key())
		if !ok || !dueBy(it.Value(), cutoff) {
			continue
		}
		// Keys sort by bucket and user: a user's entries are together.
		if len(users) == 0 || users[len(users)-1] != user {
			users, ids = append(users, user), append(ids, nil)
		}
		ids[len(ids)-1] = append(ids[len(ids)-1], id)
		taken++
	}
	more := it.Valid()
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return 0, false, nil, err
	}
	for i, user := range users {
		// A user whose messages fail stays queued for the next pass and
		// does not hold up the others.
		if err := m.indexMessages(user, ids[i]); err != nil {
			m.logf("text index: user %s: %v", user, err)
		}
	}
	return taken, more, last, nil
}

// textSearchCatchUp bounds how long a search spends indexing its user's
// waiting messages before it answers: the proxy waits textTimeout (2 s)
// for every node's answer, and what is left is read by the search.
const textSearchCatchUp = 500 * time.Millisecond

// textCatchUpStep is how many of a user's waiting messages a search
// indexes between looks at its deadline.
const textCatchUpStep = 32

// catchUpText indexes the user's queued messages, due or not, for up to
// textSearchCatchUp: a search then narrows by the index instead of reading
// the messages that wait for TextIndexDelay (as Dovecot's fts indexes at
// the first search).
func (m *Manager) catchUpText(user string) error {
	deadline := time.Now().Add(textSearchCatchUp)
	p := store.UserPrefix(store.KindToIndex, user)
	lower := p
	for time.Now().Before(deadline) {
		it, err := m.db.NewIter(&store.IterOptions{LowerBound: lower, UpperBound: store.UpperBound(p)})
		if err != nil {
			return err
		}
		var ids []string
		for it.First(); it.Valid() && len(ids) < textCatchUpStep; it.Next() {
			ids = append(ids, string(it.Key()[len(p):]))
			// On from the last one taken: a message that failed stays
			// queued and is not tried again by this search.
			lower = append(bytes.Clone(it.Key()), 0)
		}
		if err := errors.Join(it.Error(), it.Close()); err != nil {
			return err
		}
		if len(ids) == 0 {
			return nil
		}
		if err := m.indexMessages(user, ids); err != nil {
			return err
		}
	}
	return nil
}

// maxIndexedBody is the largest body the index reads: reading a body
// and its text takes about four times its size in memory at once, which
// for a message of tens of megabytes (an attachment, mostly) would be the
// node's largest allocation by far (issue 16: a 25 MB message raises a
// node's memory by less than twice its size). Larger ones get no
// document and are read by each search instead, like a message of more
// than maxDocTerms terms.
const maxIndexedBody = 4 << 20

// textDocIn is a queued message and the terms read from its body (nil:
// no body, or too large to read).
type textDocIn struct {
	id    string
	terms map[string][]string
}

// indexMessages gives a user's queued messages their documents and their
// terms' postings, in batches of at most textIndexGroupBytes of bodies.
func (m *Manager) indexMessages(user string, ids []string) error {
	for len(ids) > 0 {
		var in []textDocIn
		read := 0
		for len(ids) > 0 && read < textIndexGroupBytes {
			id := ids[0]
			ids = ids[1:]
			terms, n, err := m.readTerms(user, id)
			if err != nil {
				// It stays queued for the next pass.
				m.logf("text index: user %s message %s: %v", user, id, err)
				continue
			}
			read += n
			in = append(in, textDocIn{id: id, terms: terms})
		}
		if err := m.writeDocs(user, in); err != nil {
			return err
		}
	}
	return nil
}

// readTerms reads a message's terms from its body, outside the user's
// lock, and the body's size.
func (m *Manager) readTerms(user, id string) (map[string][]string, int, error) {
	_, size, ok, err := bodyRef(m.db, user, id)
	if err != nil {
		return nil, 0, err
	}
	if ok && size > maxIndexedBody {
		return nil, 0, nil
	}
	body, err := m.Body(user, id)
	if errors.Is(err, ErrNoMessage) {
		return nil, 0, nil
	}
	if err != nil {
		return nil, 0, err
	}
	return fts.Terms(body), len(body), nil
}

// writeDocs writes the documents of messages whose terms were read, under
// the user's lock, where a message's place cannot change: one batch, one
// posting Merge per distinct term of them all.
func (m *Manager) writeDocs(user string, in []textDocIn) error {
	if len(in) == 0 {
		return nil
	}
	defer m.lockUser(user)()
	b := m.db.NewBatch()
	defer b.Close()
	ut := m.lockText(user)
	defer ut.mu.Unlock()
	type added struct {
		doc uint32
		loc docLoc
	}
	var (
		docs     []added
		postings = map[[2]string][]byte{} // field, term -> the new docs
		order    [][2]string
	)
	next := ut.next
	for _, d := range in {
		if err := b.Delete(toIndexKey(user, d.id)); err != nil {
			return err
		}
		var rec objectRecord
		ok, err := getJSON(m.db, objectKey(user, d.id), &rec)
		if err != nil {
			return err
		}
		has, err := m.hasKey(textKey(user, textID, []byte(d.id)))
		if err != nil {
			return err
		}
		if !ok || rec.Deleted || d.terms == nil || has || countTerms(d.terms) > maxDocTerms {
			// Gone, bodiless or indexed already: only the entry goes. A
			// message of more terms than maxDocTerms, or larger than
			// maxIndexedBody, gets no document, so searches always read it.
			continue
		}
		if next == 0 {
			if next, err = m.readNextDoc(user); err != nil {
				return err
			}
		}
		doc := next
		next++
		loc := docLoc{v: rec.UIDValidity, uid: rec.UID, idh: idHash(d.id)}
		if err := errors.Join(
			b.Set(textKey(user, textDoc, docBytes(doc)), docValue(loc, d.id)),
			b.Set(textKey(user, textID, []byte(d.id)), docBytes(doc)),
		); err != nil {
			return err
		}
		docs = append(docs, added{doc, loc})
		for field, list := range d.terms {
			for _, term := range list {
				k := [2]string{field, term}
				p, seen := postings[k]
				if !seen {
					order = append(order, k)
				}
				postings[k] = binary.AppendUvarint(p, uint64(doc))
			}
		}
	}
	if len(docs) > 0 {
		if err := b.Set(textKey(user, textNext), docBytes(next)); err != nil {
			return err
		}
	}
	var fresh [][2]string
	prefix := store.UserPrefix(store.KindText, user)
	var key []byte
	for _, k := range order {
		field, term := k[0], k[1]
		key = appendTermKey(key[:0], prefix, textPost, field, term)
		if err := b.Merge(key, postings[k]); err != nil {
			return err
		}
		if ut.loaded[field] {
			if _, known := ut.vocab[field][term]; !known {
				fresh = append(fresh, [2]string{field, term})
			}
		}
	}
	if err := b.Commit(store.NoSync); err != nil {
		return err
	}
	if len(docs) > 0 {
		ut.next = next
		metrics.TextIndexed.Add(float64(len(docs)))
	}
	if ut.docs != nil {
		for _, a := range docs {
			for len(ut.docs) <= int(a.doc) {
				ut.docs = append(ut.docs, docLoc{})
			}
			ut.docs[a.doc] = a.loc
		}
	}
	for _, ft := range fresh {
		ut.addTerm(ft[0], ft[1])
	}
	return nil
}

func (ut *userText) addTerm(field, term string) {
	if !ut.loaded[field] {
		return // read whole when first needed
	}
	if _, ok := ut.vocab[field][term]; ok {
		return
	}
	ut.vocab[field][term] = struct{}{}
	ut.terms[field] = append(ut.terms[field], term)
}

func (m *Manager) readNextDoc(user string) (uint32, error) {
	v, closer, err := m.db.Get(textKey(user, textNext))
	if errors.Is(err, store.ErrNotFound) {
		return 1, nil
	}
	if err != nil {
		return 0, err
	}
	defer closer.Close()
	return binary.BigEndian.Uint32(v), nil
}

// TextAnswer is what a node's text index says about a search's string
// queries on one mailbox.
type TextAnswer struct {
	// Skip names, sorted, the messages that cannot match every query.
	Skip []TextSkip
	// Sure[i] names, sorted, the messages that certainly match
	// queries[i] (fts.Sure; nil for a query the index cannot prove).
	Sure [][]TextSkip
}

// TextExcluded answers for the messages of the mailbox with UIDVALIDITY v
// held and indexed here: those that cannot match every one of the queries,
// and for each query those that certainly match it. Messages not indexed
// yet are in neither.
func (m *Manager) TextExcluded(user string, v uint32, queries []fts.Query) (*TextAnswer, error) {
	if err := m.catchUpText(user); err != nil {
		// The messages still queued are read by the search.
		m.logf("text index: user %s: indexing before a search: %v", user, err)
	}
	ut := m.lockText(user)
	defer ut.mu.Unlock()
	if err := m.loadDocs(ut, user); err != nil {
		return nil, fmt.Errorf("user %s: text index: %w", user, err)
	}
	// A message must be a candidate of every query; one pass then names
	// the documents of the mailbox that are not.
	ix := textReader{m: m, ut: ut, user: user}
	var cand fts.Bitset
	narrowed := false
	out := &TextAnswer{Sure: make([][]TextSkip, len(queries))}
	for i, q := range queries {
		docs, ok, err := fts.Candidates(ix, q)
		if err != nil {
			return nil, fmt.Errorf("user %s: text index: %w", user, err)
		}
		switch {
		case !ok:
		case !narrowed:
			cand, narrowed = docs, true
		default:
			cand.And(docs)
		}
		sure, err := fts.Sure(ix, q)
		if err != nil {
			return nil, fmt.Errorf("user %s: text index: %w", user, err)
		}
		if !sure.Empty() {
			out.Sure[i] = ut.skips(v, func(d uint32) bool { return sure.Has(d) })
			metrics.TextSure.Add(float64(len(out.Sure[i])))
		}
	}
	if narrowed {
		out.Skip = ut.skips(v, func(d uint32) bool { return !cand.Has(d) })
	}
	metrics.TextExcluded.Add(float64(len(out.Skip)))
	return out, nil
}

// skips returns, sorted, the skips of the documents of mailbox v that pick
// chooses.
func (ut *userText) skips(v uint32, pick func(doc uint32) bool) []TextSkip {
	var out []TextSkip
	for d, loc := range ut.docs {
		if loc.v == v && pick(uint32(d)) {
			out = append(out, TextSkip(uint64(loc.uid)<<32|uint64(loc.idh)))
		}
	}
	slices.Sort(out)
	return out
}

func (m *Manager) loadDocs(ut *userText, user string) error {
	if ut.docs != nil {
		return nil
	}
	p := textKey(user, textDoc)
	it, err := m.db.PrefixIter(nil, p)
	if err != nil {
		return err
	}
	defer it.Close()
	docs := []docLoc{{}}
	for it.First(); it.Valid(); it.Next() {
		k, v := it.Key(), it.Value()
		if len(k) != len(p)+4 || len(v) < 8 {
			continue
		}
		doc := binary.BigEndian.Uint32(k[len(p):])
		for len(docs) <= int(doc) {
			docs = append(docs, docLoc{})
		}
		docs[doc] = docLoc{v: binary.BigEndian.Uint32(v), uid: binary.BigEndian.Uint32(v[4:]), idh: idHash(string(v[8:]))}
	}
	if err := it.Error(); err != nil {
		return err
	}
	ut.docs = docs
	return nil
}

// textReader is one user's index as fts.Candidates reads it, under the
// user's userText lock.
type textReader struct {
	m    *Manager
	ut   *userText
	user string
}

func (r textReader) Terms(field string) ([]string, error) {
	ut := r.ut
	if ut.loaded[field] {
		return ut.terms[field], nil
	}
	// The postings' keys are the vocabulary; reading them merges each
	// term's operands too, which the term's Postings read needs next.
	p := termKey(r.user, textPost, field, "")
	it, err := r.m.db.PrefixIter(nil, p)
	if err != nil {
		return nil, err
	}
	defer it.Close()
	set := map[string]struct{}{}
	var list []string
	for it.First(); it.Valid(); it.Next() {
		t := string(it.Key()[len(p):])
		set[t] = struct{}{}
		list = append(list, t)
	}
	if err := it.Error(); err != nil {
		return nil, err
	}
	ut.vocab[field], ut.terms[field], ut.loaded[field] = set, list, true
	return list, nil
}

func (r textReader) Postings(field, term string) ([]uint32, error) {
	v, closer, err := r.m.db.Get(termKey(r.user, textPost, field, term))
	if errors.Is(err, store.ErrNotFound) {
		return nil, nil
	}
	if err != nil {
		return nil, err
	}
	defer closer.Close()
	var out []uint32
	for len(v) > 0 {
		d, n := binary.Uvarint(v)
		if n <= 0 {
			break
		}
		out = append(out, uint32(d))
		v = v[n:]
	}
	return out, nil
}

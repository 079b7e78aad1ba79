package mailbox

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/fnv"
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
//	'v' field 0 term            -> (the field's vocabulary)
//	'n'                         -> the next doc number (4)
//
// Postings are only appended: a document that goes (expunge, move away)
// is deleted from 'd' and 'i' and its numbers in postings then name nothing.
// Documents are numbered per user from 1 and never reused.

const (
	textDoc   = 'd'
	textID    = 'i'
	textPost  = 'p'
	textVocab = 'v'
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
// indexing a message writes two keys per term, and one buffer for them all
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

// queueText puts a message held here on the text index's queue.
func (t *tx) queueText(user, id string) error {
	t.textQueued = true
	return t.b.Set(toIndexKey(user, id), nil)
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

// textIndexBatch is how many queued messages one pass of the indexer takes.
const textIndexBatch = 256

// textIndexIdle is how often an idle indexer looks at its queue anyway.
const textIndexIdle = 10 * time.Second

// textIndexGather is how long the indexer lets deliveries gather after
// being woken: every pass starts by stepping over the tombstones of the
// queue entries taken before, which, a pass per delivery, cost more under
// load than the indexing itself. A search meanwhile reads what is not
// indexed yet.
const textIndexGather = 100 * time.Millisecond

// RunTextIndex indexes the queued messages until stop closes. It first
// queues every message held here that has no document yet (a store made
// before the index existed, or an index dropped to be rebuilt).
func (m *Manager) RunTextIndex(stop <-chan struct{}) {
	m.wakeTextIndex()
	m.text.mu.Lock()
	wake := m.text.wake
	m.text.mu.Unlock()
	if err := m.queueUnindexed(); err != nil {
		m.logf("text index: queueing the messages held here: %v", err)
	}
	idle := time.NewTicker(textIndexIdle)
	defer idle.Stop()
	for {
		select {
		case <-stop:
			return
		case <-wake:
			select {
			case <-stop:
				return
			case <-time.After(textIndexGather):
			}
		case <-idle.C:
		}
		// Each pass goes on from where the last one stopped: the entries
		// it took are deleted, and a scan from the start would step over
		// all their tombstones again.
		var from []byte
		for {
			n, last, err := m.indexFrom(from, textIndexBatch)
			if err != nil {
				m.logf("text index: %v", err)
				break
			}
			if n < textIndexBatch {
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
// no document. (A layout that changes documents must also drop the old
// keys.)
const textIndexVersion = "1"

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

// IndexQueued indexes up to max queued messages and reports how many
// queue entries it took.
func (m *Manager) IndexQueued(max int) (int, error) {
	n, _, err := m.indexFrom(nil, max)
	return n, err
}

// indexFrom indexes up to max queued messages whose entries come after
// the key from (all when nil), and returns the last entry's key.
func (m *Manager) indexFrom(from []byte, max int) (int, []byte, error) {
	type item struct{ user, id string }
	var items []item
	p := store.KindPrefix(store.KindToIndex)
	lower := p
	if from != nil {
		lower = append(bytes.Clone(from), 0)
	}
	it, err := m.db.NewIter(&store.IterOptions{LowerBound: lower, UpperBound: store.UpperBound(p)})
	if err != nil {
		return 0, nil, err
	}
	var last []byte
	for it.First(); it.Valid() && len(items) < max; it.Next() {
		last = bytes.Clone(it.Key())
		if user, id, ok := splitUserKey(it.Key()); ok {
			items = append(items, item{user, id})
		}
	}
	if err := errors.Join(it.Error(), it.Close()); err != nil {
		return 0, nil, err
	}
	for _, x := range items {
		// One message that fails stays queued for the next pass and does
		// not hold up the others.
		if err := m.indexOne(x.user, x.id); err != nil {
			m.logf("text index: user %s message %s: %v", x.user, x.id, err)
		}
	}
	return len(items), last, nil
}

// maxIndexedBody is the largest body the index reads: reading a body
// and its text takes about four times its size in memory at once, which
// for a message of tens of megabytes (an attachment, mostly) would be the
// node's largest allocation by far (issue 16: a 25 MB message raises a
// node's memory by less than twice its size). Larger ones get no
// document and are read by each search instead, like a message of more
// than maxDocTerms terms.
const maxIndexedBody = 4 << 20

// indexOne gives a queued message its document and its terms' postings.
// The terms are read from the body outside the user's lock; the document
// is written under it, where the message's place cannot change.
func (m *Manager) indexOne(user, id string) error {
	var terms map[string][]string
	if _, size, ok, err := bodyRef(m.db, user, id); err != nil {
		return err
	} else if !ok || size <= maxIndexedBody {
		body, err := m.Body(user, id)
		if err == nil {
			terms = fts.Terms(body)
		} else if !errors.Is(err, ErrNoMessage) {
			return err
		}
	}
	defer m.lockUser(user)()
	b := m.db.NewBatch()
	defer b.Close()
	if err := b.Delete(toIndexKey(user, id)); err != nil {
		return err
	}
	var rec objectRecord
	ok, err := getJSON(m.db, objectKey(user, id), &rec)
	if err != nil {
		return err
	}
	has, err := m.hasKey(textKey(user, textID, []byte(id)))
	if err != nil {
		return err
	}
	if !ok || rec.Deleted || terms == nil || has || countTerms(terms) > maxDocTerms {
		// Gone, bodiless or indexed already: only the entry goes. A
		// message of more terms than maxDocTerms, or larger than
		// maxIndexedBody, gets no document, so searches always read it.
		return b.Commit(store.NoSync)
	}
	ut := m.lockText(user)
	defer ut.mu.Unlock()
	if ut.next == 0 {
		if ut.next, err = m.readNextDoc(user); err != nil {
			return err
		}
	}
	doc := ut.next
	loc := docLoc{v: rec.UIDValidity, uid: rec.UID, idh: idHash(id)}
	if err := errors.Join(
		b.Set(textKey(user, textDoc, docBytes(doc)), docValue(loc, id)),
		b.Set(textKey(user, textID, []byte(id)), docBytes(doc)),
		b.Set(textKey(user, textNext), docBytes(doc+1)),
	); err != nil {
		return err
	}
	posting := binary.AppendUvarint(nil, uint64(doc))
	var fresh [][2]string
	prefix := store.UserPrefix(store.KindText, user)
	var key []byte
	for field, list := range terms {
		for _, term := range list {
			// The vocabulary key is written whether or not the term is
			// known: asking the store was a point read per term, most of
			// what indexing cost under load (compactions keep one).
			key = appendTermKey(key[:0], prefix, textPost, field, term)
			if err := b.Merge(key, posting); err != nil {
				return err
			}
			key = appendTermKey(key[:0], prefix, textVocab, field, term)
			if err := b.Set(key, nil); err != nil {
				return err
			}
			if ut.loaded[field] {
				if _, known := ut.vocab[field][term]; !known {
					fresh = append(fresh, [2]string{field, term})
				}
			}
		}
	}
	if err := b.Commit(store.NoSync); err != nil {
		return err
	}
	ut.next = doc + 1
	if ut.docs != nil {
		for len(ut.docs) <= int(doc) {
			ut.docs = append(ut.docs, docLoc{})
		}
		ut.docs[doc] = loc
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
	p := termKey(r.user, textVocab, field, "")
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

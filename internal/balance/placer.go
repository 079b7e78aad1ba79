package balance

import (
	"maps"
	"math/rand/v2"
	"slices"
	"sync"

	"github.com/quillmail/quill/internal/cluster"
)

// Members is what placement needs of the membership: the live members
// that may hold a bucket's users' state (with islands, those of the
// bucket's island; cluster.Eligible).
type Members interface {
	Eligible(bucket uint8) ([]cluster.MemberInfo, error)
}

// Placer chooses the nodes of replica sets: the R nodes of a new message
// (the delivery proxy) and the new replicas of an object short of its R
// (the replication manager's repair). Every choice is spread-limited and
// load-aware (Choose).
type Placer struct {
	members Members
	loads   *Tracker
	spread  int // the cluster's default spread
	// policy is Dynamic but for the experiments of Porcupine §6.3
	// (SetPolicy).
	policy Policy

	mu  sync.Mutex
	rnd *rand.Rand
}

// NewPlacer returns a placer over the live members, their loads and the
// cluster's default spread (DefaultSpread if 0).
func NewPlacer(members Members, loads *Tracker, spread int) *Placer {
	if spread <= 0 {
		spread = DefaultSpread
	}
	return &Placer{members: members, loads: loads, spread: spread, policy: Dynamic,
		rnd: rand.New(rand.NewPCG(rand.Uint64(), rand.Uint64()))}
}

// SetPolicy sets how new mail is placed (Dynamic unless an experiment says
// otherwise); call it before the node serves.
func (p *Placer) SetPolicy(pol Policy) { p.policy = pol }

// Place picks the replica set of a new message of user: Set under the
// Dynamic and Random policies, the user's fixed nodes (among those that may
// hold the user's state) under Static.
func (p *Placer) Place(user string, holders []cluster.NodeID, spread, r int, exclude map[cluster.NodeID]bool) []cluster.NodeID {
	bucket := cluster.Bucket(user)
	if p.policy != Static {
		return p.Set(bucket, holders, spread, r, exclude)
	}
	if spread <= 0 {
		spread = p.spread
	}
	var ranked []cluster.NodeID
	eligible, _ := p.members.Eligible(bucket) // in the bucket's rank order
	for _, m := range eligible {
		if !exclude[m.ID] {
			ranked = append(ranked, m.ID)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return StaticSet(ranked, spread, r, p.loads.Get, p.rnd)
}

// Set picks the r nodes of a new message's replica set for a user of
// bucket, least loaded first (the first coordinates), within the user's
// spread (0: the default) where it can, never among exclude, and only
// among the nodes that may hold the bucket's state (its island's): none
// when its island has no live member. Suspect members (memberlist missed their
// acks: paused, overloaded, or about to be declared dead) are taken only
// when the set cannot be filled otherwise: a store that waits on one waits
// for its deadline.
func (p *Placer) Set(bucket uint8, holders []cluster.NodeID, spread, r int, exclude map[cluster.NodeID]bool) []cluster.NodeID {
	if spread <= 0 {
		spread = p.spread
	}
	spread = max(spread, r)
	var set []cluster.NodeID
	ex := maps.Clone(exclude)
	if ex == nil {
		ex = map[cluster.NodeID]bool{}
	}
	for _, suspects := range []bool{false, true} {
		for len(set) < r {
			var hs []cluster.NodeID
			for _, h := range holders {
				if !ex[h] {
					hs = append(hs, h)
				}
			}
			n, ok := p.choose(bucket, hs, spread-len(set), ex, suspects)
			if !ok {
				break
			}
			set = append(set, n)
			ex[n] = true
		}
	}
	return set
}

// Replicas picks n live nodes outside exclude for new replicas of an
// existing object of a user of bucket (the replication manager's repair).
func (p *Placer) Replicas(bucket uint8, exclude []cluster.NodeID, n int) []cluster.NodeID {
	ex := map[cluster.NodeID]bool{}
	for _, e := range exclude {
		ex[e] = true
	}
	return p.Set(bucket, nil, n, n, ex)
}

// May says whether node n may hold the state of a bucket's users (with
// islands: n is a live member of the bucket's island).
func (p *Placer) May(bucket uint8, n cluster.NodeID) bool {
	eligible, _ := p.members.Eligible(bucket)
	return slices.ContainsFunc(eligible, func(m cluster.MemberInfo) bool { return m.ID == n })
}

func (p *Placer) choose(bucket uint8, holders []cluster.NodeID, spread int, exclude map[cluster.NodeID]bool, suspects bool) (cluster.NodeID, bool) {
	var live []cluster.NodeID
	eligible, _ := p.members.Eligible(bucket) // none: the island is down, no set
	for _, m := range eligible {
		if !exclude[m.ID] && (suspects || m.State != "suspect") {
			live = append(live, m.ID)
		}
	}
	load := p.loads.Get
	if p.policy == Random {
		load = blind(load)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return Choose(holders, live, spread, load, p.rnd)
}

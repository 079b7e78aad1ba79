package balance

import (
	"maps"
	"math/rand/v2"
	"sync"

	"github.com/quillmail/quill/internal/cluster"
)

// Members is what placement needs of the membership.
type Members interface {
	Alive() []cluster.MemberInfo
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
// Dynamic and Random policies, the user's fixed nodes under Static.
func (p *Placer) Place(user string, holders []cluster.NodeID, spread, r int, exclude map[cluster.NodeID]bool) []cluster.NodeID {
	if p.policy != Static {
		return p.Set(holders, spread, r, exclude)
	}
	if spread <= 0 {
		spread = p.spread
	}
	var live []cluster.NodeID
	for _, m := range p.members.Alive() {
		if !exclude[m.ID] {
			live = append(live, m.ID)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	return StaticSet(user, live, spread, r, p.loads.Get, p.rnd)
}

// Set picks the r nodes of a new message's replica set, least loaded first
// (the first coordinates), within the user's spread (0: the default) where
// it can, never among exclude. Suspect members (memberlist missed their
// acks: paused, overloaded, or about to be declared dead) are taken only
// when the set cannot be filled otherwise: a store that waits on one waits
// for its deadline.
func (p *Placer) Set(holders []cluster.NodeID, spread, r int, exclude map[cluster.NodeID]bool) []cluster.NodeID {
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
			n, ok := p.choose(hs, spread-len(set), ex, suspects)
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
// existing object (the replication manager's repair).
func (p *Placer) Replicas(exclude []cluster.NodeID, n int) []cluster.NodeID {
	ex := map[cluster.NodeID]bool{}
	for _, e := range exclude {
		ex[e] = true
	}
	return p.Set(nil, n, n, ex)
}

func (p *Placer) choose(holders []cluster.NodeID, spread int, exclude map[cluster.NodeID]bool, suspects bool) (cluster.NodeID, bool) {
	var live []cluster.NodeID
	for _, m := range p.members.Alive() {
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

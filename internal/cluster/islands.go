package cluster

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/quillmail/quill/internal/island"
	"github.com/quillmail/quill/internal/rpc"
)

// Islands (Archipelago, internal/island): every node names its island in
// its meta (NodeMeta.Island), and once a bucket→island table is installed
// (SetIslandTable, from the clusterwide object IslandTableObject) a
// bucket's users' state stays on the live members of the bucket's island.
// Eligible is the one seam every placement goes through: the user map's
// manager, the profile replicas, the replica sets of new and repaired
// messages, the queue's replicas, the writer's REDO secondary and the
// rebalancer's targets all choose among what it returns. Without a table
// (every node in the default island, the cluster before islands) it
// returns every live member and nothing changes.

// IslandTableObject is the clusterwide object holding the table
// (island.Table.Encode): every node watches it and installs a newer epoch.
const IslandTableObject = "island/table"

// InitialStable is how long the live set must stay the same before the
// first table is made (NeedInitial): a starting cluster's nodes arrive a
// few seconds apart, and a table made at each arrival would be made again
// (the first over fewer islands than the cluster has).
const InitialStable = 5 * time.Second

// ErrNoIslandMember says the island owning a user's bucket has no live
// member: the user's state cannot be reached until one comes back. It is
// an rpc.ErrUnavailable, so sessions answer a temporary failure.
var ErrNoIslandMember = fmt.Errorf("no live member of the user's island: %w", rpc.ErrUnavailable)

// IslandOf returns the island a member's meta names (Default when none).
func (n NodeMeta) IslandOf() string {
	if n.Island == "" {
		return island.Default
	}
	return n.Island
}

// metaIsland is what a node gossips for its island: nothing for the
// default one, so a cluster without islands gossips the meta it always did.
func metaIsland(name string) string {
	if name == island.Default {
		return ""
	}
	return name
}

// rankInfo orders members by their weight for a bucket, highest first
// (Ranked's order).
func rankInfo(bucket uint8, ms []MemberInfo) []MemberInfo {
	return rankBy(bucket, ms, func(m MemberInfo) NodeID { return m.ID })
}

// Eligible returns the members of alive that may hold the state of a
// bucket's users, in the bucket's rank order: all of them when there is no
// table (ok false), else those of the island owning the bucket
// (island.Place). A bucket whose island has no live member gets an error
// wrapping ErrNoIslandMember and *island.NoLiveMemberError: placement
// never falls back to another island.
func Eligible(bucket uint8, alive []MemberInfo, t island.Table, ok bool) ([]MemberInfo, error) {
	ranked := rankInfo(bucket, alive)
	if !ok {
		return ranked, nil
	}
	pl, err := island.Place(bucket, t, ranked, func(m MemberInfo) string { return m.IslandOf() }, 1)
	if err != nil {
		var nl *island.NoLiveMemberError
		if errors.As(err, &nl) {
			return nil, fmt.Errorf("%w: %w", ErrNoIslandMember, err)
		}
		return nil, err
	}
	return pl.Mail, nil
}

// EligibleIDs is Eligible's members' ids.
func EligibleIDs(ms []MemberInfo) []NodeID {
	out := make([]NodeID, len(ms))
	for i, m := range ms {
		out[i] = m.ID
	}
	return out
}

// within returns the rule Compute uses to keep each bucket on its island:
// nil without a table.
func within(t island.Table, ok bool, islandOf map[NodeID]string) func(uint8, NodeID) bool {
	if !ok {
		return nil
	}
	return func(b uint8, n NodeID) bool { return islandOf[n] == t.Island(b) }
}

// NeedInitial decides whether this node makes the first island table now,
// and over which islands: when there is no table yet (haveTable false),
// the live members name more than one island, this node is the live
// member with the lowest id, and the live set has not changed for
// InitialStable (stableFor). Only one node makes it, and the clusterwide
// object's stamp orders two made by nodes that disagreed on who was
// lowest: the later one wins everywhere, and both are epoch 1 over the
// islands of their moment.
func NeedInitial(self NodeID, alive []MemberInfo, haveTable bool, stableFor time.Duration) ([]string, bool) {
	if haveTable || stableFor < InitialStable || len(alive) == 0 {
		return nil, false
	}
	var names []string
	lowest := alive[0].ID
	for _, m := range alive {
		lowest = min(lowest, m.ID)
		if n := m.IslandOf(); !slices.Contains(names, n) {
			names = append(names, n)
		}
	}
	if lowest != self || len(names) < 2 {
		return nil, false
	}
	slices.Sort(names)
	return names, true
}

// SetIslandTable installs t if its epoch is at least the installed
// table's and it differs from it (or none is installed), recomputes the user map with it and
// tells OnChange as a membership change would. It reports whether t was
// installed.
func (m *Membership) SetIslandTable(t island.Table) bool {
	m.mu.Lock()
	// The same epoch with other contents is installed too: two first
	// tables made by nodes that each thought itself the lowest are both
	// epoch 1, and the clusterwide object's stamp (the caller installs
	// only what the object store applied as newer) decides between them.
	// Table changes after the first go through the two-phase commit
	// (internal/islandmgr), which never lets two tables of one epoch
	// commit.
	if m.hasTable && (t.Epoch() < m.table.Epoch() || t.Equal(m.table)) {
		m.mu.Unlock()
		return false
	}
	m.table, m.hasTable = t, true
	m.mu.Unlock()
	if m.cfg.Logger != nil {
		m.cfg.Logger.Info("island table installed", "epoch", t.Epoch(), "islands", t.Islands())
	}
	if m.started.Load() {
		m.recompute()
	}
	return true
}

// IslandTable returns the installed table; ok is false when there is none
// (one island: the cluster before islands).
func (m *Membership) IslandTable() (island.Table, bool) {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.table, m.hasTable
}

// Eligible returns the live members that may hold a bucket's users' state,
// in rank order (the package function Eligible over this node's view).
func (m *Membership) Eligible(bucket uint8) ([]MemberInfo, error) {
	t, ok := m.IslandTable()
	return Eligible(bucket, m.Alive(), t, ok)
}

// Eligible returns the live members that may hold a bucket's users' state
// (Membership.Eligible); before the membership starts, none.
func (p *Peers) Eligible(bucket uint8) ([]MemberInfo, error) {
	if m := p.members.Load(); m != nil {
		return m.Eligible(bucket)
	}
	return nil, nil
}

// IslandTable returns the installed island table (Membership.IslandTable).
func (p *Peers) IslandTable() (island.Table, bool) {
	if m := p.members.Load(); m != nil {
		return m.IslandTable()
	}
	return island.Table{}, false
}

// Self returns this node's own member record.
func (m *Membership) Self() MemberInfo {
	m.mu.RLock()
	defer m.mu.RUnlock()
	return m.members[m.cfg.Self]
}

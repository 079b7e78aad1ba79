package usermgr

import (
	"context"
	"sort"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/userdb"
)

// UserListing is every live profile of the cluster, as each node answered
// for the buckets it manages (without password hashes).
type UserListing struct {
	// Profiles, sorted by address.
	Profiles []ListedProfile
	// PerNode is how many profiles each live node answered with.
	PerNode map[cluster.NodeID]NodeUsers
	// Unreachable names the live nodes that did not answer in time, and
	// why: the profiles of their buckets are their last answer's (marked
	// Stale), or missing if they never answered this node.
	Unreachable map[cluster.NodeID]string
}

// ListedProfile is a profile of a listing.
type ListedProfile struct {
	userdb.Profile
	// Stale is set when the profile comes from its manager's last answer
	// (the manager did not answer within cluster.FanOutWait).
	Stale *cluster.Stale
}

// NodeUsers is one node's count of users in a listing.
type NodeUsers struct {
	Users int
	Stale *cluster.Stale
}

// Users lists every live profile in the cluster, asking every live node
// at once for the buckets it manages, each within cluster.FanOutWait: a
// node that is slow or dying costs the listing that long, and its last
// answer stands in for it. A stale answer's profile is left out when its
// bucket's manager now answered fresh (the bucket moved there, or the user
// was deleted since), and of two stale ones the newer answer wins.
func (m *Manager) Users(ctx context.Context) UserListing {
	var nodes []cluster.NodeID
	for _, a := range m.peers.Alive() {
		nodes = append(nodes, a.ID)
	}
	if len(nodes) == 0 {
		nodes = []cluster.NodeID{m.self}
	}
	answers := m.lists.Ask(ctx, nodes, cluster.FanOutWait, func(ctx context.Context, n cluster.NodeID) ([]userdb.Profile, error) {
		rep, err := m.on(n).List(ctx)
		if err != nil {
			return nil, err
		}
		return rep.Profiles, nil
	})
	um := m.peers.UserMap()
	return mergeListing(answers, um.Manager)
}

// mergeListing joins the nodes' answers to the user listing (Users): a
// stale answer's profile is left out when managerOf(address) answered
// fresh, and of two stale ones the newer wins.
func mergeListing(answers []cluster.Answer[[]userdb.Profile], managerOf func(string) cluster.NodeID) UserListing {
	out := UserListing{PerNode: map[cluster.NodeID]NodeUsers{}}
	fresh := map[cluster.NodeID]bool{}
	for _, a := range answers {
		fresh[a.Node] = a.Err == nil
	}
	best := map[string]ListedProfile{}
	for _, a := range answers {
		if a.Err != nil {
			if out.Unreachable == nil {
				out.Unreachable = map[cluster.NodeID]string{}
			}
			out.Unreachable[a.Node] = a.Err.Error()
		}
		if a.Err == nil || a.Stale != nil {
			out.PerNode[a.Node] = NodeUsers{Users: len(a.Value), Stale: a.Stale}
		}
		for _, p := range a.Value {
			if a.Stale != nil && fresh[managerOf(p.Address)] {
				continue // its manager now answered for its bucket (a deleted user stays out)
			}
			if cur, ok := best[p.Address]; ok && !newerListing(a.Stale, cur.Stale) {
				continue
			}
			best[p.Address] = ListedProfile{Profile: p, Stale: a.Stale}
		}
	}
	for _, p := range best {
		out.Profiles = append(out.Profiles, p)
	}
	sort.Slice(out.Profiles, func(i, j int) bool { return out.Profiles[i].Address < out.Profiles[j].Address })
	return out
}

// newerListing says whether an answer marked a (nil: fresh) is newer than
// one marked b.
func newerListing(a, b *cluster.Stale) bool {
	switch {
	case b == nil:
		return false
	case a == nil:
		return true
	}
	return a.AsOf.After(b.AsOf)
}

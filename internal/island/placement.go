package island

import "fmt"

// NoLiveMemberError says a bucket's island has no live member: its users'
// state cannot be reached or written until a node of that island is back.
// Placement never falls back to another island, since that would put the
// user's state where the island's failure no longer confines it
// (Archipelago's one-island principle, §1).
type NoLiveMemberError struct {
	Bucket uint8
	Island string
}

func (e *NoLiveMemberError) Error() string {
	return fmt.Sprintf("bucket %d: island %s has no live member", e.Bucket, e.Island)
}

// Placement is where a user's state may live: only in the island that owns
// the user's bucket.
type Placement[M any] struct {
	Island string
	// Writer is the node that runs the user's mailbox writer and manages
	// the bucket's soft state: the island's highest-ranked live member.
	Writer M
	// Profile are the nodes that keep the user's profile: the island's
	// profileReplicas highest-ranked live members (fewer if the island has
	// fewer).
	Profile []M
	// Mail are the nodes that may hold the user's mail, its replicas and
	// its queue entries: every live member of the island, in rank order.
	// The balancer picks among them within the user's spread.
	Mail []M
}

// Place returns the placement of a bucket's users. ranked is every live
// member in the bucket's rank order (cluster.Ranked: rendezvous hashing),
// islandOf gives a member's island (from its node meta). Filtering keeps
// the order, and a rendezvous ranking of a subset is that subset in the
// order of the whole, so the writer and profile nodes are the ones
// cluster.Ranked would pick among the island's members alone.
//
// Members whose island owns no bucket in the table (a node started with a
// new --island before the table includes it) hold no user's state; they
// still proxy sessions.
func Place[M any](bucket uint8, t Table, ranked []M, islandOf func(M) string, profileReplicas int) (Placement[M], error) {
	if len(t.islands) == 0 {
		return Placement[M]{}, fmt.Errorf("bucket %d: no island table", bucket)
	}
	pl := Placement[M]{Island: t.Island(bucket)}
	for _, m := range ranked {
		if islandOf(m) == pl.Island {
			pl.Mail = append(pl.Mail, m)
		}
	}
	if len(pl.Mail) == 0 {
		return Placement[M]{}, &NoLiveMemberError{Bucket: bucket, Island: pl.Island}
	}
	pl.Writer = pl.Mail[0]
	n := min(max(profileReplicas, 1), len(pl.Mail))
	pl.Profile = pl.Mail[:n:n] // capped, so appending to it cannot overwrite Mail
	return pl, nil
}

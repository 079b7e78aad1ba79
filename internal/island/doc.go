// Package island holds the decisions behind Archipelago's islands
// (Ji, Felten, Wang, Singh: "Archipelago: An Island-Based File System For
// Highly Available And Scalable Internet Services"): which island owns each
// of Quill's 256 buckets, how that table is recomputed when islands come,
// go or drift apart in load, how a new table is agreed on, and which nodes
// may hold a user's state. Nothing here does I/O; the caller ships the
// messages, writes the records and moves the mail.
//
// The paper's pieces, and where they are:
//
//   - §1, the one-island principle: a user's profile, every replica of their
//     mail, their outbound queue entries and their mailbox writer stay in one
//     island, so that losing an island touches only the users it owns
//     (Place, placement.go).
//   - §3.1, hash-based distribution through an extendible table: a user
//     hashes to a bucket (cluster.Bucket, the user map's 256 buckets, which
//     are Archipelago's directory buckets) and the bucket to an island
//     through a table replicated on every node (Table, table.go). Initial
//     deals the buckets out evenly.
//   - §3.1, monotonic bin packing: when islands are added or removed, or the
//     bytes they hold drift past a threshold, the table is recomputed so that
//     every island only gains or only loses buckets, and only the buckets
//     needed move (Rebalance, rebalance.go).
//   - §4.1, the rebalance protocol: the new table is installed under a
//     two-phase commit that aborts if any island is unreachable or refuses
//     (Coordinator and Participant, twophase.go).
//
// Written here rather than taken from a library because no library does
// this: consistent-hashing and rendezvous libraries place keys on nodes
// without a table to move by hand, bin-packing libraries pack from scratch
// (moving everything) rather than monotonically from a current assignment,
// and 2PC libraries bring their own transport and storage, where Quill has
// its RPC and its cluster state already. Each part is a few hundred lines
// of pure functions, tested by property over random cases.
//
// # Wiring
//
// Done (see docs/ARCHITECTURE.md, "Islands"): the flag and node meta, the
// table as the clusterwide object cluster.IslandTableObject installed by
// cluster.Membership.SetIslandTable, the first table (cluster.NeedInitial),
// and every placement through cluster.Eligible. Not done: the periodic
// Rebalance and the Coordinator/Participant driver over RPC. The plan as
// it was written:
//
//   - A node's island comes from `quill serve --island NAME` (ValidName
//     checks it; no flag means Default, one island: today's behaviour). The
//     name travels in the node's memberlist meta so every node knows every
//     member's island.
//   - The Table is cluster-wide state (internal/clusterwide), stored and
//     gossiped as Encode's bytes; a node that sees a higher Epoch installs
//     it. The first table is Initial over the islands present when the
//     cluster forms.
//   - Placement: the user manager, the delivery proxy's placer, the
//     replication manager's repair, the queue and the writer's election
//     rank only the live members Place returns (cluster.Ranked of all live
//     members, filtered to the user's island, keeps rank order), and the
//     user map's manager of a bucket is the first of them. A bucket whose
//     island has no live member gets *NoLiveMemberError: its users are
//     unavailable, which is the isolation Archipelago trades for.
//   - Sessions still reach any user from any node: the IMAP, POP3 and SMTP
//     proxies forward across islands (functional homogeneity), only the
//     state stays inside one.
//   - Rebalance runs on one node (say the lowest node id), periodically and
//     on island membership changes: it gathers the bytes per bucket, calls
//     Rebalance, and when it moves anything drives a Coordinator with one
//     participant per island; each island answers through one of its live
//     nodes running a Participant. After the commit the moved buckets' users
//     are copied to their new island and switched, which must lose and
//     double no message (issue 17's requirement; not decided here).
package island

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
// The I/O is elsewhere (docs/ARCHITECTURE.md, "Islands" and "Island table
// changes"): the flag and node meta, the table as the clusterwide object
// cluster.IslandTableObject installed by cluster.Membership.SetIslandTable,
// the first table (cluster.NeedInitial), every placement through
// cluster.Eligible, and the table changes (the periodic Rebalance, the
// Coordinator and Participants over RPC, their records) in
// internal/islandmgr. A changed table moves its buckets' users by the
// replication manager's repair, copy first.
package island

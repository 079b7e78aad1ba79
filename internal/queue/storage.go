package queue

// The queue's storage seam (issue 15): where a node's queue keeps entries
// and their messages, and what follows from it (which node runs an entry,
// how the cluster's queue is listed). Two implementations: Replicated
// (replicated.go), the native store, today's Porcupine replicas of each
// entry behind the replication manager; and Shared (shared.go), a store
// every node reaches (internal/cassandra), which replicates by itself and
// leaves the nodes no queue state of their own.

import (
	"context"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/replica"
)

// Storage is what the runner, the submission path and the admin API need
// of the queue's entries and messages.
type Storage interface {
	// Place chooses the Replicas of a new entry of user's that wants want
	// copies under policy (nil where the store replicates by itself), or
	// says why it cannot (wrapping proxy.ErrTryLater).
	Place(user string, want int, policy replica.Policy) ([]cluster.NodeID, error)
	// Write makes e, stamped now, the entry's state, with its message when
	// raw is set (a new entry), and returns once stored as durably as
	// policy asks: a submission's 250 waits for it.
	Write(ctx context.Context, e *Entry, raw []byte, policy replica.Policy) error
	// Lookup returns the newest state of an entry this node can see,
	// tombstones included; ok is false if there is none.
	Lookup(ctx context.Context, id string) (e *Entry, ok bool, err error)
	// Fresh is asked before an attempt of e: it reports whether a newer
	// state than e was found (and kept), in which case the attempt waits
	// for the next round, which works from it.
	Fresh(ctx context.Context, e *Entry, alive map[cluster.NodeID]bool) bool
	// Body returns an entry's message.
	Body(ctx context.Context, id string) ([]byte, error)
	// Due returns the ids of the entries this node runs that pick (due
	// now) chooses, oldest first, and how many entries the node holds (the
	// quill_queue_entries gauge). pick must not change the entry.
	Due(ctx context.Context, alive map[cluster.NodeID]bool, pick func(e *Entry) bool) (ids []string, held int)
	// Leader returns the node that runs e, "" if none can.
	Leader(e *Entry, alive map[cluster.NodeID]bool) cluster.NodeID
	// List returns the cluster's queue (id "" for every entry, else that
	// entry's state), as any node sees it.
	List(ctx context.Context, id string) Listing
	// Sweep forgets the tombstones older than before.
	Sweep(ctx context.Context, before time.Time) (int, error)
	// SetOnChange sets what hears that entries changed (the runner's
	// kick); set before the node takes traffic.
	SetOnChange(f func())
}

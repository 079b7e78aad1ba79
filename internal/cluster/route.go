package cluster

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/quillmail/quill/internal/retry"
	"github.com/quillmail/quill/internal/rpc"
)

// ManagerRetry is how a call to a user's manager is tried again while two
// nodes briefly disagree on the user map (the callee answers "not the
// manager"): about a second in all, longer than a membership change takes
// to reach every node on a LAN. It also paces a call sent again after
// its node was lost (Repeat).
var ManagerRetry = retry.Policy{Attempts: 5, Base: 200 * time.Millisecond, Factor: 1}

// Repeat says whether OnManager may send a call again, to the bucket's
// next manager, after it was lost with the node it went to: cut short
// when the membership declared the node dead (rpc.ErrNodeGone). What it
// did there, if anything, is unknown.
type Repeat bool

const (
	// Idempotent calls are sent again: reads, and changes that leave
	// the same state when made twice (a flag set, a confirmation). When
	// the node was declared dead, the user map has already moved its
	// buckets, so the next try goes to the new manager and the caller
	// gets an answer within the membership's detection time.
	Idempotent Repeat = true
	// Once calls are not (a copy would be made twice, a create would
	// find its own mailbox): the caller gets the error, an
	// rpc.ErrUnavailable, which clients are told as a temporary failure.
	Once Repeat = false
)

// OnManager runs call against the service S of the manager of user's
// bucket: local when that is self (a function call), on(node) otherwise,
// looking the manager up again in userMap for each try. It tries again
// when the callee was not the manager or not live (nothing was done), and,
// for an Idempotent call, when the call was lost with its node.
func OnManager[S, T any](ctx context.Context, userMap func() UserMap, self NodeID, user string,
	local S, on func(NodeID) S, repeat Repeat, call func(context.Context, S) (T, error)) (T, error) {
	var out T
	err := retry.Do(ctx, ManagerRetry, func(err error) bool { return managerRetryable(err, repeat) },
		func(ctx context.Context) error {
			um := userMap()
			svc := local
			mgr := um.Manager(user)
			if mgr == "" {
				// The user's island has no live member (or the map is
				// not made yet): nothing to call, and no other island
				// may stand in.
				return fmt.Errorf("user %s: %w", user, ErrNoIslandMember)
			}
			if mgr != self {
				svc = on(mgr)
			}
			var err error
			out, err = call(ctx, svc)
			return err
		})
	return out, err
}

// managerRetryable says whether OnManager tries a call again after err.
func managerRetryable(err error, repeat Repeat) bool {
	switch {
	case errors.Is(err, rpc.ErrNotManager), errors.Is(err, ErrNotLive), errors.Is(err, ErrNoIslandMember):
		return true
	case errors.Is(err, rpc.ErrNodeGone):
		// Only a call this node cut short: an ErrUnavailable the callee
		// answered (a node it could not reach) says nothing about the
		// manager, and a connection that broke under a call may come
		// back; a call waiting for it ends as ErrNodeGone.
		return bool(repeat)
	}
	return false
}

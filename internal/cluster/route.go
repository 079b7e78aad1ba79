package cluster

import (
	"context"
	"errors"
	"time"

	"github.com/quillmail/quill/internal/retry"
	"github.com/quillmail/quill/internal/rpc"
)

// ManagerRetry is how a call to a user's manager is tried again while two
// nodes briefly disagree on the user map (the callee answers "not the
// manager"): about a second in all, longer than a membership change takes
// to reach every node on a LAN.
var ManagerRetry = retry.Policy{Attempts: 5, Base: 200 * time.Millisecond, Factor: 1}

// OnManager runs call against the service S of the manager of user's
// bucket: local when that is self (a function call), on(node) otherwise,
// looking the manager up again in userMap for each try.
func OnManager[S, T any](ctx context.Context, userMap func() UserMap, self NodeID, user string,
	local S, on func(NodeID) S, call func(context.Context, S) (T, error)) (T, error) {
	var out T
	err := retry.Do(ctx, ManagerRetry, func(err error) bool { return errors.Is(err, rpc.ErrNotManager) },
		func(ctx context.Context) error {
			um := userMap()
			svc := local
			if mgr := um.Manager(user); mgr != self {
				svc = on(mgr)
			}
			var err error
			out, err = call(ctx, svc)
			return err
		})
	return out, err
}

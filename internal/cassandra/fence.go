package cassandra

// The UID and MODSEQ reservations of a mailbox, fenced (BLUEPRINT
// invariant 5: a UID never names two messages). The native writer keeps
// the ends of the blocks it reserved in the user's profile
// (userdb.MailboxDef.UIDReserved and ModSeqReserved): it hands out UIDs
// only below a reservation it wrote, and a writer that takes over starts
// at the reserved ends, past anything the old one may have handed out.
// Here the ends live in a row of their own per mailbox, with the writer
// that holds them (owner) and a fencing token (epoch), and every change of
// the row is a lightweight transaction (Paxos among the row's replicas):
//
//   - Claim takes the row over: epoch+1, conditional on the epoch and the
//     ends it read, so the new writer starts past every block a previous
//     writer reserved, including one reserved a moment before the claim.
//   - Reserve moves the ends, conditional on the writer's epoch: a writer
//     whose fence was taken over (another node claimed since) is refused
//     with ErrFenced and never gets a block the new writer may also use.
//   - Release gives the unused rest of a block back at a clean shutdown,
//     under the same condition.
//
// A stale writer can still hand out what is left of the block it holds
// until its next Reserve is refused; those UIDs are below the new writer's
// start, so none is handed out twice. (That a session may see them arrive
// late is the ordering question of issue 15 item 3, for the writer that
// uses this.)

import (
	"context"
	"errors"
	"fmt"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
	"github.com/quillmail/quill/internal/retry"
	"github.com/quillmail/quill/internal/userdb"
)

// ErrFenced says another writer claimed a mailbox's reservations after
// this one: it must stop handing out UIDs and MODSEQs beyond what it holds.
var ErrFenced = errors.New("reservations claimed by another writer")

// claimRetry paces the claims that lose a race to another claim or to a
// reservation of the previous owner: each loser reads again and retries.
var claimRetry = retry.Policy{Attempts: 20, Base: 10 * time.Millisecond, Max: 500 * time.Millisecond, Factor: 2}

// endsRetry: a conditional update of the ends whose outcome is unknown (a
// timeout: "CAS operation timed out", seen in the end-to-end suite on two
// cores that five test runs kept busy, where one failed a delivery) is
// made again. It sets the same ends under the same epoch, so one that
// applied after all applies again unchanged, and one the epoch no longer
// allows is refused as any stale update is (ErrFenced).
var endsRetry = retry.Policy{Attempts: 3, Base: 50 * time.Millisecond, Max: 500 * time.Millisecond, Factor: 4}

// Fence is a writer's hold on a mailbox's reservations.
type Fence struct {
	User        string
	UIDValidity uint32
	// Owner names the writer (unique per writer instance: node, boot,
	// tenure) and Epoch is the fencing token its claim got.
	Owner string
	Epoch int64
	// UIDReserved ends the reserved UIDs (every UID handed out is below
	// it) and ModSeqReserved the reserved MODSEQs (every MODSEQ handed out
	// is at most it): the contract of userdb.MailboxDef's fields.
	UIDReserved    uint32
	ModSeqReserved uint64
}

// Into copies the reserved ends into a mailbox definition, so a writer
// starts its counters from them as from the profile's.
func (f Fence) Into(def *userdb.MailboxDef) {
	def.UIDReserved, def.ModSeqReserved = f.UIDReserved, f.ModSeqReserved
}

func (f Fence) what() string {
	return fmt.Sprintf("user %s mailbox %d", f.User, f.UIDValidity)
}

// fenceRow reads a fence from a conditional update's or a read's columns.
func fenceRow(user string, v uint32, m map[string]any) Fence {
	f := Fence{User: user, UIDValidity: v}
	f.Owner, _ = m["owner"].(string)
	f.Epoch, _ = m["epoch"].(int64)
	u, _ := m["uid_reserved"].(int64)
	ms, _ := m["modseq_reserved"].(int64)
	f.UIDReserved, f.ModSeqReserved = uint32(u), uint64(ms)
	return f
}

// Reservations reads a mailbox's reservations at SERIAL (what the
// conditional updates decided, one in flight included). A mailbox nobody
// reserved for yet has a zero Epoch.
func (st *Store) Reservations(ctx context.Context, user string, v uint32) (Fence, error) {
	user = userdb.Normalize(user)
	m := map[string]any{}
	err := st.serialRead(ctx, `SELECT owner, epoch, uid_reserved, modseq_reserved FROM reservations WHERE user = ? AND uidvalidity = ?`,
		user, int64(v)).MapScan(m)
	if notFound(err) {
		return Fence{User: user, UIDValidity: v}, nil
	}
	if err != nil {
		return Fence{}, fmt.Errorf("user %s mailbox %d: read reservations: %w", user, v, err)
	}
	return fenceRow(user, v, m), nil
}

// reservedEnd reads the UID end at the read consistency level: a bound on
// the UIDs in the index, cheaper than a SERIAL read.
func (st *Store) reservedEnd(ctx context.Context, user string, v uint32) (uint32, error) {
	var end int64
	err := st.read(ctx, `SELECT uid_reserved FROM reservations WHERE user = ? AND uidvalidity = ?`, user, int64(v)).Scan(&end)
	if notFound(err) {
		return 0, nil
	}
	if err != nil {
		return 0, fmt.Errorf("user %s mailbox %d: read reservations: %w", user, v, err)
	}
	return uint32(end), nil
}

// Holder reads who holds a mailbox's reservations (owner and epoch) at the
// read consistency level: at QUORUM it sees every claim that completed, at
// far less than a SERIAL read's cost.
func (st *Store) Holder(ctx context.Context, user string, v uint32) (owner string, epoch int64, err error) {
	user = userdb.Normalize(user)
	err = st.read(ctx, `SELECT owner, epoch FROM reservations WHERE user = ? AND uidvalidity = ?`, user, int64(v)).Scan(&owner, &epoch)
	if notFound(err) {
		return "", 0, nil
	}
	if err != nil {
		return "", 0, fmt.Errorf("user %s mailbox %d: read reservations: %w", user, v, err)
	}
	return owner, epoch, nil
}

// unknownOutcome reports whether a conditional update timed out without
// saying whether it applied: it may yet.
func unknownOutcome(err error) bool {
	var wt *gocql.RequestErrWriteTimeout
	var cu *gocql.RequestErrCASWriteUnknown
	return errors.As(err, &wt) || errors.As(err, &cu)
}

// Claim makes owner the writer of a mailbox's reservations, taking them
// over from whoever held them, and returns its fence: the new writer starts
// at the reserved ends. Two claims at once both succeed in turn; the later
// one fences the earlier.
func (st *Store) Claim(ctx context.Context, user string, v uint32, owner string) (Fence, error) {
	user = userdb.Normalize(user)
	if owner == "" {
		return Fence{}, fmt.Errorf("user %s mailbox %d: claim without an owner", user, v)
	}
	var pending int64 // the epoch of a claim whose outcome is unknown
	for n := 0; ; n++ {
		cur, err := st.Reservations(ctx, user, v)
		if err != nil && !Retryable(err) {
			return Fence{}, err
		}
		if err == nil && pending != 0 && cur.Owner == owner && cur.Epoch == pending {
			return cur, nil // the claim that timed out did apply
		}
		if err == nil {
			err = st.claimOnce(ctx, user, v, owner, cur)
			if err == nil {
				cur.Owner, cur.Epoch = owner, cur.Epoch+1
				return cur, nil
			}
			if unknownOutcome(err) {
				pending = cur.Epoch + 1
			} else if !errors.Is(err, errLostRace) && !Retryable(err) {
				return Fence{}, fmt.Errorf("user %s mailbox %d: claim reservations: %w", user, v, err)
			}
		}
		if claimRetry.Attempts > 0 && n+1 >= claimRetry.Attempts {
			return Fence{}, fmt.Errorf("user %s mailbox %d: claim reservations: %d tries: %w", user, v, n+1, err)
		}
		if !retry.Sleep(ctx, claimRetry.Wait(n)) {
			return Fence{}, ctx.Err()
		}
	}
}

// errLostRace says a claim's condition failed: another claim or a
// reservation came between its read and its update.
var errLostRace = errors.New("lost a race with another claim or reservation")

// claimOnce is one conditional claim over the row as read (cur).
func (st *Store) claimOnce(ctx context.Context, user string, v uint32, owner string, cur Fence) error {
	var q *gocql.Query
	if cur.Epoch == 0 {
		q = st.cas(ctx, `INSERT INTO reservations (user, uidvalidity, owner, epoch, uid_reserved, modseq_reserved, claimed)
			VALUES (?, ?, ?, 1, 0, 0, ?) IF NOT EXISTS`, user, int64(v), owner, time.Now())
	} else {
		q = st.cas(ctx, `UPDATE reservations SET owner = ?, epoch = ?, claimed = ? WHERE user = ? AND uidvalidity = ?
			IF epoch = ? AND uid_reserved = ? AND modseq_reserved = ?`, owner, cur.Epoch+1, time.Now(), user, int64(v),
			cur.Epoch, int64(cur.UIDReserved), int64(cur.ModSeqReserved))
	}
	applied, err := q.MapScanCASContext(ctx, map[string]any{})
	if err != nil {
		return err
	}
	if !applied {
		return errLostRace
	}
	return nil
}

// setEnds writes new reserved ends under the fence's epoch.
func (st *Store) setEnds(ctx context.Context, f Fence, uidEnd uint32, modEnd uint64, verb string) (Fence, error) {
	var cur map[string]any
	var applied bool
	err := retry.Do(ctx, endsRetry, Retryable, func(ctx context.Context) error {
		var err error
		cur = map[string]any{}
		applied, err = st.cas(ctx, `UPDATE reservations SET uid_reserved = ?, modseq_reserved = ? WHERE user = ? AND uidvalidity = ?
			IF epoch = ?`, int64(uidEnd), int64(modEnd), f.User, int64(f.UIDValidity), f.Epoch).MapScanCASContext(ctx, cur)
		return err
	})
	if err != nil {
		// Unknown or failed: the caller must not use the new ends. If the
		// update applies after all, the ends only cover more than what
		// was handed out, which wastes UIDs and never repeats one.
		return f, fmt.Errorf("%s: %s: %w", f.what(), verb, err)
	}
	if !applied {
		now := fenceRow(f.User, f.UIDValidity, cur)
		if len(cur) == 0 {
			return f, fmt.Errorf("%s: %s: %w (the reservations were deleted)", f.what(), verb, ErrFenced)
		}
		return f, fmt.Errorf("%s: %s: %w (%s, epoch %d; this writer's is %d)", f.what(), verb, ErrFenced, now.Owner, now.Epoch, f.Epoch)
	}
	f.UIDReserved, f.ModSeqReserved = uidEnd, modEnd
	return f, nil
}

// Reserve moves the reserved ends to uidEnd and modEnd (the writer's
// planReserve decides them: past what it needs, by a block), if this
// writer's fence still holds; ErrFenced if another writer claimed since.
// Only once it returns may the writer hand out what the new ends cover.
func (st *Store) Reserve(ctx context.Context, f Fence, uidEnd uint32, modEnd uint64) (Fence, error) {
	if uidEnd < f.UIDReserved || modEnd < f.ModSeqReserved {
		return f, fmt.Errorf("%s: reserve to UID %d, MODSEQ %d: below the reserved ends %d, %d", f.what(),
			uidEnd, modEnd, f.UIDReserved, f.ModSeqReserved)
	}
	return st.setEnds(ctx, f, uidEnd, modEnd, "reserve")
}

// Release gives back the unused rest of the writer's reservation at a
// clean shutdown: the ends become uidNext (the next UID it would have
// handed out) and modseq (the highest MODSEQ it handed out), so the next
// writer continues there instead of past the block.
func (st *Store) Release(ctx context.Context, f Fence, uidNext uint32, modseq uint64) (Fence, error) {
	if uidNext > f.UIDReserved || modseq > f.ModSeqReserved {
		return f, fmt.Errorf("%s: release to UID %d, MODSEQ %d: past the reserved ends %d, %d", f.what(),
			uidNext, modseq, f.UIDReserved, f.ModSeqReserved)
	}
	return st.setEnds(ctx, f, uidNext, modseq, "release")
}

package sns

import (
	"context"
	"math"
	"net"

	"github.com/emersion/go-msgauth/authres"
	"github.com/quillmail/quill/internal/mailauth"
	"github.com/quillmail/quill/internal/nodepb"
)

// FilterClass is the class of the workers that check inbound mail: SPF,
// DKIM and DMARC (internal/mailauth) and, when configured, a spam score
// from rspamd. DNS lookups and a spam scanner are the parts of receiving
// mail that stall or misbehave on their own; in a worker they do it
// outside the node (SNS §2: fault isolation by process).
const FilterClass = "filter"

// Filter makes a pool of filter workers the SMTP server's origin checker
// (smtp.OriginChecker). When no worker can be had in time, the node
// checks the message itself (Fallback): a message is never held up, nor
// let in unchecked, for want of a worker.
type Filter struct {
	Pool     *Pool
	Fallback *mailauth.Checker
}

// Check runs the checks on a filter worker chosen by lottery.
func (f Filter) Check(ctx context.Context, ip net.IP, helo, mailFrom string, rcpts []string, msg []byte) mailauth.Verdict {
	v, err := f.onWorker(ctx, &nodepb.FilterTask{Ip: ip, Helo: helo, MailFrom: mailFrom, Rcpts: rcpts, Message: msg})
	if err == nil {
		return v
	}
	f.Pool.cfg.Log.Warn("sns: no filter worker answered; the node checks the message itself", "err", err)
	return f.Fallback.Check(ctx, ip, helo, mailFrom, rcpts, msg)
}

func (f Filter) onWorker(ctx context.Context, t *nodepb.FilterTask) (mailauth.Verdict, error) {
	_, c, err := f.Pool.acquire(ctx)
	if err != nil {
		return mailauth.Verdict{}, err
	}
	rep, err := c.Filter(ctx, t)
	if err != nil {
		return mailauth.Verdict{}, err
	}
	return verdictOf(rep), nil
}

// verdictPB and verdictOf carry a verdict over the worker's socket.
func verdictPB(v mailauth.Verdict) *nodepb.FilterVerdict {
	return &nodepb.FilterVerdict{Header: v.Header, Reject: v.Reject, Quarantine: v.Quarantine, Domain: v.Domain,
		Spam: v.Spam, Defer: v.Defer, Score: v.Score,
		ArcValue: string(v.ARC.Value), ArcSets: int32(min(v.ARC.Sets, math.MaxInt32)), ArcLatestFailed: v.ARC.LatestFailed, ArcSealer: v.ARC.Sealer}
}

func verdictOf(rep *nodepb.FilterVerdict) mailauth.Verdict {
	return mailauth.Verdict{Header: rep.Header, Reject: rep.Reject, Quarantine: rep.Quarantine, Domain: rep.Domain,
		Spam: rep.Spam, Defer: rep.Defer, Score: rep.Score,
		ARC: mailauth.ARCResult{Value: authres.ResultValue(rep.ArcValue), Sets: int(rep.ArcSets), LatestFailed: rep.ArcLatestFailed,
			Sealer: rep.ArcSealer}}
}

package telemetry

// The Telemetry service on the wire (proto/quill/v1/telemetry.proto).

import (
	"context"
	"time"

	"github.com/quillmail/quill/internal/nodepb"
	"google.golang.org/grpc"
)

// Register exposes this node's reports to the other nodes.
func (r *Reporter) Register(reg grpc.ServiceRegistrar) {
	nodepb.RegisterTelemetryServer(reg, server{r: r})
}

type server struct {
	nodepb.UnimplementedTelemetryServer
	r *Reporter
}

func (s server) Report(ctx context.Context, _ *nodepb.Empty) (*nodepb.NodeReport, error) {
	return s.r.Report(time.Now()).ToPB(), nil
}

// Ask returns the report of the node behind cc.
func Ask(ctx context.Context, cc grpc.ClientConnInterface) (Report, error) {
	p, err := nodepb.NewTelemetryClient(cc).Report(ctx, &nodepb.Empty{})
	if err != nil {
		return Report{}, err
	}
	return FromPB(p), nil
}

func unix(t time.Time) int64 {
	if t.IsZero() {
		return 0
	}
	return t.Unix()
}

func fromUnix(s int64) time.Time {
	if s == 0 {
		return time.Time{}
	}
	return time.Unix(s, 0)
}

// ToPB converts a report for the wire.
func (r Report) ToPB() *nodepb.NodeReport {
	p := &nodepb.NodeReport{
		Node: r.Node, Hostname: r.Hostname, Island: r.Island, Boot: r.Boot,
		StartedUnix: unix(r.Started), AtUnixMs: r.At.UnixMilli(),
		Messages: r.Messages, MessageBytes: r.MessageBytes, Queued: r.Queued, Objects: r.Objects,
		UnderReplicated: r.UnderReplicated, Rehomed: r.Rehomed, LastRepairUnix: unix(r.LastRepair),
		DiskFree: r.DiskFree, DiskTotal: r.DiskTotal, DiskFull: r.DiskFull,
		Rebalancing: r.Rebalancing, RebalanceSurplus: r.RebalanceSurplus, RebalanceMoved: r.RebalanceMoved,
		Pending: int32(r.Pending), LoadAverage: r.LoadAverage,
		LogPending: int32(r.LogPending), LogWaiting: int32(r.LogWaiting), LogDone: int32(r.LogDone),
		BucketsManaged: int32(r.BucketsManaged), BucketsReady: int32(r.BucketsReady),
		Connections: int32(r.Connections), HeapBytes: r.HeapBytes, Users: int32(r.Users),
		SeriesStartUnix: unix(r.SeriesStart),
		Deliveries:      r.Deliveries, Logins: r.Logins, LoginFailures: r.LoginFailures, Errors: r.Errors,
	}
	for _, w := range r.Workers {
		p.Workers = append(p.Workers, &nodepb.WorkerPool{Class: w.Class, Workers: int32(w.Workers), Max: int32(w.Max), Load: int32(w.Load)})
	}
	return p
}

// FromPB converts a report from the wire.
func FromPB(p *nodepb.NodeReport) Report {
	r := Report{
		Node: p.Node, Hostname: p.Hostname, Island: p.Island, Boot: p.Boot,
		Started: fromUnix(p.StartedUnix), At: time.UnixMilli(p.AtUnixMs),
		Messages: p.Messages, MessageBytes: p.MessageBytes, Queued: p.Queued, Objects: p.Objects,
		UnderReplicated: p.UnderReplicated, Rehomed: p.Rehomed, LastRepair: fromUnix(p.LastRepairUnix),
		DiskFree: p.DiskFree, DiskTotal: p.DiskTotal, DiskFull: p.DiskFull,
		Rebalancing: p.Rebalancing, RebalanceSurplus: p.RebalanceSurplus, RebalanceMoved: p.RebalanceMoved,
		Pending: int(p.Pending), LoadAverage: p.LoadAverage,
		LogPending: int(p.LogPending), LogWaiting: int(p.LogWaiting), LogDone: int(p.LogDone),
		BucketsManaged: int(p.BucketsManaged), BucketsReady: int(p.BucketsReady),
		Connections: int(p.Connections), HeapBytes: p.HeapBytes, Users: int(p.Users),
		SeriesStart: fromUnix(p.SeriesStartUnix),
		Deliveries:  p.Deliveries, Logins: p.Logins, LoginFailures: p.LoginFailures, Errors: p.Errors,
	}
	for _, w := range p.Workers {
		r.Workers = append(r.Workers, WorkerPool{Class: w.Class, Workers: int(w.Workers), Max: int(w.Max), Load: int(w.Load)})
	}
	return r
}

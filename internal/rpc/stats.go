package rpc

import (
	"context"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/quillmail/quill/internal/metrics"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// The RPC layer's own counters, per method and side: calls (by outcome),
// payload bytes sent and received (gRPC framing included, HTTP/2 headers
// not), the callers' latency and the callees' handling time (the difference
// is the network and the queues on the way). They are what "bytes on the
// wire per delivered message" is measured from (docs/benchmarks.md).
var (
	rpcCalls = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_rpc_calls_total", Help: "Node-to-node calls, by method, side (client or server) and gRPC status code."},
		[]string{"method", "side", "code"})
	rpcSent = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_rpc_sent_bytes_total", Help: "Payload bytes of node-to-node calls sent (with gRPC framing), by method and side."},
		[]string{"method", "side"})
	rpcReceived = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_rpc_received_bytes_total", Help: "Payload bytes of node-to-node calls received (with gRPC framing), by method and side."},
		[]string{"method", "side"})
	rpcSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "quill_rpc_client_seconds", Help: "Time from sending a node-to-node call to its answer, by method.",
		Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16)}, []string{"method"})
	rpcServerSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "quill_rpc_server_seconds", Help: "Time a node took to handle a node-to-node call, from its arrival to the answer, by method.",
		Buckets: prometheus.ExponentialBuckets(0.0002, 2, 16)}, []string{"method"})
)

func init() {
	metrics.Registry.MustRegister(rpcCalls, rpcSent, rpcReceived, rpcSeconds, rpcServerSeconds)
}

// statsHandler counts every call on one side.
type statsHandler struct{ side string }

type methodKey struct{}

func (h statsHandler) TagRPC(ctx context.Context, info *stats.RPCTagInfo) context.Context {
	return context.WithValue(ctx, methodKey{}, shortMethod(info.FullMethodName))
}

func (h statsHandler) HandleRPC(ctx context.Context, s stats.RPCStats) {
	m, _ := ctx.Value(methodKey{}).(string)
	switch s := s.(type) {
	case *stats.InPayload:
		rpcReceived.WithLabelValues(m, h.side).Add(float64(s.WireLength))
	case *stats.OutPayload:
		rpcSent.WithLabelValues(m, h.side).Add(float64(s.WireLength))
	case *stats.End:
		rpcCalls.WithLabelValues(m, h.side, status.Code(s.Error).String()).Inc()
		took := s.EndTime.Sub(s.BeginTime).Seconds()
		if h.side == "client" {
			rpcSeconds.WithLabelValues(m).Observe(took)
		} else {
			rpcServerSeconds.WithLabelValues(m).Observe(took)
		}
	}
}

func (statsHandler) TagConn(ctx context.Context, _ *stats.ConnTagInfo) context.Context { return ctx }
func (statsHandler) HandleConn(context.Context, stats.ConnStats)                       {}

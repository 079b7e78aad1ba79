// Package metrics holds the node's Prometheus metrics, in one place so every
// manager and proxy counts the same way and the admin API exports them.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
)

var (
	// Registry is the node's own registry (not the global default), so
	// tests that start several nodes in one process do not collide.
	Registry = prometheus.NewRegistry()

	Delivered = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_messages_delivered_total", Help: "Messages stored for a recipient (one per recipient)."})
	DeliveryFailures = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_delivery_failures_total", Help: "DATA commands answered with a 4xx because storage failed."})
	DeliverySeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "quill_delivery_seconds", Help: "Time from end of DATA to durable storage.",
		Buckets: prometheus.ExponentialBuckets(0.0005, 2, 14)})
	Sessions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_sessions_total", Help: "Protocol sessions accepted."}, []string{"protocol"})
	AuthFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_auth_failures_total", Help: "Failed logins."}, []string{"protocol"})
	// Stalls counts the times the process stood still long enough for its
	// soft state to be rebuilt (core.watchStalls).
	Stalls = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_stalls_total", Help: "Times the process stood still (paused) and rebuilt its soft state."})
	// AuditRepairs counts what the writers' anti-entropy audit found
	// wrong and repaired; every one is a missed trigger elsewhere.
	AuditRepairs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_audit_repairs_total", Help: "Differences the anti-entropy audit found between writers' views or mail maps and the fragments, and repaired."},
		[]string{"kind"})
	// Handoffs counts buckets handed to a new manager, by outcome.
	Handoffs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_bucket_handoffs_total", Help: "Buckets handed over to their new manager, by outcome at the receiver (merged, rebuilt) or sender (given_up)."},
		[]string{"outcome"})
	// Queued counts messages put into the outbound queue (DSNs too);
	// Outbound counts delivery attempts per recipient by outcome;
	// QueueEntries is the entries this node holds a replica of.
	Queued = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_queue_added_total", Help: "Messages put into the outbound queue (submissions for other domains and DSNs)."})
	Outbound = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_queue_attempts_total", Help: "Outbound delivery attempts per recipient, by outcome (delivered, deferred, failed)."},
		[]string{"outcome"})
	QueueEntries = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quill_queue_entries", Help: "Outbound queue entries this node holds a replica of."})
	// TextExcluded counts the messages this node's text index ruled out
	// of searches (asked by any node's IMAP session): what a search did
	// not have to read.
	TextExcluded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_text_index_excluded_total", Help: "Messages this node's text index ruled out of SEARCH and SORT, for sessions on any node."})
	// TextSure counts the (message, string key) pairs this node's text
	// index proved to match, which a search then did not read for it.
	TextSure = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_text_index_sure_total", Help: "Message and search key pairs this node's text index proved to match without reading the message, for sessions on any node."})
)

// Total is the sum of a counter's or gauge's values over all its labels:
// what the console's rates read.
func Total(c prometheus.Collector) float64 {
	ch := make(chan prometheus.Metric, 16)
	go func() { c.Collect(ch); close(ch) }()
	sum := 0.0
	for m := range ch {
		var d dto.Metric
		if m.Write(&d) != nil {
			continue
		}
		switch {
		case d.Counter != nil:
			sum += d.Counter.GetValue()
		case d.Gauge != nil:
			sum += d.Gauge.GetValue()
		}
	}
	return sum
}

func init() {
	Registry.MustRegister(Delivered, DeliveryFailures, DeliverySeconds, Sessions, AuthFailures, Stalls, AuditRepairs, Handoffs,
		Queued, Outbound, QueueEntries, TextExcluded, TextSure,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
}

// Package metrics holds the node's Prometheus metrics, in one place so every
// manager and proxy counts the same way and the admin API exports them
// (GET /metrics; docs/metrics.md lists every family).
//
// Two kinds live here. Counters and histograms of events (deliveries,
// commands, logins, refusals, repairs) are package variables that the code
// where the event happens increments; they count for the whole process.
// Gauges of a node's state (members, buckets, update log, disk, Pebble,
// workers) are read when Prometheus scrapes (node.go): a node adds its
// sources with AddNode, and every such series carries its node id.
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
	// Sessions counts SMTP connections (protocol smtp for the port of
	// other servers, submission for the submission and submissions
	// ports) and POP3 and IMAP logins.
	Sessions = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_sessions_total", Help: "Protocol sessions accepted: SMTP connections, POP3 and IMAP logins."}, []string{"protocol"})
	// AuthFailures counts logins refused for wrong credentials; Logins
	// has every outcome.
	AuthFailures = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_auth_failures_total", Help: "Logins refused for wrong credentials (unknown user, wrong password or proof)."}, []string{"protocol"})
	// Stalls counts the times the process stood still long enough for its
	// soft state to be rebuilt (core.watchStalls).
	Stalls = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_stalls_total", Help: "Times the process stood still (paused) and rebuilt its soft state."})
	// AuditRepairs counts what the writers' anti-entropy audit found
	// wrong and repaired; every one is a missed trigger elsewhere.
	AuditRepairs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_audit_repairs_total", Help: "Differences the anti-entropy audit found between writers' views or mail maps and the fragments, and repaired."},
		[]string{"kind"})
	// MailMapLeaves counts nodes taken out of a user's mail map because
	// their fragment of the user emptied (writer/vacate.go).
	MailMapLeaves = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_mail_map_leaves_total", Help: "Nodes taken out of a user's mail map because they no longer hold any of the user's mail."})
	// Handoffs counts buckets handed to a new manager, by outcome.
	Handoffs = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_bucket_handoffs_total", Help: "Buckets handed over to their new manager, by outcome at the receiver (merged, rebuilt) or sender (given_up)."},
		[]string{"outcome"})
	// RedoAppends counts entries appended to the writers' REDO log, by
	// where (primary: this node's writers logged them; secondary: another
	// node's writers logged them here); RedoFsyncs the fsync'd commits
	// that stored them; RedoReplayed the entries a new primary replayed,
	// and RedoRecoverySeconds how long each recovery with something to
	// replay took (writer/redolog.go, Neptune §3–4).
	RedoAppends = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_redo_appends_total", Help: "Entries appended to the mailbox writers' REDO log, by where (primary, secondary)."},
		[]string{"where"})
	RedoFsyncs = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_redo_fsyncs_total", Help: "Fsync'd commits of REDO log entries (the primary's own and those appended here as secondary)."})
	RedoReplayed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_redo_replayed_total", Help: "REDO log entries a new primary replayed before serving a bucket."})
	RedoRecoverySeconds = prometheus.NewHistogram(prometheus.HistogramOpts{
		Name: "quill_redo_recovery_seconds", Help: "Time from taking a bucket to serving it, for recoveries that replayed REDO log entries.",
		Buckets: prometheus.ExponentialBuckets(0.005, 2, 14)})
	// Queued counts messages put into the outbound queue (DSNs too);
	// Outbound counts delivery attempts per recipient by outcome;
	// QueueEntries is the entries this node holds a replica of.
	Queued = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_queue_added_total", Help: "Messages put into the outbound queue (submissions for other domains and DSNs)."})
	Outbound = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_queue_attempts_total", Help: "Outbound delivery attempts per recipient, by outcome (delivered, deferred, failed)."},
		[]string{"outcome"})
	QueueEntries = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quill_queue_entries", Help: "Outbound queue entries this node holds a replica of (on Cassandra: those it runs)."})
	// TextExcluded counts the messages this node's text index ruled out
	// of searches (asked by any node's IMAP session): what a search did
	// not have to read.
	TextExcluded = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_text_index_excluded_total", Help: "Messages this node's text index ruled out of SEARCH and SORT, for sessions on any node."})
	// TextIndexed counts the messages this node's text index read and
	// wrote a document for (issue 16: mail deleted within
	// --text-index-delay never is).
	TextIndexed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_text_index_indexed_total", Help: "Messages this node's text index read and indexed."})
	// TextSure counts the (message, string key) pairs this node's text
	// index proved to match, which a search then did not read for it.
	TextSure = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_text_index_sure_total", Help: "Message and search key pairs this node's text index proved to match without reading the message, for sessions on any node."})

	// Commands counts client commands by protocol (smtp, submission,
	// pop3, imap), command (the protocol's verb, UNKNOWN for one it does
	// not know) and result: the reply class for SMTP (2xx, 4xx, 5xx, or
	// error when no reply could be given), ok or err for POP3, ok, no or
	// bad for IMAP.
	Commands = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_commands_total", Help: "Client commands by protocol, command and result (SMTP reply class; POP3 ok or err; IMAP ok, no or bad)."},
		[]string{"protocol", "command", "result"})
	// Refusals counts SMTP MAIL, RCPT and DATA answered 4xx or 5xx, by
	// the reason the server refused them (one of the Reason* values).
	Refusals = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_smtp_refusals_total", Help: "SMTP MAIL, RCPT and DATA commands refused (4xx or 5xx), by protocol, stage and reason."},
		[]string{"protocol", "stage", "reason"})
	// Logins counts the end of every login (IMAP LOGIN and AUTHENTICATE,
	// POP3 PASS and AUTH, SMTP AUTH) by result: ok, failed (wrong
	// credentials), locked_out (the address failed too often), or
	// unavailable (the user's manager could not be asked).
	Logins = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_logins_total", Help: "Logins by protocol and result (ok, failed, locked_out, unavailable)."},
		[]string{"protocol", "result"})
	// ConnectionsRefused counts client connections the guard closed at
	// once, by listener and limit reached (internal/guard).
	ConnectionsRefused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_connections_refused_total", Help: "Client connections refused by a connection limit, by listener and limit (total, per_address, rate_per_address)."},
		[]string{"listener", "limit"})
	// UserMapChanges counts the user maps this node adopted after a
	// membership change; BucketsMoved the buckets whose manager changed
	// in them (Porcupine §3.2).
	UserMapChanges = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_usermap_changes_total", Help: "User maps adopted after a membership change (new epochs)."})
	BucketsMoved = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_usermap_buckets_moved_total", Help: "Buckets whose manager changed, over every user map adopted."})
	// SoftStateRebuildSeconds is the time from a user map (or a stall, or
	// a handoff's reset) to the soft state of every bucket this node
	// manages being rebuilt from every live node's scan (outcome
	// complete), or released unfinished after the reconstruction's cap
	// (outcome timeout) (Porcupine §3.3).
	SoftStateRebuildSeconds = prometheus.NewHistogramVec(prometheus.HistogramOpts{
		Name: "quill_softstate_rebuild_seconds", Help: "Time from a user map change to the soft state of this node's buckets being rebuilt, by outcome (complete, timeout).",
		Buckets: prometheus.ExponentialBuckets(0.001, 2, 16)}, []string{"outcome"})
	// RepairRounds counts the replication manager's repair rounds (a scan
	// of what the node holds and the re-homing it planned);
	// RepairRehomed the objects given new replicas in them.
	RepairRounds = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_repair_rounds_total", Help: "Repair rounds: scans of the objects this node holds, with the re-homing they planned."})
	RepairRehomed = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_repair_rehomed_objects_total", Help: "Objects given new replicas by this node's repair rounds."})
	// RebalanceMoved and RebalanceMovedBytes count the messages (and their
	// bytes) this node's rebalancer handed to their writers to move to an
	// under-full node (internal/rebalance; a move the writer finds planned
	// on an old replica set is skipped there); RebalanceSurplus is what the
	// node holds above the live nodes' mean, from its last scan.
	RebalanceMoved = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_rebalance_moved_total", Help: "Messages this node's rebalancer handed to their writers to move to an under-full node."})
	RebalanceMovedBytes = prometheus.NewCounter(prometheus.CounterOpts{
		Name: "quill_rebalance_moved_bytes_total", Help: "Bytes of the messages this node's rebalancer handed to their writers to move."})
	RebalanceSurplus = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quill_rebalance_surplus_bytes", Help: "Message bytes this node holds above the live nodes' mean (0 at or below it), from its last scan."})
	// IslandEpoch is the epoch of the bucket→island table installed here
	// (0: no table, one island); IslandChanges counts the table changes
	// this node coordinated, by outcome (internal/islandmgr).
	IslandEpoch = prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "quill_island_table_epoch", Help: "Epoch of the bucket-to-island table installed on this node (0: no table, the cluster is one island)."})
	IslandChanges = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_island_changes_total", Help: "Island table changes this node coordinated, by outcome (committed, aborted)."}, []string{"outcome"})
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

// Reasons an SMTP command is refused (the reason label of Refusals): a
// small closed set, so a dashboard can name each.
const (
	ReasonUnknownUser  = "unknown_user"        // 5.1.1: no such user
	ReasonQuota        = "quota"               // 4.2.2: mailbox full
	ReasonSize         = "size"                // 5.3.4: over the size limit
	ReasonRelay        = "relay"               // 5.7.1: a domain not served here, and no relaying
	ReasonSender       = "sender"              // 5.7.1: a submission from an address not the user's
	ReasonAuthRequired = "auth_required"       // 5.7.0: submission without AUTH
	ReasonRateLimit    = "rate_limit"          // 4.7.1: the user's messages per hour
	ReasonRecipients   = "too_many_recipients" // 4.5.3: recipients per message
	ReasonSpam         = "spam"                // the spam filter refused or deferred it
	ReasonDMARC        = "dmarc"               // 5.7.1: the sender domain's DMARC policy
	ReasonLoop         = "loop"                // 5.4.6: too many Received headers
	ReasonContent      = "content"             // 5.6.x: a header or address the message may not have
	ReasonNoRecipients = "no_recipients"       // 5.5.1: DATA without a valid recipient
	ReasonStorage      = "storage"             // 4.3.x: storing or queueing failed, or no disk room
	ReasonUnavailable  = "unavailable"         // 4.3.0: the recipient's manager could not be asked
	ReasonOther        = "other"               // anything else (go-smtp's own replies)
)

// Login results (the result label of Logins).
const (
	LoginOK          = "ok"
	LoginFailed      = "failed"
	LoginLockedOut   = "locked_out"
	LoginUnavailable = "unavailable"
)

// Login counts the end of a login; a failed one is an AuthFailures too.
func Login(protocol, result string) {
	Logins.WithLabelValues(protocol, result).Inc()
	if result == LoginFailed {
		AuthFailures.WithLabelValues(protocol).Inc()
	}
}

// known are the label values of closed sets, reported at 0 from the start
// so a dashboard or an alert sees a series before its first event.
var known = []struct {
	vec    *prometheus.CounterVec
	values [][]string
}{
	{Sessions, [][]string{{"smtp"}, {"submission"}, {"pop3"}, {"imap"}}},
	{AuthFailures, [][]string{{"submission"}, {"pop3"}, {"imap"}}},
	{AuditRepairs, [][]string{{"alloc"}, {"mailmap"}, {"hidden"}, {"stale"}, {"phantom"}}},
	{Handoffs, [][]string{{"merged"}, {"rebuilt"}, {"given_up"}}},
	{Outbound, [][]string{{"delivered"}, {"deferred"}, {"failed"}}},
	{RedoAppends, [][]string{{"primary"}, {"secondary"}}},
}

func init() {
	for _, k := range known {
		for _, v := range k.values {
			k.vec.WithLabelValues(v...)
		}
	}
	for _, p := range []string{"submission", "pop3", "imap"} {
		for _, r := range []string{LoginOK, LoginFailed, LoginLockedOut, LoginUnavailable} {
			Logins.WithLabelValues(p, r)
		}
	}
	for _, o := range []string{"complete", "timeout"} {
		SoftStateRebuildSeconds.WithLabelValues(o)
	}
	for _, o := range []string{"committed", "aborted"} {
		IslandChanges.WithLabelValues(o)
	}
	Registry.MustRegister(Delivered, DeliveryFailures, DeliverySeconds, Sessions, AuthFailures, Stalls, AuditRepairs, Handoffs, MailMapLeaves,
		Queued, Outbound, QueueEntries, TextExcluded, TextIndexed, TextSure,
		Commands, Refusals, Logins, ConnectionsRefused, UserMapChanges, BucketsMoved, SoftStateRebuildSeconds,
		RepairRounds, RepairRehomed, RebalanceMoved, RebalanceMovedBytes, RebalanceSurplus, RedoAppends, RedoFsyncs, RedoReplayed, RedoRecoverySeconds, IslandEpoch, IslandChanges, nodes,
		prometheus.NewGoCollector(), prometheus.NewProcessCollector(prometheus.ProcessCollectorOpts{}))
}

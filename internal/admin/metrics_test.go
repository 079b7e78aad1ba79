package admin_test

import (
	"bytes"
	"context"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	gosmtp "github.com/emersion/go-smtp"
	"github.com/prometheus/client_golang/prometheus/testutil/promlint"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
	"github.com/quillmail/quill/internal/node"
)

// startNode starts a real node (a cluster of one) on loopback ports, with
// no SNS worker processes (they would run this test binary).
func startNode(t *testing.T) *node.Node {
	t.Helper()
	cfg := node.DefaultConfig()
	cfg.DataDir = t.TempDir()
	for _, a := range []*string{&cfg.SMTPAddr, &cfg.POP3Addr, &cfg.IMAPAddr, &cfg.HTTPAddr} {
		*a = "127.0.0.1:0"
	}
	cfg.SMTPSAddr, cfg.SubmissionAddr, cfg.IMAPSAddr, cfg.POP3SAddr = "", "", "", ""
	cfg.Hostname = "quill.test"
	cfg.CheckInbound = false
	cfg.RelayWorkers, cfg.FilterWorkers = 0, 0
	cfg.Logger = slog.New(slog.DiscardHandler)
	n, err := node.Start(cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { stopNode(t, n) })
	return n
}

// stopped are the nodes a test already shut down (Shutdown is once only).
var stopped = map[*node.Node]bool{}

func stopNode(t *testing.T, n *node.Node) {
	if stopped[n] {
		return
	}
	stopped[n] = true
	if err := n.Shutdown(context.Background()); err != nil {
		t.Error(err)
	}
}

// get calls the node's admin API with its token.
func get(t *testing.T, n *node.Node, method, path, body string) (int, []byte) {
	t.Helper()
	tok, err := os.ReadFile(filepath.Join(n.Opts.DataDir, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	req, _ := http.NewRequest(method, "http://"+n.Addr("http")+path, strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer "+strings.TrimSpace(string(tok)))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, b
}

// deliver sends one message to each of rcpts in its own transaction and
// returns the RCPT errors.
func deliver(t *testing.T, n *node.Node, rcpts ...string) []error {
	t.Helper()
	c, err := gosmtp.Dial(n.Addr("smtp"))
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if err := c.Hello("client.test"); err != nil {
		t.Fatal(err)
	}
	var errs []error
	for _, r := range rcpts {
		if err := c.Mail("sender@remote.test", nil); err != nil {
			t.Fatal(err)
		}
		if err := c.Rcpt(r, nil); err != nil {
			errs = append(errs, err)
			c.Reset()
			continue
		}
		w, err := c.Data()
		if err != nil {
			t.Fatal(err)
		}
		io.WriteString(w, "From: sender@remote.test\r\nSubject: metrics\r\n\r\nhello\r\n")
		if err := w.Close(); err != nil {
			t.Fatal(err)
		}
	}
	c.Quit()
	return errs
}

// scrape returns a node's /metrics as text and parsed.
func scrape(t *testing.T, n *node.Node) ([]byte, map[string]*dto.MetricFamily) {
	t.Helper()
	code, body := get(t, n, "GET", "/metrics", "")
	if code != http.StatusOK {
		t.Fatalf("GET /metrics: %d %s", code, body)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	mfs, err := p.TextToMetricFamilies(bytes.NewReader(body))
	if err != nil {
		t.Fatalf("/metrics does not parse: %v", err)
	}
	return body, mfs
}

// value sums a family's series whose labels include want.
func value(mf *dto.MetricFamily, want map[string]string) float64 {
	sum := 0.0
	if mf == nil {
		return 0
	}
	for _, m := range mf.Metric {
		labels := map[string]string{}
		for _, l := range m.Label {
			labels[l.GetName()] = l.GetValue()
		}
		match := true
		for k, v := range want {
			match = match && labels[k] == v
		}
		if !match {
			continue
		}
		switch {
		case m.Counter != nil:
			sum += m.Counter.GetValue()
		case m.Gauge != nil:
			sum += m.Gauge.GetValue()
		case m.Histogram != nil:
			sum += float64(m.Histogram.GetSampleCount())
		}
	}
	return sum
}

// nodesOf returns the node ids a family reports.
func nodesOf(mf *dto.MetricFamily) []string {
	var out []string
	for _, m := range mf.GetMetric() {
		for _, l := range m.Label {
			if l.GetName() == "node" && !slices.Contains(out, l.GetValue()) {
				out = append(out, l.GetValue())
			}
		}
	}
	slices.Sort(out)
	return out
}

// The families a node's /metrics has once it delivered a message and
// refused a recipient: events counted where they happen, and the node's
// state read at the scrape (docs/metrics.md).
var families = []string{
	"quill_messages_delivered_total", "quill_delivery_seconds", "quill_delivery_failures_total", "quill_sessions_total",
	"quill_commands_total", "quill_smtp_refusals_total", "quill_logins_total", "quill_auth_failures_total",
	"quill_connections_refused_total", "quill_usermap_changes_total", "quill_usermap_buckets_moved_total",
	"quill_softstate_rebuild_seconds", "quill_repair_rounds_total", "quill_repair_rehomed_objects_total",
	"quill_audit_repairs_total", "quill_bucket_handoffs_total", "quill_stalls_total",
	"quill_queue_added_total", "quill_queue_attempts_total", "quill_queue_entries",
	"quill_text_index_excluded_total", "quill_text_index_sure_total",
	"quill_node_info", "quill_node_boot_incarnation", "quill_members", "quill_usermap_epoch",
	"quill_buckets_managed", "quill_buckets_ready", "quill_replication_log_entries",
	"quill_repair_objects", "quill_repair_under_replicated_objects", // and quill_repair_last_timestamp_seconds after the first scan
	"quill_disk_free_bytes", "quill_disk_size_bytes", "quill_disk_min_free_bytes", "quill_disk_full", "quill_disk_critical",
	"quill_pending_disk_operations", "quill_connections_open",
	"quill_pebble_disk_usage_bytes", "quill_pebble_level_files", "quill_pebble_level_size_bytes",
	"quill_pebble_level_written_bytes_total", "quill_pebble_read_amplification", "quill_pebble_write_amplification",
	"quill_pebble_compactions_total", "quill_pebble_compaction_seconds_total", "quill_pebble_compactions_in_progress",
	"quill_pebble_compaction_debt_bytes", "quill_pebble_flushes_total", "quill_pebble_memtable_size_bytes",
	"quill_pebble_memtables", "quill_pebble_wal_files", "quill_pebble_wal_size_bytes", "quill_pebble_wal_written_bytes_total",
	"quill_pebble_block_cache_size_bytes", "quill_pebble_block_cache_hits_total", "quill_pebble_block_cache_misses_total",
	"quill_pebble_wal_fsync_seconds", "quill_gossip_bytes_total", "quill_gossip_messages_total",
}

// TestMetricsOfRunningNodes scrapes real nodes' /metrics: every family is
// there and lints clean (promlint: what `promtool check metrics` runs),
// the counters moved with what the node did, and two nodes in one process
// each report their own state under their own node id, a node shut down
// no longer.
func TestMetricsOfRunningNodes(t *testing.T) {
	a, b := startNode(t), startNode(t)
	if code, body := get(t, a, "POST", "/api/domains", `{"name":"example.org"}`); code != http.StatusCreated {
		t.Fatalf("add domain: %d %s", code, body)
	}
	if code, body := get(t, a, "POST", "/api/users", `{"address":"bob@example.org","password":"metrics pw"}`); code != http.StatusCreated {
		t.Fatalf("add user: %d %s", code, body)
	}
	_, before := scrape(t, a)
	if errs := deliver(t, a, "bob@example.org", "nobody@example.org"); len(errs) != 1 {
		t.Fatalf("RCPT errors %v, want one (nobody@)", errs)
	}
	text, mfs := scrape(t, a)

	for _, f := range families {
		if mfs[f] == nil {
			t.Errorf("family %s missing from /metrics", f)
		}
	}
	problems, err := promlint.New(bytes.NewReader(text)).Lint()
	if err != nil {
		t.Fatal(err)
	}
	for _, p := range problems {
		if strings.HasPrefix(p.Metric, "quill_") {
			t.Errorf("promlint: %s: %s", p.Metric, p.Text)
		}
	}

	moved := func(family string, labels map[string]string, by float64) {
		t.Helper()
		if d := value(mfs[family], labels) - value(before[family], labels); d != by {
			t.Errorf("%s%v moved by %v, want %v", family, labels, d, by)
		}
	}
	moved("quill_messages_delivered_total", nil, 1)
	moved("quill_delivery_seconds", nil, 1)
	moved("quill_sessions_total", map[string]string{"protocol": "smtp"}, 1)
	moved("quill_commands_total", map[string]string{"protocol": "smtp", "command": "MAIL", "result": "2xx"}, 2)
	moved("quill_commands_total", map[string]string{"protocol": "smtp", "command": "RCPT", "result": "2xx"}, 1)
	moved("quill_commands_total", map[string]string{"protocol": "smtp", "command": "RCPT", "result": "5xx"}, 1)
	moved("quill_commands_total", map[string]string{"protocol": "smtp", "command": "DATA", "result": "2xx"}, 1)
	moved("quill_smtp_refusals_total", map[string]string{"protocol": "smtp", "stage": "rcpt", "reason": "unknown_user"}, 1)
	if v := value(mfs["quill_pebble_wal_written_bytes_total"], map[string]string{"node": string(a.ID)}); v <= 0 {
		t.Errorf("quill_pebble_wal_written_bytes_total of %s is %v after a delivery", a.ID, v)
	}
	if v := value(mfs["quill_members"], map[string]string{"node": string(a.ID), "state": "alive"}); v != 1 {
		t.Errorf("quill_members{state=alive} of %s is %v, want 1 (itself)", a.ID, v)
	}
	if v := value(mfs["quill_buckets_managed"], map[string]string{"node": string(a.ID)}); v != 256 {
		t.Errorf("quill_buckets_managed of %s is %v, want 256 (a cluster of one)", a.ID, v)
	}

	both := []string{string(a.ID), string(b.ID)}
	slices.Sort(both)
	if got := nodesOf(mfs["quill_node_info"]); !slices.Equal(got, both) {
		t.Errorf("quill_node_info reports nodes %v, want %v", got, both)
	}
	stopNode(t, b)
	_, mfs = scrape(t, a)
	if got := nodesOf(mfs["quill_node_info"]); !slices.Equal(got, []string{string(a.ID)}) {
		t.Errorf("after %s shut down, quill_node_info reports nodes %v", b.ID, got)
	}
}

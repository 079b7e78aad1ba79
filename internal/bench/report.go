package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"strings"
	"time"
)

// Report is the outcome of a run. Rates are per second of wall time.
type Report struct {
	Mode     string `json:"mode"` // "fixed" or "probe"
	SMTPAddr string `json:"smtp_addr"`
	// Submission names the remote domain of the submission workload
	// ("" for the Porcupine workload).
	Submission string `json:"submission_to,omitempty"`
	POP3Addr   string `json:"pop3_addr"`
	IMAPAddr   string `json:"imap_addr,omitempty"`
	Users      int    `json:"users"`
	// Mix, POPMix and IMAPMix are the shares of the requests that are
	// SMTP, POP3 and IMAP sessions.
	Mix         float64 `json:"smtp_fraction"`
	POPMix      float64 `json:"pop_fraction"`
	IMAPMix     float64 `json:"imap_fraction"`
	Seed        uint64  `json:"seed"`
	DeadlineMS  float64 `json:"deadline_ms"`
	ElapsedS    float64 `json:"elapsed_s"`
	Interrupted bool    `json:"interrupted,omitempty"`
	// Concurrency is the number of workers of a fixed run, or that of the
	// best step of a probe.
	Concurrency int `json:"concurrency"`
	// RateCap is Config.Rate: the cap on requests started per second (0:
	// none, a closed loop).
	RateCap float64 `json:"rate_cap,omitempty"`

	// Headline figures: of the whole run when fixed, of the best step when
	// probing (the whole run's are in Total).
	MsgsPerSec float64 `json:"msgs_per_sec"`
	POPPerSec  float64 `json:"pop_sessions_per_sec"`
	IMAPPerSec float64 `json:"imap_sessions_per_sec"`

	Total Totals `json:"total"`

	Steps []StepReport `json:"steps,omitempty"`
	// Best is the index in Steps of the step with the highest delivery
	// rate among the complete steps that were not overloaded.
	Best int `json:"best_step"`

	SizeModel SizeModel `json:"size_model"`

	// CPU is the CPU use during the run (Linux only).
	CPU *CPUReport `json:"cpu,omitempty"`

	// StartUnixMS is when the run began; Series what finished in each of
	// its seconds.
	StartUnixMS int64    `json:"start_unix_ms"`
	Series      []Second `json:"series,omitempty"`
}

// TLSTotals are the handshakes of a run over TLS.
type TLSTotals struct {
	Full      int64          `json:"full_handshakes"`
	Resumed   int64          `json:"resumed_handshakes"`
	Handshake LatencySummary `json:"handshake_latency"`
}

// Totals are the counts of the whole run.
type Totals struct {
	Delivered    int64          `json:"delivered"`
	MsgsPerSec   float64        `json:"msgs_per_sec"`
	POPSessions  int64          `json:"pop_sessions"`
	POPPerSec    float64        `json:"pop_sessions_per_sec"`
	Retrieved    int64          `json:"messages_retrieved"`
	Requests     int64          `json:"requests"`
	SMTPLatency  LatencySummary `json:"smtp_latency"`
	POPLatency   LatencySummary `json:"pop_latency"`
	IMAPSessions int64          `json:"imap_sessions"`
	IMAPPerSec   float64        `json:"imap_sessions_per_sec"`
	IMAPLatency  LatencySummary `json:"imap_latency"`
	// IMAPSteps summarises each step of the successful IMAP sessions, by
	// step name (connect, login, select, fetch_headers, ...).
	IMAPSteps map[string]LatencySummary `json:"imap_step_latency,omitempty"`
	// IMAPListed is the mean number of messages the header FETCH of a
	// successful IMAP session listed; IMAPEmpty counts the sessions that
	// found an empty INBOX; IMAPBodies the full messages read.
	// TLS counts the handshakes of a --tls run: full ones, resumed ones
	// (a returning client with a session ticket), and their times.
	TLS          *TLSTotals       `json:"tls,omitempty"`
	IMAPListed   float64          `json:"imap_mean_messages_listed"`
	IMAPEmpty    int64            `json:"imap_empty_inbox"`
	IMAPBodies   int64            `json:"imap_bodies_fetched"`
	OverDeadline map[string]int64 `json:"over_deadline"` // successful but late, by protocol
	Errors       map[string]int64 `json:"errors"`        // by ErrKind
	// ErrorsByProtocol splits Errors by protocol ("smtp", "pop", "imap").
	ErrorsByProtocol map[string]map[string]int64 `json:"errors_by_protocol"`
	ErrorCount       int64                       `json:"error_count"`
	ErrorSamples     map[string]string           `json:"error_samples,omitempty"` // first error of each kind
	Aborted          int64                       `json:"aborted"`                 // cut off at the end of the run
	// Refused counts connections refused before another address of the
	// list answered (the session then went on there).
	Refused         int64   `json:"refused_connections"`
	MeanMessageSize float64 `json:"mean_message_size"`
	BytesSent       int64   `json:"bytes_sent"`
}

// StepReport is one step of a run (a fixed run has one).
type StepReport struct {
	Concurrency  int            `json:"concurrency"`
	DurationS    float64        `json:"duration_s"`
	Delivered    int64          `json:"delivered"`
	MsgsPerSec   float64        `json:"msgs_per_sec"`
	POPSessions  int64          `json:"pop_sessions"`
	POPPerSec    float64        `json:"pop_sessions_per_sec"`
	IMAPSessions int64          `json:"imap_sessions"`
	IMAPPerSec   float64        `json:"imap_sessions_per_sec"`
	Requests     int64          `json:"requests"`
	Misses       int64          `json:"misses"`
	MissFraction float64        `json:"miss_fraction"`
	Overloaded   bool           `json:"overloaded"`
	Partial      bool           `json:"partial,omitempty"` // cut short by the end of the run
	SMTPLatency  LatencySummary `json:"smtp_latency"`
	POPLatency   LatencySummary `json:"pop_latency"`
	IMAPLatency  LatencySummary `json:"imap_latency"`
}

// SizeModel documents the size distribution used.
type SizeModel struct {
	Distribution string  `json:"distribution"`
	Mu           float64 `json:"mu"`
	Sigma        float64 `json:"sigma"`
	Min          int     `json:"min"`
	Max          int     `json:"max"`
	Mean         float64 `json:"mean"`
	Median       int     `json:"median"`
}

func perSec(n int64, d time.Duration) float64 {
	if d <= 0 {
		return 0
	}
	return round2(float64(n) / d.Seconds())
}

func round2(x float64) float64 { return math.Round(x*100) / 100 }

func stepReport(conc int, d time.Duration, st *Stats, p *Probe) StepReport {
	sr := StepReport{
		Concurrency:  conc,
		DurationS:    round2(d.Seconds()),
		Delivered:    st.Delivered,
		MsgsPerSec:   perSec(st.Delivered, d),
		POPSessions:  st.POP,
		POPPerSec:    perSec(st.POP, d),
		IMAPSessions: st.IMAP,
		IMAPPerSec:   perSec(st.IMAP, d),
		Requests:     st.Requests,
		Misses:       st.Misses(),
		MissFraction: math.Round(st.MissFraction()*1e4) / 1e4,
		SMTPLatency:  st.Latency(OpSMTP),
		POPLatency:   st.Latency(OpPOP),
		IMAPLatency:  st.Latency(OpIMAP),
	}
	if p == nil {
		p = NewProbe()
	}
	sr.Overloaded = p.Overloaded(StepResult{Concurrency: conc, Requests: st.Requests, Misses: st.Misses()})
	return sr
}

// BestStep returns the index of the step with the highest delivery rate,
// preferring complete steps that were not overloaded; -1 if there is none.
func BestStep(steps []StepReport) int {
	best := -1
	better := func(i int) bool {
		if best < 0 {
			return true
		}
		a, b := steps[i], steps[best]
		ag, bg := !a.Partial && !a.Overloaded, !b.Partial && !b.Overloaded
		if ag != bg {
			return ag
		}
		return a.MsgsPerSec > b.MsgsPerSec
	}
	for i := range steps {
		if better(i) {
			best = i
		}
	}
	return best
}

func submissionTo(s *Submit) string {
	if s == nil {
		return ""
	}
	return s.RemoteDomain
}

// sizeModel describes the size distribution of cfg.
func sizeModel(cfg Config) SizeModel {
	if r := cfg.Range; r != nil {
		return SizeModel{Distribution: "uniform", Min: r.Min, Max: r.Max, Mean: r.Mean(), Median: int(math.Round(r.Mean()))}
	}
	return SizeModel{
		Distribution: "log-normal, clipped",
		Mu:           math.Round(cfg.Sizes.Mu*1e4) / 1e4,
		Sigma:        cfg.Sizes.Sigma,
		Min:          cfg.Sizes.Min,
		Max:          cfg.Sizes.Max,
		Mean:         math.Round(cfg.Sizes.Mean()),
		Median:       cfg.Sizes.Median(),
	}
}

func newReport(cfg Config, st *Stats, elapsed time.Duration, steps []StepReport) *Report {
	r := &Report{
		Mode:        "fixed",
		SMTPAddr:    cfg.SMTPAddr,
		Submission:  submissionTo(cfg.Submit),
		POP3Addr:    cfg.POP3Addr,
		IMAPAddr:    cfg.IMAPAddr,
		Users:       len(cfg.Users),
		Mix:         (1 - cfg.IMAPMix) * cfg.Mix,
		POPMix:      (1 - cfg.IMAPMix) * (1 - cfg.Mix),
		IMAPMix:     cfg.IMAPMix,
		Seed:        cfg.Seed,
		DeadlineMS:  ms(cfg.Deadline),
		ElapsedS:    round2(elapsed.Seconds()),
		Concurrency: cfg.Concurrency,
		RateCap:     cfg.Rate,
		Steps:       steps,
		Best:        -1,
		SizeModel:   sizeModel(cfg),
	}
	t := Totals{
		Delivered:        st.Delivered,
		MsgsPerSec:       perSec(st.Delivered, elapsed),
		POPSessions:      st.POP,
		POPPerSec:        perSec(st.POP, elapsed),
		Retrieved:        st.Retrieved,
		Requests:         st.Requests,
		SMTPLatency:      st.Latency(OpSMTP),
		POPLatency:       st.Latency(OpPOP),
		IMAPSessions:     st.IMAP,
		IMAPPerSec:       perSec(st.IMAP, elapsed),
		IMAPLatency:      st.Latency(OpIMAP),
		IMAPEmpty:        st.IMAPEmpty,
		IMAPBodies:       st.IMAPBodies,
		OverDeadline:     make(map[string]int64),
		Errors:           make(map[string]int64),
		ErrorsByProtocol: make(map[string]map[string]int64),
		ErrorCount:       st.ErrorCount(),
		Aborted:          st.Aborted,
		MeanMessageSize:  math.Round(st.MeanSize()),
		BytesSent:        st.BytesSent,
	}
	if st.TLSFull+st.TLSResumed > 0 {
		t.TLS = &TLSTotals{Full: st.TLSFull, Resumed: st.TLSResumed, Handshake: st.HandshakeLatency()}
	}
	if st.IMAP > 0 {
		t.IMAPListed = math.Round(float64(st.IMAPListed)/float64(st.IMAP)*10) / 10
		t.IMAPSteps = make(map[string]LatencySummary)
		for _, s := range IMAPSteps {
			t.IMAPSteps[s.String()] = st.IMAPStepLatency(s)
		}
	}
	for op := range numOps {
		t.OverDeadline[op.String()] = st.Over[op]
		m := make(map[string]int64)
		for _, k := range ErrKinds {
			m[string(k)] = st.OpErrors[op][k]
		}
		t.ErrorsByProtocol[op.String()] = m
	}
	for _, k := range ErrKinds {
		t.Errors[string(k)] = st.Errors[k]
		if m, ok := st.Samples[k]; ok {
			if t.ErrorSamples == nil {
				t.ErrorSamples = make(map[string]string)
			}
			t.ErrorSamples[string(k)] = m
		}
	}
	r.Total = t
	r.MsgsPerSec, r.POPPerSec, r.IMAPPerSec = t.MsgsPerSec, t.POPPerSec, t.IMAPPerSec
	if cfg.Probe != nil {
		r.Mode = "probe"
		r.Concurrency = 0
		if b := BestStep(steps); b >= 0 {
			r.Best = b
			r.Concurrency = steps[b].Concurrency
			r.MsgsPerSec, r.POPPerSec, r.IMAPPerSec = steps[b].MsgsPerSec, steps[b].POPPerSec, steps[b].IMAPPerSec
		}
	}
	return r
}

// WriteJSON writes the report as indented JSON.
func (r *Report) WriteJSON(w io.Writer) error { return writeIndentedJSON(w, r) }

// writeIndentedJSON writes v as JSON indented by two spaces, as every
// report of the bench is written.
func writeIndentedJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// WriteText writes the report for people.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	t := &r.Total
	withIMAP := r.IMAPMix > 0
	if withIMAP {
		fmt.Fprintf(&b, "quill bench: Porcupine workload with IMAP sessions, %s mode, %d users, %.0f%% SMTP / %.0f%% POP3 / %.0f%% IMAP, deadline %.0f ms, %.1f s\n",
			r.Mode, r.Users, r.Mix*100, r.POPMix*100, r.IMAPMix*100, r.DeadlineMS, r.ElapsedS)
		var addrs []string
		for _, a := range []struct {
			name, addr string
			share      float64
		}{{"SMTP", r.SMTPAddr, r.Mix}, {"POP3", r.POP3Addr, r.POPMix}, {"IMAP", r.IMAPAddr, r.IMAPMix}} {
			if a.share > 0 {
				addrs = append(addrs, a.name+" "+a.addr)
			}
		}
		fmt.Fprintf(&b, "  %s\n", strings.Join(addrs, "   "))
	} else if r.Submission != "" {
		fmt.Fprintf(&b, "quill bench: submission workload (users log in and send to %s), %s mode, %d users, deadline %.0f ms, %.1f s\n",
			r.Submission, r.Mode, r.Users, r.DeadlineMS, r.ElapsedS)
		fmt.Fprintf(&b, "  submission %s\n", r.SMTPAddr)
	} else {
		fmt.Fprintf(&b, "quill bench: Porcupine workload, %s mode, %d users, %.0f%% SMTP, deadline %.0f ms, %.1f s\n",
			r.Mode, r.Users, r.Mix*100, r.DeadlineMS, r.ElapsedS)
		fmt.Fprintf(&b, "  SMTP %s   POP3 %s\n", r.SMTPAddr, r.POP3Addr)
	}
	if r.RateCap > 0 {
		fmt.Fprintf(&b, "  paced: at most %.1f requests started per second\n", r.RateCap)
	}
	if r.Interrupted {
		fmt.Fprintf(&b, "  (interrupted)\n")
	}
	if r.Mode == "probe" {
		fmt.Fprintf(&b, "\nprobe steps:\n")
		imapHead := ""
		if withIMAP {
			imapHead = fmt.Sprintf(" %8s %9s", "imap/s", "imap p50")
		}
		fmt.Fprintf(&b, "  %4s %6s %7s %9s %8s%s %8s %7s %9s %9s\n",
			"conc", "secs", "msgs", "msg/s", "pop/s", imapHead, "reqs", "miss%", "smtp p50", "smtp p99")
		for i, s := range r.Steps {
			mark := ""
			switch {
			case i == r.Best:
				mark = "  <- best"
			case s.Partial:
				mark = "  (partial)"
			case s.Overloaded:
				mark = "  (overloaded)"
			}
			imapCols := ""
			if withIMAP {
				imapCols = fmt.Sprintf(" %8.1f %7.1fms", s.IMAPPerSec, s.IMAPLatency.P50)
			}
			fmt.Fprintf(&b, "  %4d %6.1f %7d %9.1f %8.1f%s %8d %6.1f%% %7.1fms %7.1fms%s\n",
				s.Concurrency, s.DurationS, s.Delivered, s.MsgsPerSec, s.POPPerSec, imapCols, s.Requests,
				s.MissFraction*100, s.SMTPLatency.P50, s.SMTPLatency.P99, mark)
		}
		if r.Best >= 0 {
			fmt.Fprintf(&b, "\nbest step: concurrency %d: %s\n", r.Concurrency, r.rates())
		}
		fmt.Fprintf(&b, "\nwhole run:\n")
	} else {
		fmt.Fprintf(&b, "  concurrency %d\n\n", r.Concurrency)
	}
	fmt.Fprintf(&b, "  messages delivered   %d (%.1f/s)\n", t.Delivered, t.MsgsPerSec)
	withPOP := !withIMAP || r.POPMix > 0
	if withPOP {
		fmt.Fprintf(&b, "  POP sessions         %d (%.1f/s), %d messages retrieved and deleted\n",
			t.POPSessions, t.POPPerSec, t.Retrieved)
	}
	if withIMAP {
		fmt.Fprintf(&b, "  IMAP sessions        %d (%.1f/s), %.1f messages listed per session, %d messages read, %d empty INBOXes\n",
			t.IMAPSessions, t.IMAPPerSec, t.IMAPListed, t.IMAPBodies, t.IMAPEmpty)
	}
	if t.TLS != nil {
		fmt.Fprintf(&b, "  TLS handshakes       %d full, %d resumed\n", t.TLS.Full, t.TLS.Resumed)
	}
	fmt.Fprintf(&b, "  mean message size    %.0f B (model: %s in [%d, %d], mean %.0f B, median %d B)\n",
		t.MeanMessageSize, r.SizeModel.Distribution, r.SizeModel.Min, r.SizeModel.Max, r.SizeModel.Mean, r.SizeModel.Median)
	fmt.Fprintf(&b, "\n  %-16s %7s %9s %9s %9s %9s %9s\n", "latency (ms)", "count", "mean", "p50", "p90", "p99", "max")
	type row struct {
		name string
		s    LatencySummary
	}
	rows := []row{{"SMTP", t.SMTPLatency}}
	if withPOP {
		rows = append(rows, row{"POP", t.POPLatency})
	}
	if withIMAP {
		rows = append(rows, row{"IMAP", t.IMAPLatency})
		for _, s := range IMAPSteps {
			rows = append(rows, row{"  " + s.String(), t.IMAPSteps[s.String()]})
		}
	}
	if t.TLS != nil {
		rows = append(rows, row{"TLS handshake", t.TLS.Handshake})
	}
	for _, l := range rows {
		fmt.Fprintf(&b, "  %-16s %7d %9.1f %9.1f %9.1f %9.1f %9.1f\n",
			l.name, l.s.Count, l.s.Mean, l.s.P50, l.s.P90, l.s.P99, l.s.Max)
	}
	fmt.Fprintf(&b, "\n  over the %.0f ms deadline: SMTP %d, POP %d", r.DeadlineMS, t.OverDeadline["smtp"], t.OverDeadline["pop"])
	if withIMAP {
		fmt.Fprintf(&b, ", IMAP %d", t.OverDeadline["imap"])
	}
	fmt.Fprintf(&b, "\n")
	fmt.Fprintf(&b, "  errors: %d", t.ErrorCount)
	for _, k := range ErrKinds {
		fmt.Fprintf(&b, "  %s %d", k, t.Errors[string(k)])
	}
	fmt.Fprintf(&b, "\n")
	if withIMAP {
		var n int64
		for _, v := range t.ErrorsByProtocol["imap"] {
			n += v
		}
		fmt.Fprintf(&b, "  IMAP errors: %d", n)
		for _, k := range []ErrKind{ErrConnect, ErrIMAPNo, ErrIMAPBad, ErrTimeout, ErrOther} {
			fmt.Fprintf(&b, "  %s %d", k, t.ErrorsByProtocol["imap"][string(k)])
		}
		fmt.Fprintf(&b, "\n")
	}
	for _, k := range ErrKinds {
		if m, ok := t.ErrorSamples[string(k)]; ok {
			fmt.Fprintf(&b, "    first %s: %s\n", k, m)
		}
	}
	if t.Refused > 0 {
		fmt.Fprintf(&b, "  connections refused, the session then taken by another address: %d\n", t.Refused)
	}
	fmt.Fprintf(&b, "  aborted at the end of the run: %d\n", t.Aborted)
	if c := r.CPU; c != nil {
		fmt.Fprintf(&b, "  CPU (cores of %d): machine %.2f, bench client %.2f", c.Cores, c.Machine, c.Client)
		if c.Server != nil {
			fmt.Fprintf(&b, ", server %.2f, everything else %.2f", *c.Server, *c.Other)
		}
		fmt.Fprintf(&b, "\n")
	}
	if r.Mode == "fixed" {
		fmt.Fprintf(&b, "\nresult: %s at concurrency %d\n", r.rates(), r.Concurrency)
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// rates is the headline: messages delivered, POP and IMAP sessions per
// second.
func (r *Report) rates() string {
	s := fmt.Sprintf("%.1f messages/s delivered, %.1f POP sessions/s", r.MsgsPerSec, r.POPPerSec)
	if r.IMAPMix > 0 {
		s += fmt.Sprintf(", %.1f IMAP sessions/s", r.IMAPPerSec)
	}
	return s
}

package bench

import (
	"math"
	"slices"
	"time"
)

// Op is the kind of a request.
type Op int

const (
	OpSMTP Op = iota // one SMTP session delivering one message
	OpPOP            // one POP3 session: login, retrieve and delete all, quit
	OpIMAP           // one IMAP session: login, list headers, read one message, flag it, log out
	numOps
)

func (o Op) String() string {
	switch o {
	case OpPOP:
		return "pop"
	case OpIMAP:
		return "imap"
	}
	return "smtp"
}

// ErrKind classifies a failed request.
type ErrKind string

const (
	ErrNone    ErrKind = ""
	ErrConnect ErrKind = "connect"  // the TCP connection could not be opened
	ErrSMTP4xx ErrKind = "smtp_4xx" // a transient SMTP reply (RFC 5321 §4.2.1)
	ErrSMTP5xx ErrKind = "smtp_5xx" // a permanent SMTP reply
	ErrPOP     ErrKind = "pop_err"  // a POP3 -ERR reply (RFC 1939 §3)
	ErrIMAPNo  ErrKind = "imap_no"  // an IMAP tagged NO (RFC 9051 §7.1.2)
	ErrIMAPBad ErrKind = "imap_bad" // an IMAP tagged BAD (RFC 9051 §7.1.3)
	ErrTimeout ErrKind = "timeout"  // an operation ran into its deadline
	ErrOther   ErrKind = "other"    // connection lost, malformed reply, ...
)

// ErrKinds lists the kinds in report order.
var ErrKinds = []ErrKind{ErrConnect, ErrSMTP4xx, ErrSMTP5xx, ErrPOP, ErrIMAPNo, ErrIMAPBad, ErrTimeout, ErrOther}

// Result is the outcome of one request.
type Result struct {
	Op      Op
	Latency time.Duration // whole session, from dial to the reply to QUIT
	Err     ErrKind
	ErrMsg  string // the error, for the report's samples
	// Aborted marks a request cut off because the run ended; it is counted
	// neither as a success nor as an error.
	Aborted bool
	// Delivered is set for an SMTP session whose DATA got a 250, even if
	// the session failed afterwards.
	Delivered bool
	BytesSent int64 // message bytes handed to DATA
	// Retrieved and BytesRetrieved count the messages fully read by RETR.
	Retrieved      int
	BytesRetrieved int64
	// TLS is set when the session ran over TLS; TLSResumed when its
	// handshake resumed an earlier session; Handshake is how long the
	// handshake took.
	TLS, TLSResumed bool
	Handshake       time.Duration
	// IMAP holds what an IMAP session did; zero for other operations.
	IMAP IMAPResult
}

// IMAPResult is what one IMAP session did.
type IMAPResult struct {
	// Listed is the number of messages the header FETCH returned.
	Listed int
	// HeaderBytes is the size of the header fields it returned.
	HeaderBytes int64
	// BodyFetched is set when the FETCH of a full message returned its
	// body; BodyBytes is that body's size.
	BodyFetched bool
	BodyBytes   int64
	// Steps holds the time each step took; Done has bit 1<<step set for
	// each step that completed.
	Steps [numIMAPSteps]time.Duration
	Done  uint16
}

// Stats accumulates Results. The zero value is ready to use; it is not safe
// for concurrent use.
type Stats struct {
	Requests  int64 // finished requests, errors included, aborted excluded
	Delivered int64 // messages accepted after DATA
	BytesSent int64 // size of the delivered messages
	POP       int64 // POP sessions that ended with +OK to QUIT
	Retrieved int64 // messages read by RETR
	BytesRead int64
	Aborted   int64
	IMAP      int64 // IMAP sessions that ended with OK to LOGOUT
	// IMAPListed counts the messages listed by the header FETCH of the
	// successful IMAP sessions; IMAPEmpty those sessions that found an
	// empty INBOX; IMAPBodies and IMAPBodyBytes the full messages read.
	IMAPListed    int64
	IMAPEmpty     int64
	IMAPBodies    int64
	IMAPBodyBytes int64
	// TLSFull and TLSResumed count the full and the resumed handshakes;
	// handshakes holds their times.
	TLSFull, TLSResumed int64
	handshakes          []time.Duration
	// Over counts successful requests slower than the deadline, by Op.
	Over   [numOps]int64
	Errors map[ErrKind]int64
	// OpErrors counts the failed requests by Op and kind.
	OpErrors [numOps]map[ErrKind]int64
	// Samples holds the first error message of each kind.
	Samples map[ErrKind]string

	lat [numOps][]time.Duration // latencies of successful requests, by Op
	// imapSteps holds the step times of the successful IMAP sessions.
	imapSteps [numIMAPSteps][]time.Duration
}

// Add records r; deadline is the latency above which a successful request
// counts as late.
func (s *Stats) Add(r Result, deadline time.Duration) {
	if r.Delivered {
		s.Delivered++
		s.BytesSent += r.BytesSent
	}
	s.Retrieved += int64(r.Retrieved)
	s.BytesRead += r.BytesRetrieved
	if r.TLS {
		if r.TLSResumed {
			s.TLSResumed++
		} else {
			s.TLSFull++
		}
		s.handshakes = append(s.handshakes, r.Handshake)
	}
	if r.Aborted {
		s.Aborted++
		return
	}
	s.Requests++
	if r.Err != ErrNone {
		if s.Errors == nil {
			s.Errors = make(map[ErrKind]int64)
		}
		s.Errors[r.Err]++
		if s.OpErrors[r.Op] == nil {
			s.OpErrors[r.Op] = make(map[ErrKind]int64)
		}
		s.OpErrors[r.Op][r.Err]++
		if _, ok := s.Samples[r.Err]; !ok && r.ErrMsg != "" {
			if s.Samples == nil {
				s.Samples = make(map[ErrKind]string)
			}
			s.Samples[r.Err] = r.ErrMsg
		}
		return
	}
	switch r.Op {
	case OpPOP:
		s.POP++
	case OpIMAP:
		s.IMAP++
		s.IMAPListed += int64(r.IMAP.Listed)
		if r.IMAP.Listed == 0 {
			s.IMAPEmpty++
		}
		if r.IMAP.BodyFetched {
			s.IMAPBodies++
			s.IMAPBodyBytes += r.IMAP.BodyBytes
		}
		for i := range s.imapSteps {
			if r.IMAP.Done&(1<<i) != 0 {
				s.imapSteps[i] = append(s.imapSteps[i], r.IMAP.Steps[i])
			}
		}
	}
	s.lat[r.Op] = append(s.lat[r.Op], r.Latency)
	if r.Latency > deadline {
		s.Over[r.Op]++
	}
}

// Merge adds the counts and latencies of o to s.
func (s *Stats) Merge(o *Stats) {
	s.Requests += o.Requests
	s.Delivered += o.Delivered
	s.BytesSent += o.BytesSent
	s.POP += o.POP
	s.Retrieved += o.Retrieved
	s.BytesRead += o.BytesRead
	s.Aborted += o.Aborted
	s.IMAP += o.IMAP
	s.IMAPListed += o.IMAPListed
	s.IMAPEmpty += o.IMAPEmpty
	s.IMAPBodies += o.IMAPBodies
	s.IMAPBodyBytes += o.IMAPBodyBytes
	s.TLSFull += o.TLSFull
	s.TLSResumed += o.TLSResumed
	s.handshakes = append(s.handshakes, o.handshakes...)
	for i := range s.imapSteps {
		s.imapSteps[i] = append(s.imapSteps[i], o.imapSteps[i]...)
	}
	for op, m := range o.OpErrors {
		for k, v := range m {
			if s.OpErrors[op] == nil {
				s.OpErrors[op] = make(map[ErrKind]int64)
			}
			s.OpErrors[op][k] += v
		}
	}
	for i := range s.Over {
		s.Over[i] += o.Over[i]
		s.lat[i] = append(s.lat[i], o.lat[i]...)
	}
	for k, v := range o.Errors {
		if s.Errors == nil {
			s.Errors = make(map[ErrKind]int64)
		}
		s.Errors[k] += v
	}
	for k, v := range o.Samples {
		if _, ok := s.Samples[k]; !ok {
			if s.Samples == nil {
				s.Samples = make(map[ErrKind]string)
			}
			s.Samples[k] = v
		}
	}
}

// ErrorCount is the number of failed requests.
func (s *Stats) ErrorCount() int64 {
	var n int64
	for _, v := range s.Errors {
		n += v
	}
	return n
}

// Misses is the number of requests that did not complete successfully
// within the deadline: the late ones and the failed ones. The probe uses
// it, as Porcupine's generator does, to detect saturation.
func (s *Stats) Misses() int64 {
	n := s.ErrorCount()
	for _, o := range s.Over {
		n += o
	}
	return n
}

// MissFraction is Misses/Requests; 0 when nothing finished.
func (s *Stats) MissFraction() float64 {
	if s.Requests == 0 {
		return 0
	}
	return float64(s.Misses()) / float64(s.Requests)
}

// MeanSize is the mean size of the delivered messages in bytes.
func (s *Stats) MeanSize() float64 {
	if s.Delivered == 0 {
		return 0
	}
	return float64(s.BytesSent) / float64(s.Delivered)
}

// Latency summarises the latencies of the successful requests of op.
func (s *Stats) Latency(op Op) LatencySummary { return Summarize(s.lat[op]) }

// HandshakeLatency summarises the TLS handshakes, full and resumed.
func (s *Stats) HandshakeLatency() LatencySummary { return Summarize(s.handshakes) }

// IMAPStepLatency summarises the time the successful IMAP sessions spent
// in one step.
func (s *Stats) IMAPStepLatency(step IMAPStep) LatencySummary { return Summarize(s.imapSteps[step]) }

// LatencySummary holds latency percentiles in milliseconds.
type LatencySummary struct {
	Count int     `json:"count"`
	Mean  float64 `json:"mean_ms"`
	P50   float64 `json:"p50_ms"`
	P90   float64 `json:"p90_ms"`
	P99   float64 `json:"p99_ms"`
	Max   float64 `json:"max_ms"`
}

// Summarize computes the summary of ds (which it does not modify).
func Summarize(ds []time.Duration) LatencySummary {
	if len(ds) == 0 {
		return LatencySummary{}
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	var sum time.Duration
	for _, d := range s {
		sum += d
	}
	return LatencySummary{
		Count: len(s),
		Mean:  ms(sum / time.Duration(len(s))),
		P50:   ms(Percentile(s, 50)),
		P90:   ms(Percentile(s, 90)),
		P99:   ms(Percentile(s, 99)),
		Max:   ms(s[len(s)-1]),
	}
}

// Percentile returns the p-th percentile (0 < p <= 100) of the sorted
// slice by the nearest-rank method: the smallest value with at least p% of
// the values at or below it.
func Percentile(sorted []time.Duration, p float64) time.Duration {
	if len(sorted) == 0 {
		return 0
	}
	rank := int(math.Ceil(p / 100 * float64(len(sorted))))
	rank = min(max(rank, 1), len(sorted))
	return sorted[rank-1]
}

func ms(d time.Duration) float64 { return math.Round(float64(d)/1e3) / 1e3 }

package bench

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"golang.org/x/time/rate"
)

// Defaults of a run.
const (
	DefaultDuration    = 30 * time.Second
	DefaultDeadline    = 2 * time.Second // Porcupine's "within two seconds"
	DefaultConcurrency = 16
	// DefaultStep is the length of one probe step.
	DefaultStep = 5 * time.Second
	// progressInterval is how often the progress line is printed.
	progressInterval = time.Second
)

// Config describes one run.
type Config struct {
	// SMTPAddr, POP3Addr and IMAPAddr are the servers' host:port; each may
	// be a comma-separated list (the nodes of a cluster), and every
	// session then connects to one of them chosen at random, as
	// Porcupine's generator did (§6.1).
	SMTPAddr string
	POP3Addr string
	IMAPAddr string
	// Users are the mailboxes, most popular first (the Zipf rank order).
	Users []User
	// Domain names the sender (bench-sender@Domain) and the Message-IDs.
	Domain string
	// Duration bounds the run; requests in flight at its end get
	// DrainTimeout more.
	Duration time.Duration
	// Deadline is the latency above which a request counts as missed.
	Deadline time.Duration
	// Concurrency is the fixed number of closed-loop workers, used when
	// Probe is nil.
	Concurrency int
	// Probe, if set, varies the number of workers step by step; Step is
	// the length of a step.
	Probe *Probe
	Step  time.Duration
	// Rate, if positive, caps the requests started per second across all
	// workers (an open-loop pace while the server keeps up): two servers
	// run at the same Rate carry the same load, so their latencies
	// compare like with like, which a closed loop at saturation does not
	// (the faster server then also queues more work per command).
	Rate float64
	// Mix is the fraction of the requests that are not IMAP sessions that
	// are SMTP deliveries; the others are POP3 sessions.
	Mix float64
	// IMAPMix is the fraction of requests that are IMAP sessions (0, the
	// default, is the Porcupine workload).
	IMAPMix float64
	// Seed makes the choice of users, sizes and bodies repeatable per
	// worker (timing still varies from run to run).
	Seed uint64
	// Sizes is the message size distribution; zero means DefaultSizeDist.
	Sizes SizeDist
	// Range, if set, replaces Sizes: message sizes drawn uniformly from
	// it (CassMail's experiments).
	Range *SizeRange
	// Count, if positive, ends the run once that many SMTP deliveries
	// have started (a fixed amount of mail, for a disk footprint).
	Count int64
	// BodyText, if set, is the text message bodies are cut from instead
	// of random symbols (AppendMessageText): real prose compresses as
	// mail does.
	BodyText []byte
	// Progress, if set, gets one line per second.
	Progress io.Writer
	// ServerPIDs, if set, are the server's processes: the report then
	// gives the CPU time of their process trees (Linux /proc).
	ServerPIDs []int
	// TLS, if set, makes every session speak implicit TLS (the addresses
	// are then SMTPS, POP3S and IMAPS ports). Its ClientSessionCache, if
	// set, lets a returning client resume its session.
	TLS *tls.Config
	// Submit, if set, makes every SMTP session a submission (RFC 6409):
	// a user, drawn by Zipf, logs in (AUTH PLAIN) and sends one message
	// from their own address to Rcpts addresses at RemoteDomain, which
	// the server must relay (the submission workload of issue 12).
	Submit *Submit
}

// Submit shapes the submission workload.
type Submit struct {
	RemoteDomain string
	Rcpts        int
	// NoAuth leaves out the login (a peer that relays for its network
	// without SASL).
	NoAuth bool
}

func (cfg *Config) check() error {
	switch {
	case cfg.Mix < 0 || cfg.Mix > 1:
		return errors.New("bench: mix must be within [0, 1]")
	case cfg.IMAPMix < 0 || cfg.IMAPMix > 1:
		return errors.New("bench: IMAP mix must be within [0, 1]")
	case len(splitAddrs(cfg.SMTPAddr)) == 0 && cfg.IMAPMix < 1 && cfg.Mix > 0:
		return errors.New("bench: no SMTP address")
	case len(splitAddrs(cfg.POP3Addr)) == 0 && cfg.IMAPMix < 1 && cfg.Mix < 1:
		return errors.New("bench: no POP3 address")
	case len(splitAddrs(cfg.IMAPAddr)) == 0 && cfg.IMAPMix > 0:
		return errors.New("bench: no IMAP address")
	case len(cfg.Users) == 0:
		return errors.New("bench: no users")
	case cfg.Duration <= 0:
		return errors.New("bench: duration must be positive")
	case cfg.Deadline <= 0:
		return errors.New("bench: deadline must be positive")
	case cfg.Rate < 0:
		return errors.New("bench: rate must not be negative")
	case cfg.Probe == nil && cfg.Concurrency < 1:
		return errors.New("bench: concurrency must be at least 1")
	case cfg.Probe != nil && (cfg.Step <= 0 || cfg.Probe.Start < 1 || cfg.Probe.Max < cfg.Probe.Start):
		return errors.New("bench: bad probe parameters")
	case cfg.Range != nil && (cfg.Range.Min < 1 || cfg.Range.Max < cfg.Range.Min):
		return errors.New("bench: bad size range")
	}
	if cfg.Sizes == (SizeDist{}) {
		cfg.Sizes = DefaultSizeDist()
	}
	if cfg.Domain == "" {
		cfg.Domain = "bench.example"
	}
	return nil
}

// sampleSize draws a message size from Range if set, else from Sizes.
func (cfg *Config) sampleSize(rng *rand.Rand) int {
	if cfg.Range != nil {
		return cfg.Range.Sample(rng)
	}
	return cfg.Sizes.Sample(rng)
}

// recorder collects the results of all workers.
type recorder struct {
	deadline time.Duration

	mu    sync.Mutex
	step  *Stats
	total Stats

	// Counters for the progress line and the per-second series; refused
	// counts the connections a session could not open before another
	// address answered (runner.connect).
	delivered, pop, imap, errs, refused atomic.Int64
}

func (r *recorder) add(res Result) {
	if res.Delivered {
		r.delivered.Add(1)
	}
	if !res.Aborted {
		if res.Err != ErrNone {
			r.errs.Add(1)
		} else if res.Op == OpPOP {
			r.pop.Add(1)
		} else if res.Op == OpIMAP {
			r.imap.Add(1)
		}
	}
	r.mu.Lock()
	defer r.mu.Unlock()
	r.total.Add(res, r.deadline)
	if r.step != nil {
		r.step.Add(res, r.deadline)
	}
}

// swap returns the stats of the step that ends and starts a new one (or
// none, if next is false).
func (r *recorder) swap(next bool) *Stats {
	r.mu.Lock()
	defer r.mu.Unlock()
	s := r.step
	r.step = nil
	if next {
		r.step = new(Stats)
	}
	return s
}

// runner holds the state shared by the workers of a run.
type runner struct {
	cfg   Config
	rec   *recorder
	runID string
	seq   atomic.Uint64
	stop  context.Context // done when no new request may start
	// end stops the run early (Config.Count reached); started counts
	// the SMTP deliveries begun.
	end     context.CancelFunc
	started atomic.Int64
	abort   context.Context // done when requests in flight are cut off

	// readerBusy marks the users with a POP or IMAP session in flight:
	// like one mail client, a user has at most one such session at a time.
	readerBusy []atomic.Bool

	wg      sync.WaitGroup
	workers []chan struct{} // close to stop that worker
	nextID  uint64
	active  atomic.Int64
	// pace, if set, hands out the Config.Rate starts per second.
	pace *rate.Limiter
	// The servers' addresses (Config.SMTPAddr and the others, split).
	smtpAddrs, popAddrs, imapAddrs []string
	// series is the per-second record of the run (sample).
	series []Second
}

// splitAddrs splits a comma-separated list of addresses.
func splitAddrs(s string) []string {
	var out []string
	for _, a := range strings.Split(s, ",") {
		if a = strings.TrimSpace(a); a != "" {
			out = append(out, a)
		}
	}
	return out
}

// connect runs one session through do on one of addrs chosen at random;
// if the connection cannot be opened, it tries the others in turn, as a
// mail client tries a name's several addresses (RFC 5321 §5.1), so a node
// that is down costs its sessions a refused connection each, not the
// session. Each address tried in vain is counted (Second.Refused); the
// session is a connect error only when none answered.
func (rn *runner) connect(addrs []string, rng *rand.Rand, do func(addr string) (Result, error)) (Result, error) {
	first := pickAddr(addrs, rng)
	res, err := do(first)
	if res.Err != ErrConnect || len(addrs) < 2 {
		return res, err
	}
	rest := make([]string, 0, len(addrs)-1)
	for _, a := range addrs {
		if a != first {
			rest = append(rest, a)
		}
	}
	rng.Shuffle(len(rest), func(i, j int) { rest[i], rest[j] = rest[j], rest[i] })
	for _, a := range rest {
		rn.rec.refused.Add(1)
		if res, err = do(a); res.Err != ErrConnect {
			break
		}
	}
	return res, err
}

// pickAddr is the server of one session: one of addrs at random ("" if
// there is none; check has refused that for the protocols used).
func pickAddr(addrs []string, rng *rand.Rand) string {
	switch len(addrs) {
	case 0:
		return ""
	case 1:
		return addrs[0]
	}
	return addrs[rng.IntN(len(addrs))]
}

// setConcurrency starts or stops workers so that n run.
func (rn *runner) setConcurrency(n int) {
	for len(rn.workers) < n {
		quit := make(chan struct{})
		rn.workers = append(rn.workers, quit)
		rn.wg.Add(1)
		id := rn.nextID
		rn.nextID++
		go rn.work(id, quit)
	}
	for len(rn.workers) > n {
		last := len(rn.workers) - 1
		close(rn.workers[last])
		rn.workers = rn.workers[:last]
	}
	rn.active.Store(int64(n))
}

// work is one closed-loop worker: it issues one request after the other.
func (rn *runner) work(id uint64, quit <-chan struct{}) {
	defer rn.wg.Done()
	rng := rand.New(rand.NewPCG(rn.cfg.Seed, id))
	users, err := NewZipfChooser(rng, len(rn.cfg.Users))
	if err != nil {
		panic(err) // checked by Run
	}
	from := "bench-sender@" + rn.cfg.Domain
	var buf []byte
	for {
		select {
		case <-quit:
			return
		case <-rn.stop.Done():
			return
		default:
		}
		if rn.pace != nil && rn.pace.Wait(rn.stop) != nil {
			return // the run is over (or ctx cancelled) before this start's turn
		}
		var res Result
		switch chooseOp(rng.Float64(), rn.cfg.Mix, rn.cfg.IMAPMix) {
		case OpSMTP:
			if rn.cfg.Count > 0 && rn.started.Add(1) > rn.cfg.Count {
				rn.end()
				return
			}
			u := rn.cfg.Users[users.Next()]
			seq := rn.seq.Add(1)
			t := smtpTarget{tls: rn.cfg.TLS, helo: "bench-client." + rn.cfg.Domain, from: from, to: []string{u.Address}}
			if sub := rn.cfg.Submit; sub != nil {
				// The user sends, to addresses of the remote domain.
				t.from, t.to = u.Address, nil
				for i := range max(sub.Rcpts, 1) {
					t.to = append(t.to, fmt.Sprintf("rcpt%d-%d@%s", seq, i, sub.RemoteDomain))
				}
				if !sub.NoAuth {
					t.user, t.pass = u.Address, u.Password
				}
			}
			spec := MessageSpec{
				From:      t.from,
				To:        t.to[0],
				Subject:   "bench message " + strconv.FormatUint(seq, 10),
				MessageID: rn.runID + "." + strconv.FormatUint(seq, 10) + "@" + rn.cfg.Domain,
				Date:      time.Now(),
				Size:      rn.cfg.sampleSize(rng),
			}
			if rn.cfg.BodyText != nil {
				buf = AppendMessageText(buf[:0], rng, spec, rn.cfg.BodyText)
			} else {
				buf = AppendMessage(buf[:0], rng, spec)
			}
			t.msg = buf
			res, err = rn.connect(rn.smtpAddrs, rng, func(addr string) (Result, error) {
				t.addr = addr
				return deliver(rn.abort, t)
			})
		case OpPOP:
			k := rn.lockReader(users)
			u := rn.cfg.Users[k]
			res, err = rn.connect(rn.popAddrs, rng, func(addr string) (Result, error) {
				return retrieveAll(rn.abort, popTarget{addr: addr, tls: rn.cfg.TLS, user: u.Address, pass: u.Password})
			})
			rn.readerBusy[k].Store(false)
		case OpIMAP:
			k := rn.lockReader(users)
			u := rn.cfg.Users[k]
			res, err = rn.connect(rn.imapAddrs, rng, func(addr string) (Result, error) {
				return imapSession(rn.abort, imapTarget{addr: addr, tls: rn.cfg.TLS, user: u.Address, pass: u.Password,
					pick: rng.IntN})
			})
			rn.readerBusy[k].Store(false)
		}
		_ = err // classified into res
		rn.rec.add(res)
	}
}

// chooseOp maps a uniform draw r in [0, 1) to the kind of the next
// request: IMAP with probability imapMix; otherwise SMTP with probability
// smtpMix and POP with 1-smtpMix. With imapMix 0 it is r < smtpMix, as
// before IMAP was added, so a seed gives the same Porcupine run.
func chooseOp(r, smtpMix, imapMix float64) Op {
	if r < imapMix || imapMix >= 1 {
		return OpIMAP
	}
	if (r-imapMix)/(1-imapMix) < smtpMix {
		return OpSMTP
	}
	return OpPOP
}

// maxReaderRedraws bounds the draws for a user without a POP or IMAP
// session in flight; past it the worker waits for the last user drawn.
const maxReaderRedraws = 32

// lockReader draws users until one has no POP or IMAP session in flight
// and marks it busy. RFC 1939 §8 lets a server hold an exclusive lock on a
// maildrop for the length of a session, and one user's mail client does
// not run sessions side by side; without this, the closed loop at high
// concurrency piles dozens of overlapping sessions onto the most popular
// user, each retrieving the same messages (and a POP session would delete
// what an IMAP session of the same user is about to read).
func (rn *runner) lockReader(users *ZipfChooser) int {
	k := 0
	for range maxReaderRedraws {
		k = users.Next()
		if rn.readerBusy[k].CompareAndSwap(false, true) {
			return k
		}
	}
	for !rn.readerBusy[k].CompareAndSwap(false, true) {
		time.Sleep(time.Millisecond)
	}
	return k
}

// Run runs the workload against the servers and reports. It returns when
// the duration is over (or the probe has found the saturation point, or
// ctx is cancelled) and the requests in flight have finished or been cut
// off.
func Run(ctx context.Context, cfg Config) (*Report, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	if _, err := NewZipfChooser(rand.New(rand.NewPCG(0, 0)), len(cfg.Users)); err != nil {
		return nil, err
	}
	stop, stopRun := context.WithTimeout(ctx, cfg.Duration)
	defer stopRun()
	abort, abortRun := context.WithCancel(context.Background())
	defer abortRun()
	// Requests in flight when the run stops get DrainTimeout to finish.
	go func() {
		<-stop.Done()
		select {
		case <-time.After(DrainTimeout):
		case <-ctx.Done():
		}
		abortRun()
	}()

	rec := &recorder{deadline: cfg.Deadline, step: new(Stats)}
	rn := &runner{cfg: cfg, rec: rec, stop: stop, end: stopRun, abort: abort,
		runID:      strconv.FormatInt(time.Now().UnixNano(), 36),
		readerBusy: make([]atomic.Bool, len(cfg.Users)),
		smtpAddrs:  splitAddrs(cfg.SMTPAddr), popAddrs: splitAddrs(cfg.POP3Addr), imapAddrs: splitAddrs(cfg.IMAPAddr)}
	if cfg.Rate > 0 {
		// A burst of one: starts are spread evenly, not bunched at the top
		// of each second.
		rn.pace = rate.NewLimiter(rate.Limit(cfg.Rate), 1)
	}

	cpu0 := takeCPUSample(cfg.ServerPIDs)
	start := time.Now()
	conc := cfg.Concurrency
	if cfg.Probe != nil {
		conc = cfg.Probe.Start
	}
	rn.setConcurrency(conc)

	progressDone := make(chan struct{})
	var progressWG sync.WaitGroup
	progressWG.Add(1)
	go func() {
		defer progressWG.Done()
		rn.progress(start, progressDone)
	}()

	var steps []StepReport
	stepStart := start
	var stepTimer <-chan time.Time
	if cfg.Probe != nil {
		stepTimer = time.After(cfg.Step)
	}
	probeDone := false
	for !probeDone && stop.Err() == nil {
		select {
		case <-stop.Done():
		case <-stepTimer:
			now := time.Now()
			st := rec.swap(true)
			sr := stepReport(conc, now.Sub(stepStart), st, cfg.Probe)
			steps = append(steps, sr)
			stepStart = now
			next, done := cfg.Probe.Next(StepResult{Concurrency: conc, Requests: st.Requests, Misses: st.Misses()})
			if done {
				probeDone = true
				rec.swap(false) // what finishes while draining counts in the total only
				stopRun()
				break
			}
			conc = next
			rn.setConcurrency(conc)
			stepTimer = time.After(cfg.Step)
		}
	}
	rn.setConcurrency(0)
	rn.wg.Wait()
	end := time.Now()
	cpu1 := takeCPUSample(cfg.ServerPIDs)
	close(progressDone)
	progressWG.Wait()

	if st := rec.swap(false); st != nil {
		sr := stepReport(conc, end.Sub(stepStart), st, cfg.Probe)
		sr.Partial = cfg.Probe != nil
		steps = append(steps, sr)
	}
	rec.mu.Lock()
	defer rec.mu.Unlock()
	rep := newReport(cfg, &rec.total, end.Sub(start), steps)
	rep.CPU = cpuReport(cpu0, cpu1, len(cfg.ServerPIDs) > 0)
	rep.Total.Refused = rec.refused.Load()
	rep.StartUnixMS = start.UnixMilli()
	rep.Series = rn.series
	if ctx.Err() != nil {
		rep.Interrupted = true
	}
	return rep, nil
}

// Second is one interval (progressInterval) of a run's per-second series:
// what finished in it. A timeline (a node killed and restarted during the
// run, docs/benchmarks.md) is read from these.
type Second struct {
	// T is the end of the interval in seconds from the start of the run,
	// UnixMS the same instant on the wall clock.
	T          float64 `json:"t_s"`
	UnixMS     int64   `json:"unix_ms"`
	Delivered  int64   `json:"delivered"`
	MsgsPerSec float64 `json:"msgs_per_sec"`
	POP        int64   `json:"pop_sessions"`
	IMAP       int64   `json:"imap_sessions,omitempty"`
	Errors     int64   `json:"errors"`
	// Refused counts the connections that could not be opened before
	// another address of the list answered (a node down).
	Refused int64 `json:"refused_connections,omitempty"`
}

// counts are the running totals the series is cut from.
type counts struct{ delivered, pop, imap, errs, refused int64 }

// second is the interval from (then, prev) to (now, cur).
func second(start, then, now time.Time, prev, cur counts) Second {
	s := Second{T: round2(now.Sub(start).Seconds()), UnixMS: now.UnixMilli(),
		Delivered: cur.delivered - prev.delivered, POP: cur.pop - prev.pop,
		IMAP: cur.imap - prev.imap, Errors: cur.errs - prev.errs, Refused: cur.refused - prev.refused}
	if d := now.Sub(then); d > 0 {
		s.MsgsPerSec = round2(float64(s.Delivered) / d.Seconds())
	}
	return s
}

// progress records the per-second series and, with Config.Progress,
// prints one line per interval, until done.
func (rn *runner) progress(start time.Time, done <-chan struct{}) {
	t := time.NewTicker(progressInterval)
	defer t.Stop()
	var last counts
	lastT := start
	for {
		select {
		case <-done:
			return
		case now := <-t.C:
			cur := counts{rn.rec.delivered.Load(), rn.rec.pop.Load(), rn.rec.imap.Load(), rn.rec.errs.Load(), rn.rec.refused.Load()}
			sec := second(start, lastT, now, last, cur)
			rn.series = append(rn.series, sec)
			d, rate := cur.delivered, sec.MsgsPerSec
			last, lastT = cur, now
			if rn.cfg.Progress == nil {
				continue
			}
			imap := ""
			if rn.cfg.IMAPMix > 0 {
				imap = fmt.Sprintf("  imap %6d", rn.rec.imap.Load())
			}
			fmt.Fprintf(rn.cfg.Progress, "%6.0fs  delivered %8d  %7.1f msg/s  pop %6d%s  errors %5d  concurrency %d\n",
				now.Sub(start).Seconds(), d, rate, rn.rec.pop.Load(), imap, rn.rec.errs.Load(), rn.active.Load())
		}
	}
}

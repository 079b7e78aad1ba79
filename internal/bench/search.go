package bench

import (
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"strconv"
	"strings"
	"time"
)

// Settings of the large-mailbox workload (`quill bench --workload search`).
const (
	// SearchCommandTimeout bounds one timed command. Dovecot's default
	// search reads 100,000 messages in about 3 s and its FTS plugin took
	// 11 s on some searches (docs/benchmarks.md); far above both, so a
	// slow answer is measured rather than cut off.
	SearchCommandTimeout = 5 * time.Minute
	// FillAppendTimeout bounds one APPEND of the fill (FillBatch messages,
	// about 1 MB, each stored durably by the server).
	FillAppendTimeout = 2 * time.Minute
	// FillBatch is how many messages one APPEND carries when the server
	// offers MULTIAPPEND (RFC 3502): about 1 MB, far below the APPEND
	// limits met (Quill's is the 25 MB message size limit; it takes at
	// most 1,000 messages an APPEND), and few enough round trips that the
	// fill runs at the server's speed.
	FillBatch = 500
	// DefaultSettle is how long the workload leaves the server alone
	// between a fill and the timing: what the Go benchmark gives Pebble to
	// flush and compact what the fill wrote, so each server is timed on
	// a mailbox at rest (Dovecot's Maildir of BenchmarkLargeMailboxDovecot
	// is written before Dovecot starts).
	DefaultSettle = 30 * time.Second
	// DefaultSearchRepeat is how many timed runs each command gets.
	DefaultSearchRepeat = 5
	// DefaultSearchWarmup is how many untimed runs go before them (the
	// first search of a user may load indexes).
	DefaultSearchWarmup = 1
)

// SearchConfig describes one run of the large-mailbox workload.
type SearchConfig struct {
	Addr           string
	TLS            *tls.Config // implicit TLS when set
	User, Password string
	// Messages is the size of the INBOX: the first Messages messages of
	// LargeMessage.
	Messages int
	// Fill appends the messages the INBOX lacks (Messages - what it
	// holds) before the timing; without it the INBOX must hold exactly
	// Messages. FillOnly fills and times nothing.
	Fill, FillOnly bool
	// Settle is the pause after a fill that appended something.
	Settle         time.Duration
	Warmup, Repeat int
	// Progress, if set, gets the fill's progress once a second and a line
	// per command timed.
	Progress io.Writer
	// ServerPIDs are the server's processes: the report then says how
	// much CPU the server and the rest of the machine used while each
	// command was timed (a machine shared with other work shows there).
	ServerPIDs []int

	// plainAppend makes the fill use neither MULTIAPPEND nor LITERAL+:
	// tests take the path of a server without them through Quill.
	plainAppend bool
}

// SearchReport is the outcome of one run.
type SearchReport struct {
	Workload string    `json:"workload"`
	Start    time.Time `json:"start"`
	Addr     string    `json:"addr"`
	Greeting string    `json:"greeting"`
	User     string    `json:"user"`
	Messages int       `json:"messages"`
	// Appended is how many messages the fill appended, in FillS seconds,
	// Batch to an APPEND (1 without MULTIAPPEND), with LITERAL+ or not.
	Appended    int     `json:"appended"`
	FillS       float64 `json:"fill_s,omitempty"`
	Batch       int     `json:"batch,omitempty"`
	LiteralPlus bool    `json:"literal_plus"`
	SettleS     float64 `json:"settle_s,omitempty"`
	Warmup      int     `json:"warmup"`
	Repeat      int     `json:"repeat"`
	// Commands are the timed commands; Wrong counts those whose answer
	// does not name as many messages as it should.
	Commands []CommandReport `json:"commands,omitempty"`
	Wrong    int             `json:"wrong_answers"`
	// CPU is the machine's CPU use over the timed runs of every command.
	CPU *CPUReport `json:"cpu,omitempty"`
}

// CommandReport is one command's timing and answer.
type CommandReport struct {
	Command string `json:"command"`
	// Results is how many messages the last answer named; Want how many a
	// correct server names; Varied is set when the runs' answers differed
	// in size.
	Results int            `json:"results"`
	Want    int            `json:"want"`
	Varied  bool           `json:"varied,omitempty"`
	Latency LatencySummary `json:"latency"`
	// CPU is the machine's CPU use during the timed runs.
	CPU *CPUReport `json:"cpu,omitempty"`
}

// Right reports whether the answers named what they should.
func (c CommandReport) Right() bool { return c.Results == c.Want && !c.Varied }

func (cfg *SearchConfig) check() error {
	switch {
	case cfg.Messages < 1:
		return fmt.Errorf("--messages must be at least 1")
	case cfg.User == "":
		return fmt.Errorf("--user is needed")
	case cfg.Warmup < 0:
		return fmt.Errorf("--warmup must not be negative")
	case cfg.Repeat < 1 && !cfg.FillOnly:
		return fmt.Errorf("--repeat must be at least 1")
	case cfg.Settle < 0:
		return fmt.Errorf("--settle must not be negative")
	}
	return nil
}

// RunSearch runs the large-mailbox workload: it fills the user's INBOX if
// asked, then, on a new connection, runs each of LargeCommands Warmup
// times untimed and Repeat times timed, one after the other, and checks
// each answer's size against LargeWant.
func RunSearch(ctx context.Context, cfg SearchConfig) (*SearchReport, error) {
	if err := cfg.check(); err != nil {
		return nil, err
	}
	rep := &SearchReport{Workload: "search", Start: time.Now().UTC(), Addr: cfg.Addr, User: cfg.User,
		Messages: cfg.Messages, Warmup: cfg.Warmup, Repeat: cfg.Repeat}
	if err := fill(ctx, cfg, rep); err != nil {
		return nil, err
	}
	if cfg.FillOnly {
		rep.Repeat, rep.Warmup = 0, 0
		return rep, nil
	}
	if rep.Appended > 0 && cfg.Settle > 0 {
		progressf(cfg.Progress, "leaving the server alone for %v after the fill\n", cfg.Settle)
		select {
		case <-time.After(cfg.Settle):
		case <-ctx.Done():
			return nil, ctx.Err()
		}
		rep.SettleS = cfg.Settle.Seconds()
	}

	c, err := searchLogin(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	rep.Greeting = c.Greeting
	cmds := LargeCommands(cfg.Messages)
	want := LargeWant(cfg.Messages, cmds)
	withServer := len(cfg.ServerPIDs) > 0
	var cpuAll, cpuCmd cpuSample
	for k, cmd := range cmds {
		cr := CommandReport{Command: cmd.Line, Want: want[k]}
		var times []time.Duration
		for run := range cfg.Warmup + cfg.Repeat {
			if ctx.Err() != nil {
				return nil, ctx.Err()
			}
			if run == cfg.Warmup {
				cpuCmd = takeCPUSample(cfg.ServerPIDs)
				if k == 0 {
					cpuAll = cpuCmd
				}
			}
			start := time.Now()
			n, err := c.Run(SearchCommandTimeout, cmd.Line)
			took := time.Since(start)
			if err != nil {
				return nil, err
			}
			if k == 0 && run == 0 && n != cfg.Messages {
				return nil, fmt.Errorf("INBOX of %s at %s holds %d messages, not %d", cfg.User, cfg.Addr, n, cfg.Messages)
			}
			if run > 0 && n != cr.Results {
				cr.Varied = true
			}
			cr.Results = n
			if run >= cfg.Warmup {
				times = append(times, took)
			}
		}
		cr.Latency = Summarize(times)
		cr.CPU = cpuReport(cpuCmd, takeCPUSample(cfg.ServerPIDs), withServer)
		if !cr.Right() {
			rep.Wrong++
		}
		rep.Commands = append(rep.Commands, cr)
		progressf(cfg.Progress, "%s: mean %.1f ms, %d results\n", cmd.Line, cr.Latency.Mean, cr.Results)
	}
	rep.CPU = cpuReport(cpuAll, takeCPUSample(cfg.ServerPIDs), withServer)
	c.Do(RawLoginTimeout, nil, []byte("LOGOUT"))
	return rep, nil
}

func progressf(w io.Writer, format string, args ...any) {
	if w != nil {
		fmt.Fprintf(w, format, args...)
	}
}

// searchLogin connects and logs in.
func searchLogin(ctx context.Context, cfg SearchConfig) (*RawIMAP, error) {
	c, err := DialRawIMAP(ctx, cfg.Addr, cfg.TLS)
	if err != nil {
		return nil, err
	}
	if err := c.Login(cfg.User, cfg.Password); err != nil {
		c.Close()
		return nil, err
	}
	return c, nil
}

// fill counts the messages of the INBOX and appends those it lacks, if
// cfg asks; it fails if the INBOX holds more than cfg.Messages, or fewer
// without cfg.Fill. Messages go FillBatch to an APPEND with MULTIAPPEND
// (fewer if the server's APPENDLIMIT asks), one otherwise; with LITERAL+
// each APPEND is one write, else each message waits for the server's
// continuation request.
func fill(ctx context.Context, cfg SearchConfig, rep *SearchReport) error {
	c, err := searchLogin(ctx, cfg)
	if err != nil {
		return err
	}
	defer c.Close()
	rep.Greeting = c.Greeting
	have := -1
	err = c.Do(RawLoginTimeout, func(line []byte) {
		if n, ok := statusMessages(line); ok {
			have = n
		}
	}, []byte("STATUS INBOX (MESSAGES)"))
	if err != nil {
		return err
	}
	if have < 0 {
		return fmt.Errorf("imap STATUS INBOX: no MESSAGES in the answer")
	}
	n := cfg.Messages
	switch {
	case have > n:
		return fmt.Errorf("INBOX of %s at %s holds %d messages, more than --messages %d", cfg.User, cfg.Addr, have, n)
	case have < n && !cfg.Fill && !cfg.FillOnly:
		return fmt.Errorf("INBOX of %s at %s holds %d messages, not %d (--fill appends the %d missing)", cfg.User, cfg.Addr, have, n, n-have)
	case have == n:
		return nil
	}

	batch, limit := 1, 0
	if c.Has("MULTIAPPEND") && !cfg.plainAppend {
		batch = FillBatch
		for name := range c.Capabilities() {
			if v, ok := strings.CutPrefix(name, "APPENDLIMIT="); ok {
				limit, _ = strconv.Atoi(v)
			}
		}
	}
	literalPlus := c.Has("LITERAL+") && !cfg.plainAppend
	rep.Batch, rep.LiteralPlus = batch, literalPlus
	progressf(cfg.Progress, "filling the INBOX of %s: %d messages to append after the %d it holds, %d an APPEND\n", cfg.User, n-have, have, batch)
	start, lastShown := time.Now(), time.Now()
	for i := have; i < n; {
		if ctx.Err() != nil {
			return ctx.Err()
		}
		chunks := [][]byte{[]byte("APPEND INBOX")}
		size, k := 0, 0
		for ; i+k < n && k < batch; k++ {
			m := LargeMessage(i + k)
			if k > 0 && limit > 0 && size+len(m) > limit {
				break
			}
			size += len(m)
			last := &chunks[len(chunks)-1]
			*last = LargeAppendArgs(append(*last, ' '), i+k, len(m), literalPlus)
			*last = append(*last, '\r', '\n')
			if literalPlus {
				*last = append(*last, m...)
			} else {
				chunks = append(chunks, m)
			}
		}
		if err := c.Do(FillAppendTimeout, nil, chunks...); err != nil {
			return fmt.Errorf("filling the INBOX of %s, messages %d to %d: %w", cfg.User, i+1, i+k, err)
		}
		i += k
		rep.Appended += k
		if time.Since(lastShown) >= progressInterval || i == n {
			lastShown = time.Now()
			el := time.Since(start)
			progressf(cfg.Progress, "%6.0fs  appended %7d of %d  %6.0f msg/s\n", el.Seconds(), i-have, n-have, float64(i-have)/el.Seconds())
		}
	}
	rep.FillS = round2(time.Since(start).Seconds())
	c.Do(RawLoginTimeout, nil, []byte("LOGOUT"))
	return nil
}

// WriteJSON writes the report as indented JSON.
func (r *SearchReport) WriteJSON(w io.Writer) error { return writeIndentedJSON(w, r) }

// WriteText writes the report for people.
func (r *SearchReport) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "quill bench: search workload, INBOX of %s at %s, %d messages", r.User, r.Addr, r.Messages)
	if r.Appended > 0 {
		lit := "synchronizing literals"
		if r.LiteralPlus {
			lit = "LITERAL+"
		}
		fmt.Fprintf(&b, " (%d appended in %.1f s, %d an APPEND, %s)", r.Appended, r.FillS, r.Batch, lit)
	}
	fmt.Fprintf(&b, "\nserver: %s\n", r.Greeting)
	if len(r.Commands) == 0 {
		b.WriteString("filled only, nothing timed\n")
		_, err := io.WriteString(w, b.String())
		return err
	}
	fmt.Fprintf(&b, "%d warm-up and %d timed runs of each command, one after the other, on one connection\n\n", r.Warmup, r.Repeat)
	withCPU := r.CPU != nil && r.CPU.Other != nil
	fmt.Fprintf(&b, "%-36s %9s %9s %10s %10s %10s", "command", "results", "want", "mean ms", "p50 ms", "max ms")
	if withCPU {
		fmt.Fprintf(&b, " %7s %7s", "server", "other")
	}
	b.WriteString("\n")
	for _, c := range r.Commands {
		mark := ""
		if !c.Right() {
			mark = "  WRONG"
			if c.Varied {
				mark += " (answers varied)"
			}
		}
		fmt.Fprintf(&b, "%-36s %9d %9d %10.1f %10.1f %10.1f", c.Command, c.Results, c.Want, c.Latency.Mean, c.Latency.P50, c.Latency.Max)
		if withCPU && c.CPU != nil && c.CPU.Other != nil {
			fmt.Fprintf(&b, " %7.2f %7.2f", *c.CPU.Server, *c.CPU.Other)
		}
		b.WriteString(mark + "\n")
	}
	fmt.Fprintf(&b, "\nwrong answers: %d of %d commands\n", r.Wrong, len(r.Commands))
	if c := r.CPU; c != nil {
		fmt.Fprintf(&b, "CPU over the timed runs, in cores of %d: machine %.2f, this client %.2f", c.Cores, c.Machine, c.Client)
		if c.Other != nil {
			fmt.Fprintf(&b, ", server %.2f, everything else %.2f (the server and other columns above: the same per command)", *c.Server, *c.Other)
		}
		b.WriteString("\n")
	}
	_, err := io.WriteString(w, b.String())
	return err
}

package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
)

// scriptedIMAP is a tiny IMAP server for testing one session: its INBOX
// holds msgs (UIDs 101, 102, ...), it logs the commands it receives, and
// fail makes a command ("LOGIN", "SELECT", "FETCH", "UID FETCH",
// "UID STORE", "LOGOUT") answer "NO" or "BAD", or "hang": read on and never
// answer.
type scriptedIMAP struct {
	l    net.Listener
	msgs []string
	fail map[string]string

	mu   sync.Mutex
	cmds []string
}

func newScriptedIMAP(t *testing.T, msgs []string, fail map[string]string) *scriptedIMAP {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := &scriptedIMAP{l: l, msgs: msgs, fail: fail}
	var conns sync.WaitGroup
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			conns.Add(1)
			go func() { defer conns.Done(); s.serve(c) }()
		}
	}()
	t.Cleanup(func() { l.Close(); conns.Wait() })
	return s
}

func (s *scriptedIMAP) addr() string { return s.l.Addr().String() }

func (s *scriptedIMAP) commands() []string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return append([]string(nil), s.cmds...)
}

func (s *scriptedIMAP) serve(c net.Conn) {
	defer c.Close()
	c.SetDeadline(time.Now().Add(5 * time.Second))
	r := bufio.NewReader(c)
	w := bufio.NewWriter(c)
	out := func(format string, args ...any) { fmt.Fprintf(w, format+"\r\n", args...) }
	// Capabilities in the greeting and the LOGIN reply, as Dovecot sends
	// them, spare the client its own CAPABILITY commands.
	out("* OK [CAPABILITY IMAP4rev1] scripted IMAP ready")
	w.Flush()
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			return
		}
		tag, rest, _ := strings.Cut(strings.TrimRight(line, "\r\n"), " ")
		s.mu.Lock()
		s.cmds = append(s.cmds, rest)
		s.mu.Unlock()
		f := strings.Fields(rest)
		verb := strings.ToUpper(f[0])
		if verb == "UID" {
			verb += " " + strings.ToUpper(f[1])
		}
		switch s.fail[verb] {
		case "NO", "BAD":
			out("%s %s [TEST] %s refused", tag, s.fail[verb], verb)
			w.Flush()
			continue
		case "hang":
			continue
		}
		switch verb {
		case "LOGIN":
			if f[len(f)-1] != "pw" && f[len(f)-1] != `"pw"` {
				out("%s NO [AUTHENTICATIONFAILED] bad password", tag)
				break
			}
			out("%s OK [CAPABILITY IMAP4rev1] LOGIN done", tag)
		case "SELECT":
			out("* %d EXISTS", len(s.msgs))
			out(`* FLAGS (\Seen)`)
			out("* OK [UIDVALIDITY 7] ok")
			out("%s OK [READ-WRITE] SELECT done", tag)
		case "FETCH":
			for i, m := range s.msgs {
				hdr, _, _ := strings.Cut(m, "\r\n\r\n")
				hdr += "\r\n\r\n"
				out("* %d FETCH (UID %d FLAGS () RFC822.SIZE %d BODY[HEADER.FIELDS (FROM SUBJECT DATE)] {%d}\r\n%s)",
					i+1, 101+i, len(m), len(hdr), hdr)
			}
			out("%s OK FETCH done", tag)
		case "UID FETCH", "UID STORE":
			uid, _ := strconv.Atoi(f[2])
			if i := uid - 101; i >= 0 && i < len(s.msgs) {
				if verb == "UID FETCH" {
					out("* %d FETCH (UID %d BODY[] {%d}\r\n%s)", i+1, uid, len(s.msgs[i]), s.msgs[i])
				} else {
					out(`* %d FETCH (UID %d FLAGS (\Seen))`, i+1, uid)
				}
			}
			out("%s OK %s done", tag, verb)
		case "LOGOUT":
			out("* BYE bye")
			out("%s OK LOGOUT done", tag)
			w.Flush()
			return
		default:
			out("%s BAD unknown command", tag)
		}
		w.Flush()
	}
}

// testMessages are three small messages of the bench's format.
func testMessages() []string {
	var msgs []string
	for i := range 3 {
		msgs = append(msgs, fmt.Sprintf("From: a@b.example\r\nTo: u@b.example\r\nSubject: m%d\r\nDate: Mon, 2 Nov 2026 10:00:00 +0000\r\n\r\nbody %d %s\r\n",
			i, i, strings.Repeat("x", 100*i)))
	}
	return msgs
}

func TestIMAPSessionCommands(t *testing.T) {
	msgs := testMessages()
	srv := newScriptedIMAP(t, msgs, nil)
	res, err := imapSession(context.Background(), imapTarget{addr: srv.addr(), user: "u@b.example", pass: "pw",
		pick: func(n int) int {
			if n != 3 {
				t.Errorf("pick(%d), want 3", n)
			}
			return 1
		}})
	if err != nil || res.Err != ErrNone || res.Aborted {
		t.Fatalf("session: %v, %+v", err, res)
	}
	want := []string{
		`LOGIN "u@b.example" "pw"`,
		`SELECT INBOX`,
		`FETCH 1:* (UID FLAGS RFC822.SIZE BODY.PEEK[HEADER.FIELDS ("FROM" "SUBJECT" "DATE")])`,
		`UID FETCH 102 (UID BODY[])`,
		`UID STORE 102 +FLAGS (\Seen)`,
		`LOGOUT`,
	}
	got := srv.commands()
	// go-imap writes FLAGS, RFC822.SIZE (and the like) in map order.
	for i, c := range got {
		got[i] = strings.Replace(c, "(UID RFC822.SIZE FLAGS ", "(UID FLAGS RFC822.SIZE ", 1)
	}
	if strings.Join(got, "\n") != strings.Join(want, "\n") {
		t.Errorf("commands:\n%s\nwant:\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
	if res.Op != OpIMAP || res.IMAP.Listed != 3 || !res.IMAP.BodyFetched || res.IMAP.BodyBytes != int64(len(msgs[1])) {
		t.Errorf("result %+v", res)
	}
	if res.IMAP.HeaderBytes <= 0 {
		t.Errorf("header bytes %d", res.IMAP.HeaderBytes)
	}
	if res.IMAP.Done != 1<<numIMAPSteps-1 {
		t.Errorf("steps done %b", res.IMAP.Done)
	}
	var sum time.Duration
	for _, d := range res.IMAP.Steps {
		if d <= 0 {
			t.Errorf("step times %v", res.IMAP.Steps)
		}
		sum += d
	}
	if sum > res.Latency {
		t.Errorf("steps add up to %v, more than the session's %v", sum, res.Latency)
	}
}

func TestIMAPSessionEmptyInbox(t *testing.T) {
	srv := newScriptedIMAP(t, nil, nil)
	res, _ := imapSession(context.Background(), imapTarget{addr: srv.addr(), user: "u", pass: "pw",
		pick: func(int) int { t.Error("pick called on an empty INBOX"); return 0 }})
	if res.Err != ErrNone || res.IMAP.Listed != 0 || res.IMAP.BodyFetched {
		t.Fatalf("result %+v", res)
	}
	// FETCH 1:* on an empty mailbox is an error for some servers: not sent.
	if got := strings.Join(srv.commands(), "; "); got != `LOGIN "u" "pw"; SELECT INBOX; LOGOUT` {
		t.Errorf("commands %s", got)
	}
	wantDone := uint16(1<<IMAPStepConnect | 1<<IMAPStepLogin | 1<<IMAPStepSelect | 1<<IMAPStepLogout)
	if res.IMAP.Done != wantDone {
		t.Errorf("steps done %b, want %b", res.IMAP.Done, wantDone)
	}
}

// shortIMAPDeadlines sets every step deadline to d for the test.
func shortIMAPDeadlines(t *testing.T, d time.Duration) {
	saved := imapStepTimeouts
	for i := range imapStepTimeouts {
		imapStepTimeouts[i] = d
	}
	t.Cleanup(func() { imapStepTimeouts = saved })
}

func TestIMAPSessionErrors(t *testing.T) {
	shortIMAPDeadlines(t, 300*time.Millisecond)
	closed, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	closedAddr := closed.Addr().String()
	closed.Close()

	for _, tc := range []struct {
		name   string
		fail   map[string]string
		pass   string
		addr   string // instead of the server's
		kind   ErrKind
		step   string // in the error message
		before time.Duration
	}{
		{name: "connect", addr: closedAddr, kind: ErrConnect},
		{name: "bad password", pass: "wrong", kind: ErrIMAPNo, step: "imap login:"},
		{name: "select NO", fail: map[string]string{"SELECT": "NO"}, kind: ErrIMAPNo, step: "imap select:"},
		{name: "fetch BAD", fail: map[string]string{"FETCH": "BAD"}, kind: ErrIMAPBad, step: "imap fetch_headers:"},
		{name: "store NO", fail: map[string]string{"UID STORE": "NO"}, kind: ErrIMAPNo, step: "imap store:"},
		{name: "fetch hangs", fail: map[string]string{"FETCH": "hang"}, kind: ErrTimeout, step: "imap fetch_headers:", before: 2 * time.Second},
		{name: "body hangs", fail: map[string]string{"UID FETCH": "hang"}, kind: ErrTimeout, step: "imap fetch_body:", before: 2 * time.Second},
		{name: "login hangs", fail: map[string]string{"LOGIN": "hang"}, kind: ErrTimeout, step: "imap login:", before: 2 * time.Second},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := newScriptedIMAP(t, testMessages(), tc.fail)
			tgt := imapTarget{addr: srv.addr(), user: "u", pass: "pw", pick: func(n int) int { return n - 1 }}
			if tc.addr != "" {
				tgt.addr = tc.addr
			}
			if tc.pass != "" {
				tgt.pass = tc.pass
			}
			start := time.Now()
			res, _ := imapSession(context.Background(), tgt)
			if res.Err != tc.kind || res.Aborted {
				t.Fatalf("kind %q, want %q (%s)", res.Err, tc.kind, res.ErrMsg)
			}
			if !strings.HasPrefix(res.ErrMsg, tc.step) {
				t.Errorf("message %q, want it to start with %q", res.ErrMsg, tc.step)
			}
			if tc.before > 0 {
				if took := time.Since(start); took > tc.before {
					t.Errorf("took %v", took)
				}
			}
		})
	}
}

// TestIMAPSessionAbort checks that the end of a run cuts a hung session off
// and counts it as aborted, not as an error.
func TestIMAPSessionAbort(t *testing.T) {
	srv := newScriptedIMAP(t, testMessages(), map[string]string{"SELECT": "hang"})
	ctx, cancel := context.WithCancel(context.Background())
	time.AfterFunc(200*time.Millisecond, cancel)
	start := time.Now()
	res, _ := imapSession(ctx, imapTarget{addr: srv.addr(), user: "u", pass: "pw", pick: func(int) int { return 0 }})
	if !res.Aborted || res.Err != ErrNone {
		t.Errorf("result %+v", res)
	}
	if took := time.Since(start); took > 2*time.Second {
		t.Errorf("took %v", took)
	}
}

func TestClassifyIMAP(t *testing.T) {
	for _, tc := range []struct {
		err  error
		want ErrKind
	}{
		{&imap.Error{Type: imap.StatusResponseTypeNo, Text: "no"}, ErrIMAPNo},
		{&imap.Error{Type: imap.StatusResponseTypeBad, Text: "bad"}, ErrIMAPBad},
		{&imapStepError{step: IMAPStepLogin, err: &imap.Error{Type: imap.StatusResponseTypeNo}}, ErrIMAPNo},
		// A NO that arrives as the deadline passes is still a NO.
		{&imapStepError{step: IMAPStepLogin, timedOut: true, err: &imap.Error{Type: imap.StatusResponseTypeNo}}, ErrIMAPNo},
		{&imapStepError{step: IMAPStepSelect, timedOut: true, err: errors.New("in response: i/o timeout")}, ErrTimeout},
		{&imapStepError{step: IMAPStepSelect, err: errors.New("unexpected EOF")}, ErrOther},
		{&imap.Error{Type: imap.StatusResponseTypeBye, Text: "bye"}, ErrOther},
	} {
		if got := classifyIMAP(tc.err); got != tc.want {
			t.Errorf("classifyIMAP(%v) = %q, want %q", tc.err, got, tc.want)
		}
	}
	e := &imapStepError{step: IMAPStepFetchBody, timedOut: true, err: errors.New("x")}
	if e.Error() != "imap fetch_body: x (step deadline passed)" {
		t.Errorf("message %q", e.Error())
	}
}

func TestIMAPStepNames(t *testing.T) {
	if len(IMAPSteps) != int(numIMAPSteps) {
		t.Fatalf("IMAPSteps lists %d of %d steps", len(IMAPSteps), numIMAPSteps)
	}
	seen := map[string]bool{}
	for i, s := range IMAPSteps {
		if int(s) != i || s.String() == "" || seen[s.String()] {
			t.Errorf("step %d: %v", i, s)
		}
		seen[s.String()] = true
		if imapStepTimeouts[s] <= 0 || imapStepTimeouts[s] > SessionTimeout {
			t.Errorf("step %v: deadline %v", s, imapStepTimeouts[s])
		}
	}
}

func TestChooseOp(t *testing.T) {
	// Without IMAP, the draw decides as it did before IMAP was added.
	for _, r := range []float64{0, 0.3, 0.8999, 0.9, 0.95, 0.99999} {
		want := OpPOP
		if r < 0.9 {
			want = OpSMTP
		}
		if got := chooseOp(r, 0.9, 0); got != want {
			t.Errorf("chooseOp(%v, 0.9, 0) = %v", r, got)
		}
	}
	// The IMAP workload: half IMAP, half SMTP, no POP.
	counts := map[Op]int{}
	const n = 10000
	for i := range n {
		counts[chooseOp(float64(i)/n, 1, 0.5)]++
	}
	if counts[OpIMAP] != n/2 || counts[OpSMTP] != n/2 || counts[OpPOP] != 0 {
		t.Errorf("imap workload: %v", counts)
	}
	// 20% IMAP, the rest split 90/10.
	clear(counts)
	for i := range n {
		counts[chooseOp(float64(i)/n, 0.9, 0.2)]++
	}
	near := func(got, want int) bool { return got >= want-1 && got <= want+1 } // float rounding at the edges
	if !near(counts[OpIMAP], 2000) || !near(counts[OpSMTP], 7200) || !near(counts[OpPOP], 800) {
		t.Errorf("20%% IMAP: %v", counts)
	}
	if chooseOp(0.99999, 0.9, 1) != OpIMAP || chooseOp(0, 0, 1) != OpIMAP {
		t.Error("all IMAP")
	}
}

func TestStatsIMAP(t *testing.T) {
	const dl = 2 * time.Second
	var s Stats
	ok := Result{Op: OpIMAP, Latency: 10 * time.Millisecond,
		IMAP: IMAPResult{Listed: 4, BodyFetched: true, BodyBytes: 500, Done: 1<<numIMAPSteps - 1}}
	for i := range ok.IMAP.Steps {
		ok.IMAP.Steps[i] = time.Duration(i+1) * time.Millisecond
	}
	s.Add(ok, dl)
	empty := Result{Op: OpIMAP, Latency: 3 * time.Second,
		IMAP: IMAPResult{Done: 1<<IMAPStepConnect | 1<<IMAPStepLogin | 1<<IMAPStepSelect | 1<<IMAPStepLogout}}
	s.Add(empty, dl)
	s.Add(Result{Op: OpIMAP, Err: ErrIMAPNo, ErrMsg: "imap login: NO"}, dl)
	s.Add(Result{Op: OpIMAP, Err: ErrTimeout}, dl)
	s.Add(Result{Op: OpPOP, Err: ErrTimeout}, dl)
	s.Add(Result{Op: OpSMTP, Latency: time.Millisecond, Delivered: true, BytesSent: 10}, dl)

	var m Stats
	m.Merge(&s)
	for name, st := range map[string]*Stats{"added": &s, "merged": &m} {
		check := func(what string, got, want int64) {
			t.Helper()
			if got != want {
				t.Errorf("%s: %s = %d, want %d", name, what, got, want)
			}
		}
		check("IMAP", st.IMAP, 2)
		check("IMAPListed", st.IMAPListed, 4)
		check("IMAPEmpty", st.IMAPEmpty, 1)
		check("IMAPBodies", st.IMAPBodies, 1)
		check("IMAPBodyBytes", st.IMAPBodyBytes, 500)
		check("Over imap", st.Over[OpIMAP], 1)
		check("imap timeouts", st.OpErrors[OpIMAP][ErrTimeout], 1)
		check("imap NO", st.OpErrors[OpIMAP][ErrIMAPNo], 1)
		check("pop timeouts", st.OpErrors[OpPOP][ErrTimeout], 1)
		check("all timeouts", st.Errors[ErrTimeout], 2)
		check("misses", st.Misses(), 4)
		if l := st.Latency(OpIMAP); l.Count != 2 || l.Max != 3000 {
			t.Errorf("%s: imap latency %+v", name, l)
		}
		if l := st.IMAPStepLatency(IMAPStepFetchBody); l.Count != 1 || l.Max != float64(IMAPStepFetchBody+1) {
			t.Errorf("%s: fetch_body latency %+v", name, l)
		}
		if l := st.IMAPStepLatency(IMAPStepLogout); l.Count != 2 {
			t.Errorf("%s: logout latency %+v", name, l)
		}
	}

	rep := newReport(Config{Mix: 1, IMAPMix: 0.5, Deadline: dl, Sizes: DefaultSizeDist()}, &s, 2*time.Second, nil)
	tot := rep.Total
	if rep.Mix != 0.5 || rep.POPMix != 0 || rep.IMAPMix != 0.5 {
		t.Errorf("shares %v %v %v", rep.Mix, rep.POPMix, rep.IMAPMix)
	}
	if tot.IMAPSessions != 2 || tot.IMAPPerSec != 1 || rep.IMAPPerSec != 1 || tot.IMAPListed != 2 {
		t.Errorf("imap totals %+v", tot)
	}
	if tot.ErrorsByProtocol["imap"]["imap_no"] != 1 || tot.ErrorsByProtocol["imap"]["timeout"] != 1 ||
		tot.ErrorsByProtocol["pop"]["timeout"] != 1 || tot.OverDeadline["imap"] != 1 {
		t.Errorf("errors by protocol %v, over %v", tot.ErrorsByProtocol, tot.OverDeadline)
	}
	if tot.IMAPSteps["fetch_headers"].Count != 1 || len(tot.IMAPSteps) != int(numIMAPSteps) {
		t.Errorf("step latencies %v", tot.IMAPSteps)
	}
	var text strings.Builder
	rep.WriteText(&text)
	for _, want := range []string{"50% IMAP", "IMAP sessions        2 (1.0/s)", "IMAP errors: 2",
		"imap_no 1", "fetch_headers", "1.0 IMAP sessions/s"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q:\n%s", want, text.String())
		}
	}
}

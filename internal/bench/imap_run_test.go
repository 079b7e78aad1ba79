package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"io"
	"log"
	"net"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapserver"
	"github.com/emersion/go-imap/v2/imapserver/imapmemserver"
	"github.com/emersion/go-smtp"
)

// memMail is the in-test mail system of the IMAP run: go-smtp delivers
// into the INBOXes of go-imap's in-memory IMAP server.
type memMail struct {
	users map[string]*imapmemserver.User

	mu                   sync.Mutex
	received             int64
	loginsOK, loginsFail int64
}

type memSMTPSession struct {
	m  *memMail
	to string
}

func (s *memSMTPSession) Reset()                               {}
func (s *memSMTPSession) Logout() error                        { return nil }
func (s *memSMTPSession) Mail(string, *smtp.MailOptions) error { return nil }
func (s *memSMTPSession) Rcpt(to string, _ *smtp.RcptOptions) error {
	s.to = to
	return nil
}

type sizedReader struct {
	*bytes.Reader
}

func (r sizedReader) Size() int64 { return r.Reader.Size() }

func (s *memSMTPSession) Data(r io.Reader) error {
	b, err := io.ReadAll(r)
	if err != nil {
		return err
	}
	if _, err := s.m.users[s.to].Append("INBOX", sizedReader{bytes.NewReader(b)}, &imap.AppendOptions{}); err != nil {
		return err
	}
	s.m.mu.Lock()
	s.m.received++
	s.m.mu.Unlock()
	return nil
}

// countingSession counts the logins of the in-memory server's sessions.
type countingSession struct {
	imapserver.Session
	m *memMail
}

func (s *countingSession) Login(user, pass string) error {
	err := s.Session.Login(user, pass)
	s.m.mu.Lock()
	if err != nil {
		s.m.loginsFail++
	} else {
		s.m.loginsOK++
	}
	s.m.mu.Unlock()
	return err
}

// TestRunIMAPWorkload runs the IMAP workload (half SMTP deliveries, half
// IMAP sessions) for about two seconds against go-smtp and go-imap's
// in-memory server, and checks the report against what the servers saw.
func TestRunIMAPWorkload(t *testing.T) {
	users := GenerateUsers(20, "bench.example", "pw")
	m := &memMail{users: map[string]*imapmemserver.User{}}
	mem := imapmemserver.New()
	for _, u := range users {
		mu := imapmemserver.NewUser(u.Address, "pw")
		if err := mu.Create("INBOX", nil); err != nil {
			t.Fatal(err)
		}
		mem.AddUser(mu)
		m.users[u.Address] = mu
	}
	users[2].Password = "wrong" // user00003: every IMAP login fails

	smtpAddr := fakeSMTP(t, func() smtp.Session { return &memSMTPSession{m: m} })

	il, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	isrv := imapserver.New(&imapserver.Options{
		NewSession: func(*imapserver.Conn) (imapserver.Session, *imapserver.GreetingData, error) {
			return &countingSession{Session: mem.NewSession(), m: m}, nil, nil
		},
		Caps:         imap.CapSet{imap.CapIMAP4rev1: {}},
		InsecureAuth: true,
		Logger:       log.New(io.Discard, "", 0),
	})
	go isrv.Serve(il)
	defer isrv.Close()

	var progress bytes.Buffer
	cfg := Config{
		SMTPAddr:    smtpAddr,
		IMAPAddr:    il.Addr().String(), // no POP3 address: none is needed
		Users:       users,
		Duration:    1500 * time.Millisecond,
		Deadline:    DefaultDeadline,
		Concurrency: 6,
		Mix:         1,
		IMAPMix:     0.5,
		Seed:        7,
		Progress:    &progress,
	}
	rep, err := Run(context.Background(), cfg)
	if err != nil {
		t.Fatal(err)
	}
	tot := rep.Total

	// What the in-memory server holds.
	var stored, unseen int64
	for _, mu := range m.users {
		st, err := mu.Status("INBOX", &imap.StatusOptions{NumMessages: true, NumUnseen: true})
		if err != nil {
			t.Fatal(err)
		}
		stored += int64(*st.NumMessages)
		unseen += int64(*st.NumUnseen)
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	t.Logf("report: %d delivered, %d IMAP sessions (%.1f listed each, %d bodies), errors %v; server: %d received, %d stored, %d seen, logins %d ok %d failed",
		tot.Delivered, tot.IMAPSessions, tot.IMAPListed, tot.IMAPBodies, tot.ErrorsByProtocol["imap"],
		m.received, stored, stored-unseen, m.loginsOK, m.loginsFail)

	if tot.Delivered < 20 || tot.IMAPSessions < 10 {
		t.Fatalf("too little done: %+v", tot)
	}
	eq := func(what string, got, want int64) {
		t.Helper()
		if got != want {
			t.Errorf("%s: got %d, want %d", what, got, want)
		}
	}
	eq("delivered", tot.Delivered, m.received)
	eq("stored", stored, m.received)
	eq("imap NO", tot.ErrorsByProtocol["imap"]["imap_no"], m.loginsFail)
	eq("imap sessions", tot.IMAPSessions, m.loginsOK)
	eq("error count", tot.ErrorCount, m.loginsFail)
	eq("pop sessions", tot.POPSessions, 0)
	eq("requests", tot.Requests, tot.Delivered+tot.IMAPSessions+tot.ErrorCount)
	eq("imap latencies", int64(tot.IMAPLatency.Count), tot.IMAPSessions)
	eq("aborted", tot.Aborted, 0)
	if m.loginsFail == 0 {
		t.Error("the IMAP NO path was not exercised")
	}
	// Every body read set \Seen on one message; some were read twice.
	if seen := stored - unseen; seen < 1 || seen > tot.IMAPBodies {
		t.Errorf("%d messages seen after %d bodies read", seen, tot.IMAPBodies)
	}
	if tot.IMAPBodies+tot.IMAPEmpty != tot.IMAPSessions {
		t.Errorf("%d bodies + %d empty INBOXes != %d sessions", tot.IMAPBodies, tot.IMAPEmpty, tot.IMAPSessions)
	}
	if l := tot.IMAPLatency; !(0 < l.P50 && l.P50 <= l.P90 && l.P90 <= l.P99 && l.P99 <= l.Max) {
		t.Errorf("imap latency %+v", l)
	}
	if s := tot.IMAPSteps["fetch_headers"]; s.Count == 0 || int64(s.Count) > tot.IMAPSessions {
		t.Errorf("fetch_headers %+v", s)
	}
	if rep.IMAPPerSec <= 0 || rep.Mix != 0.5 || rep.IMAPMix != 0.5 || rep.POPMix != 0 {
		t.Errorf("report %v IMAP/s, shares %v/%v/%v", rep.IMAPPerSec, rep.Mix, rep.POPMix, rep.IMAPMix)
	}
	if !strings.Contains(progress.String(), "imap ") {
		t.Errorf("progress:\n%s", progress.String())
	}
	var text, js bytes.Buffer
	rep.WriteText(&text)
	for _, want := range []string{"50% SMTP / 0% POP3 / 50% IMAP", "IMAP errors:", "IMAP sessions/s"} {
		if !strings.Contains(text.String(), want) {
			t.Errorf("text report lacks %q", want)
		}
	}
	t.Logf("report:\n%s", text.String())
	if err := rep.WriteJSON(&js); err != nil {
		t.Fatal(err)
	}
	var back Report
	if err := json.Unmarshal(js.Bytes(), &back); err != nil || back.Total.IMAPSessions != tot.IMAPSessions {
		t.Errorf("JSON report: %v", err)
	}
}

func TestConfigCheckAddresses(t *testing.T) {
	base := Config{Users: GenerateUsers(1, "b", "p"), Duration: time.Second, Deadline: time.Second, Concurrency: 1}
	for _, tc := range []struct {
		name             string
		smtp, pop3, imap string
		mix, imapMix     float64
		ok               bool
	}{
		{"porcupine", "s", "p", "", 0.9, 0, true},
		{"porcupine without POP3", "s", "", "", 0.9, 0, false},
		{"imap workload", "s", "", "i", 1, 0.5, true},
		{"imap workload without IMAP", "s", "", "", 1, 0.5, false},
		{"imap only", "", "", "i", 0.9, 1, true},
		{"mixed without POP3", "s", "", "i", 0.9, 0.5, false},
		{"imap mix above 1", "s", "p", "i", 0.9, 1.5, false},
		{"negative imap mix", "s", "p", "i", 0.9, -0.1, false},
	} {
		cfg := base
		cfg.SMTPAddr, cfg.POP3Addr, cfg.IMAPAddr, cfg.Mix, cfg.IMAPMix = tc.smtp, tc.pop3, tc.imap, tc.mix, tc.imapMix
		if err := cfg.check(); (err == nil) != tc.ok {
			t.Errorf("%s: %v", tc.name, err)
		}
	}
}

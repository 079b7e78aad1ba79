package bench

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// quillListenRE matches the lines `quill serve` prints on stdout once a
// listener accepts connections.
var quillListenRE = regexp.MustCompile(`^quill: (SMTPS?|POP3S?|IMAPS?|HTTP) listening on (\S+)\s*$`)

// parseListenLine returns the protocol and address of a "listening on"
// line.
func parseListenLine(line string) (proto, addr string, ok bool) {
	m := quillListenRE.FindStringSubmatch(line)
	if m == nil {
		return "", "", false
	}
	return m[1], m[2], true
}

func TestParseListenLine(t *testing.T) {
	for line, want := range map[string][2]string{
		"quill: IMAP listening on 127.0.0.1:40001":   {"IMAP", "127.0.0.1:40001"},
		"quill: SMTP listening on 127.0.0.1:2525\r":  {"SMTP", "127.0.0.1:2525"},
		"quill: HTTP listening on [::1]:8025":        {"HTTP", "[::1]:8025"},
		"quill: CLUSTER listening on 127.0.0.1:7946": {},
		"quill: node n1 ready, data in /tmp/x":       {},
	} {
		p, a, ok := parseListenLine(line)
		if ok != (want[0] != "") || p != want[0] || a != want[1] {
			t.Errorf("%q: %q %q %v", line, p, a, ok)
		}
	}
}

// quillBin builds `quill` once per test process; it skips the test when
// the build fails (other packages may be mid-change).
func quillBin(t *testing.T) string {
	quillBuild.once.Do(func() {
		dir, err := os.MkdirTemp("", "quill-bench-test-")
		if err != nil {
			quillBuild.err = err
			return
		}
		quillBuild.bin = filepath.Join(dir, "quill")
		out, err := exec.Command("go", "build", "-o", quillBuild.bin, "github.com/quillmail/quill/cmd/quill").CombinedOutput()
		if err != nil {
			quillBuild.err = fmt.Errorf("%v\n%s", err, out)
		}
	})
	if quillBuild.err != nil {
		t.Skipf("building quill failed, skipping: %v", quillBuild.err)
	}
	return quillBuild.bin
}

// TestMain removes the quill binary quillBin built.
func TestMain(m *testing.M) {
	code := m.Run()
	if quillBuild.bin != "" {
		os.RemoveAll(filepath.Dir(quillBuild.bin))
	}
	os.Exit(code)
}

var quillBuild struct {
	once sync.Once
	bin  string
	err  error
}

// startQuill starts `quill serve` with every listener on a free loopback
// port and returns the listeners' addresses by protocol ("SMTP", "IMAP",
// "HTTP", ...), its data directory and its PID. The server is stopped by
// its PID when the test ends. It skips with -short.
func startQuill(t *testing.T) (addrs map[string]string, data string, pid int) {
	if testing.Short() {
		t.Skip("builds and runs quill serve")
	}
	bin := quillBin(t)
	dir := t.TempDir()
	data = filepath.Join(dir, "data")
	srv := exec.Command(bin, "serve", "--data", data, "--smtps", "127.0.0.1:0", "--imaps", "127.0.0.1:0", "--pop3s", "127.0.0.1:0", "--submission=",
		"--smtp", "127.0.0.1:0", "--pop3", "127.0.0.1:0",
		"--imap", "127.0.0.1:0", "--http", "127.0.0.1:0", "--hostname", "bench-test.localdomain")
	stdout, err := srv.StdoutPipe()
	if err != nil {
		t.Fatal(err)
	}
	logFile, err := os.Create(filepath.Join(dir, "serve.log"))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { logFile.Close() })
	srv.Stderr = logFile
	if err := srv.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan error, 1)
	go func() { exited <- srv.Wait() }()
	t.Cleanup(func() {
		srv.Process.Signal(syscall.SIGTERM)
		select {
		case <-exited:
		case <-time.After(15 * time.Second):
			srv.Process.Kill()
			<-exited
			t.Error("quill serve did not stop within 15 s of SIGTERM")
		}
		if t.Failed() {
			if b, err := os.ReadFile(logFile.Name()); err == nil {
				t.Logf("quill serve stderr (tail):\n%s", tail(string(b), 3000))
			}
		}
	})

	addrs = map[string]string{}
	lines := make(chan string)
	go func() {
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
		close(lines)
		io.Copy(io.Discard, stdout)
	}()
	timeout := time.After(30 * time.Second)
wait:
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				t.Fatalf("quill serve exited before it was ready: %v", <-exited)
			}
			if p, a, ok := parseListenLine(line); ok {
				addrs[p] = a
			}
			if strings.Contains(line, " ready") {
				break wait
			}
		case <-timeout:
			t.Fatalf("quill serve not ready after 30 s; listening on %v", addrs)
		}
	}
	go func() {
		for range lines {
		}
	}()
	for _, p := range []string{"SMTP", "POP3", "IMAP", "HTTP", "SMTPS", "POP3S", "IMAPS"} {
		if addrs[p] == "" {
			t.Fatalf("no %s listener among %v", p, addrs)
		}
	}
	return addrs, data, srv.Process.Pid
}

// createUsers creates users through the admin API of the quill serve
// whose data directory is data.
func createUsers(t *testing.T, ctx context.Context, httpAddr, data string, users []User) {
	tok, err := os.ReadFile(filepath.Join(data, "admin.token"))
	if err != nil {
		t.Fatal(err)
	}
	if _, err := (&Creator{BaseURL: "http://" + httpAddr, Token: strings.TrimSpace(string(tok)), Parallel: 4}).Create(ctx, users); err != nil {
		t.Fatalf("creating users: %v", err)
	}
}

// TestRunAgainstQuill starts `quill serve` and runs the Porcupine workload
// with a 30% IMAP mix against it for about three seconds.
func TestRunAgainstQuill(t *testing.T) {
	addrs, data, pid := startQuill(t)
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	users := GenerateUsers(30, "bench.example", "benchpass")
	createUsers(t, ctx, addrs["HTTP"], data, users)

	rep, err := Run(ctx, Config{
		SMTPAddr:    addrs["SMTP"],
		POP3Addr:    addrs["POP3"],
		IMAPAddr:    addrs["IMAP"],
		Users:       users,
		Duration:    3 * time.Second,
		Deadline:    DefaultDeadline,
		Concurrency: 4,
		Mix:         SMTPShare,
		IMAPMix:     0.3,
		Seed:        1,
		ServerPIDs:  []int{pid},
	})
	if err != nil {
		t.Fatal(err)
	}
	var text strings.Builder
	rep.WriteText(&text)
	t.Logf("report:\n%s", text.String())
	tot := rep.Total
	if tot.Delivered == 0 || tot.POPSessions == 0 || tot.IMAPSessions == 0 {
		t.Errorf("delivered %d, POP sessions %d, IMAP sessions %d", tot.Delivered, tot.POPSessions, tot.IMAPSessions)
	}
	if tot.ErrorCount != 0 {
		t.Errorf("errors %v, first of each kind %v", tot.Errors, tot.ErrorSamples)
	}
	if tot.IMAPBodies == 0 || tot.IMAPListed == 0 {
		t.Errorf("IMAP sessions read %d bodies, listed %.1f messages each", tot.IMAPBodies, tot.IMAPListed)
	}
	if tot.TLS != nil {
		t.Errorf("a run without --tls reports TLS handshakes: %+v", tot.TLS)
	}

	// The same over implicit TLS, returning clients resuming (--tls).
	rep, err = Run(ctx, Config{
		SMTPAddr: addrs["SMTPS"], POP3Addr: addrs["POP3S"], IMAPAddr: addrs["IMAPS"], Users: users,
		Duration: 2 * time.Second, Deadline: DefaultDeadline, Concurrency: 4, Mix: SMTPShare, IMAPMix: 0.3, Seed: 2,
		TLS: &tls.Config{InsecureSkipVerify: true, ClientSessionCache: tls.NewLRUClientSessionCache(64)},
	})
	if err != nil {
		t.Fatal(err)
	}
	text.Reset()
	rep.WriteText(&text)
	t.Logf("report over TLS:\n%s", text.String())
	tot = rep.Total
	if tot.ErrorCount != 0 || tot.Delivered == 0 || tot.IMAPSessions == 0 || tot.POPSessions == 0 {
		t.Errorf("over TLS: delivered %d, POP %d, IMAP %d, errors %v %v", tot.Delivered, tot.POPSessions, tot.IMAPSessions, tot.Errors, tot.ErrorSamples)
	}
	if tot.TLS == nil || tot.TLS.Full == 0 || tot.TLS.Resumed == 0 || !strings.Contains(text.String(), "TLS handshake") {
		t.Errorf("TLS handshakes %+v: want full ones and resumed ones, in the report", tot.TLS)
	}
}

func tail(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return "..." + s[len(s)-n:]
}

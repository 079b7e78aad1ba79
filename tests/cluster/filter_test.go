package cluster_test

import (
	"errors"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/emersion/go-imap/v2"
	"github.com/emersion/go-imap/v2/imapclient"
	gosmtp "github.com/emersion/go-smtp"
	"github.com/quillmail/quill/internal/sns"
)

// startRspamd runs a real rspamd (Debian's) with one normal worker on a
// free port and no outside DNS, and returns its base URL. Its compiled
// regular expressions are kept between runs (the first start compiles
// them for a while).
func startRspamd(t *testing.T) string {
	bin, err := exec.LookPath("rspamd")
	if err != nil {
		fatalf(t, "rspamd is not installed: apt-get install rspamd (scripts/test-deps.sh does)")
	}
	dir := t.TempDir()
	cache := filepath.Join(os.TempDir(), "quill-test-rspamd-cache")
	os.MkdirAll(cache, 0o777)
	os.MkdirAll(filepath.Join(dir, "local"), 0o755)
	addr := freeAddr(t)
	conf := fmt.Sprintf(`.include "$CONFDIR/common.conf"
options {
    pidfile = "$RUNDIR/rspamd.pid";
    .include "$CONFDIR/options.inc"
    dns { nameserver = ["127.0.0.1:1"]; timeout = 1s; retransmits = 1; }
}
logging { type = "file"; filename = "$LOGDIR/rspamd.log"; level = "warning"; }
worker "normal" {
    bind_socket = "%s";
    .include "$CONFDIR/worker-normal.inc"
    count = 1;
}
`, addr)
	cfgFile := filepath.Join(dir, "rspamd.conf")
	os.WriteFile(cfgFile, []byte(conf), 0o644)
	args := []string{"-f", "-i", "-c", cfgFile, "--var", "CONFDIR=/etc/rspamd", "--var", "RUNDIR=" + dir,
		"--var", "DBDIR=" + cache, "--var", "LOGDIR=" + dir, "--var", "LOCAL_CONFDIR=" + filepath.Join(dir, "local")}
	if os.Geteuid() == 0 {
		args = append(args, "-u", "root", "-g", "root")
	}
	cmd := exec.Command(bin, args...)
	logf, _ := os.Create(filepath.Join(dir, "stderr.log"))
	cmd.Stdout, cmd.Stderr = logf, logf
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL, Setpgid: true}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
		cmd.Wait()
		if t.Failed() {
			out, _ := os.ReadFile(filepath.Join(dir, "rspamd.log"))
			t.Logf("rspamd log:\n%s", tail(string(out), 30))
		}
	})
	url := "http://" + addr
	took := waitFor(t, "rspamd to answer", 180*time.Second, func() bool {
		r, err := http.Get(url + "/ping")
		if err != nil {
			return false
		}
		r.Body.Close()
		return r.StatusCode == http.StatusOK
	})
	t.Logf("rspamd answers after %v", took.Round(100*time.Millisecond))
	return url
}

// gtube is the standard test string every spam filter rejects.
const gtube = "XJS*C4JDBQADN1.NSBN3*2IDNEN*GTUBE-STANDARD-ANTI-UBE-TEST-EMAIL*C.34X\r\n"

// headerOf returns the header of the message with the subject, from INBOX
// or Junk.
func (n *Node) headerOf(user, pw, subject string) (string, string, error) {
	c, err := imapclient.DialInsecure(n.Addrs["imap"], nil)
	if err != nil {
		return "", "", err
	}
	defer c.Close()
	if err := c.Login(user, pw).Wait(); err != nil {
		return "", "", err
	}
	for _, box := range []string{"INBOX", "Junk"} {
		sel, err := c.Select(box, nil).Wait()
		if err != nil || sel.NumMessages == 0 {
			continue
		}
		sec := &imap.FetchItemBodySection{Specifier: imap.PartSpecifierHeader, Peek: true}
		var all imap.SeqSet
		all.AddRange(1, 0)
		msgs, err := c.Fetch(all, &imap.FetchOptions{BodySection: []*imap.FetchItemBodySection{sec}}).Collect()
		if err != nil {
			return "", "", err
		}
		for _, m := range msgs {
			h := string(m.FindBodySection(sec))
			if strings.Contains(h, "Subject: "+subject+"\r\n") {
				return h, box, nil
			}
		}
	}
	return "", "", fmt.Errorf("no message %q in INBOX or Junk", subject)
}

// The inbound checks run in SNS filter worker processes: with a real
// rspamd behind them, the GTUBE message is refused with 550 5.7.1 and a
// plain one arrives with its Authentication-Results and X-Spam-Score; a
// filter worker killed with SIGKILL is restarted and mail is still
// checked.
func TestFilterWorkersCheckInboundMailWithRspamd(t *testing.T) {
	url := startRspamd(t)
	nodes := startClusterWith(t, 1, "--rspamd", url, "--filter-workers", "1")
	n := nodes[0]
	const user = "filtered@cluster.example"
	n.createUser(t, user, "pw")

	err := n.sendBody(user, "gtube", gtube)
	var se *gosmtp.SMTPError
	if !errors.As(err, &se) || se.Code != 550 || se.EnhancedCode != (gosmtp.EnhancedCode{5, 7, 1}) {
		fatalf(t, "GTUBE through the node: %v; want 550 5.7.1", err)
	}
	t.Logf("GTUBE refused: %v", err)

	check := func(subject string) {
		t.Helper()
		if err := n.send(user, subject); err != nil {
			fatalf(t, "plain message %q: %v", subject, err)
		}
		var h, box string
		waitFor(t, subject+" to arrive", 15*time.Second, func() bool {
			var err error
			h, box, err = n.headerOf(user, "pw", subject)
			return err == nil
		})
		if !strings.Contains(h, "Authentication-Results: ") || !strings.Contains(h, "X-Spam-Score: ") {
			errorf(t, "%q arrived in %s without the checks' header fields:\n%s", subject, box, h)
		}
		t.Logf("%q in %s, %s", subject, box, strings.SplitN(h[strings.Index(h, "X-Spam-Score: "):], "\r\n", 2)[0])
	}
	check("plain")

	pool := func() sns.Status { return poolOf(n, sns.FilterClass) }
	st := pool()
	if st.Launches == 0 || len(st.Workers) == 0 || st.Workers[0].PID == 0 {
		fatalf(t, "filter pool %+v: want a worker that did the checks", st)
	}
	victim := st.Workers[0]
	syscall.Kill(victim.PID, syscall.SIGKILL)
	waitFor(t, "the filter worker to be restarted", 10*time.Second, func() bool {
		for _, w := range pool().Workers {
			if w.ID == victim.ID && w.Alive && w.PID != victim.PID {
				return true
			}
		}
		return false
	})
	check("after the kill")
}

package sns

import (
	"context"
	"errors"
	"net"
	"os/exec"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/mailauth"
)

// TestFilterFallsBackToTheNode: when no filter worker answers (none can
// be launched, or the one reached fails the task) the node checks the
// message itself at once, so mail is neither held up nor let in
// unchecked.
func TestFilterFallsBackToTheNode(t *testing.T) {
	noDNS := &net.Resolver{PreferGo: true, Dial: func(context.Context, string, string) (net.Conn, error) {
		return nil, errors.New("no DNS in this test")
	}}
	fallback := &mailauth.Checker{Hostname: "node.test", Resolver: noDNS}
	msg := []byte("From: a@b.test\r\nSubject: x\r\n\r\nx\r\n")

	dead := NewPool(Config{Class: FilterClass, Max: 1, Dir: t.TempDir(), Command: func(string) *exec.Cmd {
		return exec.Command("/nonexistent/quill-worker")
	}})
	t.Cleanup(dead.Close)
	relayOnly := testPool(t, 1) // its worker answers filter tasks with Unimplemented

	for name, p := range map[string]*Pool{"no worker can start": dead, "the worker fails the task": relayOnly} {
		ctx, cancel := context.WithTimeout(context.Background(), 2*chooseTimeout)
		start := time.Now()
		v := Filter{Pool: p, Fallback: fallback}.Check(ctx, net.ParseIP("192.0.2.1"), "helo.test", "a@b.test", []string{"c@d.test"}, msg)
		cancel()
		if !strings.HasPrefix(v.Header, "Authentication-Results: node.test;") || !strings.Contains(v.Header, "dmarc=") {
			t.Errorf("%s: verdict %+v, want the node's own checks", name, v)
		}
		// A worker that cannot start is not waited for (chooseTimeout is
		// 30 s): every message would wait that long.
		if took := time.Since(start); took > launchTimeout/2 {
			t.Errorf("%s: the node checked the message only after %v", name, took)
		}
	}
}

package sns

import (
	"context"
	"os"
	"os/exec"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/queue"
)

// The test binary doubles as a relay worker: with QUILL_SNS_TEST_SOCKET
// set it serves tasks there, delivering nothing and answering 250.
func TestMain(m *testing.M) {
	if socket := os.Getenv("QUILL_SNS_TEST_SOCKET"); socket != "" {
		if err := ServeRelay(socket, fakeRemote{}); err != nil {
			os.Exit(1)
		}
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// fakeRemote delivers nothing; QUILL_SNS_TEST_DELAY makes each task take
// that long, one task at a time (a worker with a queue, the experiment's
// service time).
type fakeRemote struct{}

var serviceMu sync.Mutex

func (fakeRemote) Deliver(ctx context.Context, domain, from string, rcpts []string, body []byte) []queue.Result {
	if d, err := time.ParseDuration(os.Getenv("QUILL_SNS_TEST_DELAY")); err == nil && d > 0 {
		serviceMu.Lock()
		time.Sleep(d)
		serviceMu.Unlock()
	}
	out := make([]queue.Result, len(rcpts))
	for i, r := range rcpts {
		out[i] = queue.Result{Rcpt: r, Delivered: true, Code: 250, Text: "ok " + domain}
	}
	return out
}

func testPool(t *testing.T, max int) *Pool {
	return testPoolWith(t, Config{Max: max}, 0)
}

// testPoolWith starts a pool of test-binary workers whose tasks take
// delay each.
func testPoolWith(t *testing.T, cfg Config, delay time.Duration) *Pool {
	exe, err := os.Executable()
	if err != nil {
		t.Fatal(err)
	}
	cfg.Class, cfg.Dir = RelayClass, t.TempDir()
	cfg.Command = func(socket string) *exec.Cmd {
		cmd := exec.Command(exe, "-test.run=^$")
		cmd.Env = append(os.Environ(), "QUILL_SNS_TEST_SOCKET="+socket, "QUILL_SNS_TEST_DELAY="+delay.String())
		return cmd
	}
	p := NewPool(cfg)
	t.Cleanup(p.Close)
	return p
}

// TestPoolLaunchesOnDemandAndRestartsADeadWorker: no worker runs until the
// first task; a worker killed with SIGKILL is running again within 2 s,
// and tasks go on.
func TestPoolLaunchesOnDemandAndRestartsADeadWorker(t *testing.T) {
	p := testPool(t, 2)
	if st := p.Status(); len(st.Workers) != 0 {
		t.Fatalf("workers before any task: %+v", st)
	}
	relay := Relay{Pool: p}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	r := relay.Deliver(ctx, "remote.test", "a@x", []string{"b@remote.test"}, []byte("x"))
	if len(r) != 1 || !r[0].Delivered || r[0].Text != "ok remote.test" {
		t.Fatalf("first task: %+v", r)
	}
	st := p.Status()
	if len(st.Workers) != 1 || st.Launches != 1 || st.Workers[0].PID == 0 {
		t.Fatalf("after the first task: %+v", st)
	}
	pid := st.Workers[0].PID
	syscall.Kill(pid, syscall.SIGKILL)
	start := time.Now()
	for {
		st = p.Status()
		if len(st.Workers) == 1 && st.Workers[0].Alive && st.Workers[0].PID != pid {
			break
		}
		if time.Since(start) > 2*time.Second {
			t.Fatalf("not restarted within 2s: %+v", st)
		}
		time.Sleep(20 * time.Millisecond)
	}
	if st.Restarts != 1 {
		t.Errorf("restarts %d, want 1", st.Restarts)
	}
	if r := relay.Deliver(ctx, "remote.test", "a@x", []string{"c@remote.test"}, []byte("x")); !r[0].Delivered {
		t.Fatalf("after the restart: %+v", r)
	}
}

// TestPoolAutoLaunchesUnderLoad: when every worker's load (with the
// correction for tasks just dispatched) is past the threshold, the pool
// starts another worker, up to Max.
func TestPoolAutoLaunchesUnderLoad(t *testing.T) {
	p := testPool(t, 2)
	p.cfg.Threshold = 1
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	if _, err := p.choose(ctx); err != nil { // launches the first, counts one task on it
		t.Fatal(err)
	}
	p.mu.Lock()
	p.lastLaunch = time.Now().Add(-holdOff - time.Second) // past the hold-off
	p.mu.Unlock()
	if _, err := p.choose(ctx); err != nil {
		t.Fatal(err)
	}
	if st := p.Status(); st.Launches != 2 || len(st.Workers) != 2 {
		t.Fatalf("after a task on a worker at the threshold: %+v", st)
	}
}

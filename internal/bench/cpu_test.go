//go:build linux

package bench

import (
	"os"
	"testing"
	"time"
)

func TestCPUReport(t *testing.T) {
	pid := os.Getpid()
	a := takeCPUSample([]int{pid})
	// Burn some CPU in this process.
	x := 0
	for deadline := time.Now().Add(200 * time.Millisecond); time.Now().Before(deadline); {
		for i := range 1000 {
			x += i
		}
	}
	_ = x
	b := takeCPUSample([]int{pid})
	r := cpuReport(a, b, true)
	if r == nil {
		t.Fatal("no report on Linux")
	}
	if r.Client < 0.3 || r.Client > float64(r.Cores)+0.1 || r.Machine <= 0 || r.Server == nil || *r.Server < 0.3 {
		t.Errorf("report %+v server %v", r, *r.Server)
	}
	if cpuReport(b, a, false) != nil {
		t.Error("backwards samples gave a report")
	}
}

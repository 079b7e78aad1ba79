//go:build !unix

package bench

import "time"

// CPUReport is the CPU use during a run; not measured on this platform.
type CPUReport struct {
	Cores   int      `json:"cores"`
	Machine float64  `json:"machine_cores"`
	Client  float64  `json:"bench_client_cores"`
	Server  *float64 `json:"server_cores,omitempty"`
	Other   *float64 `json:"other_cores,omitempty"`
}

type cpuSample struct{ at time.Time }

func takeCPUSample([]int) cpuSample               { return cpuSample{at: time.Now()} }
func cpuReport(_, _ cpuSample, _ bool) *CPUReport { return nil }

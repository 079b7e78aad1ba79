//go:build unix

package bench

import (
	"bytes"
	"os"
	"path/filepath"
	"runtime"
	"strconv"
	"syscall"
	"time"
)

// clockTicks is USER_HZ, the unit of /proc CPU times; 100 on every Linux
// platform Go supports.
const clockTicks = 100

// cpuSample is a snapshot of CPU use, taken at the start and the end of a
// run so the report can say whether the machine was shared.
type cpuSample struct {
	at          time.Time
	busy, total uint64 // machine-wide jiffies from /proc/stat
	client      time.Duration
	server      uint64 // jiffies of the server process trees
	ok          bool   // /proc/stat was readable
}

// CPUReport is the CPU use during a run, in cores (1.0 = one core busy for
// the whole run). Server and Other are set only when the server's process
// ids were given; Other is what the rest of the machine used.
type CPUReport struct {
	Cores   int      `json:"cores"`
	Machine float64  `json:"machine_cores"`
	Client  float64  `json:"bench_client_cores"`
	Server  *float64 `json:"server_cores,omitempty"`
	Other   *float64 `json:"other_cores,omitempty"`
}

func takeCPUSample(serverPIDs []int) cpuSample {
	s := cpuSample{at: time.Now()}
	var ru syscall.Rusage
	if syscall.Getrusage(syscall.RUSAGE_SELF, &ru) == nil {
		s.client = time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
	}
	if b, err := os.ReadFile("/proc/stat"); err == nil {
		line, _, _ := bytes.Cut(b, []byte("\n"))
		f := bytes.Fields(line)
		if len(f) > 5 && string(f[0]) == "cpu" {
			for i, x := range f[1:] {
				v, _ := strconv.ParseUint(string(x), 10, 64)
				if i == 8 || i == 9 { // guest time is already in user
					continue
				}
				s.total += v
				if i != 3 && i != 4 { // idle, iowait
					s.busy += v
				}
			}
			s.ok = true
		}
	}
	if len(serverPIDs) > 0 {
		s.server = treeJiffies(serverPIDs)
	}
	return s
}

// treeJiffies sums the CPU time of the given processes and their
// descendants, including children they have already reaped (cutime,
// cstime), so that short-lived workers (Postfix's smtpd, Dovecot's pop3)
// are counted.
func treeJiffies(roots []int) uint64 {
	type proc struct {
		ppid int
		cpu  uint64
	}
	procs := map[int]proc{}
	paths, _ := filepath.Glob("/proc/[0-9]*/stat")
	for _, p := range paths {
		b, err := os.ReadFile(p)
		if err != nil {
			continue
		}
		i := bytes.LastIndexByte(b, ')')
		if i < 0 {
			continue
		}
		f := bytes.Fields(b[i+1:])
		if len(f) < 15 {
			continue
		}
		pid, _ := strconv.Atoi(filepath.Base(filepath.Dir(p)))
		ppid, _ := strconv.Atoi(string(f[1]))
		var cpu uint64
		for _, x := range f[11:15] { // utime stime cutime cstime
			v, _ := strconv.ParseUint(string(x), 10, 64)
			cpu += v
		}
		procs[pid] = proc{ppid: ppid, cpu: cpu}
	}
	in := map[int]bool{}
	for _, r := range roots {
		in[r] = true
	}
	var sum uint64
	for pid, p := range procs {
		for q, depth := pid, 0; q > 1 && depth < 64; q, depth = procs[q].ppid, depth+1 {
			if in[q] {
				sum += p.cpu
				break
			}
		}
	}
	return sum
}

// cpuReport compares two samples; nil if /proc was not readable.
func cpuReport(a, b cpuSample, withServer bool) *CPUReport {
	if !a.ok || !b.ok || b.total <= a.total {
		return nil
	}
	secs := b.at.Sub(a.at).Seconds()
	if secs <= 0 {
		return nil
	}
	cores := runtime.NumCPU()
	// Machine-wide jiffies count all cores, so scale by the core count.
	machine := float64(b.busy-a.busy) / float64(b.total-a.total) * float64(cores)
	r := &CPUReport{
		Cores:   cores,
		Machine: round2(machine),
		Client:  round2((b.client - a.client).Seconds() / secs),
	}
	if withServer {
		srv := round2(float64(b.server-a.server) / clockTicks / secs)
		other := round2(max(machine-r.Client-srv, 0))
		r.Server, r.Other = &srv, &other
	}
	return r
}

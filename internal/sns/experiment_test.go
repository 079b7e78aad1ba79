package sns

import (
	"context"
	"fmt"
	"image"
	"image/color"
	"image/png"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/nodepb"
)

// TestSNSExperiment is the experiment of SNS §5.1 on real worker processes
// (docs/benchmarks.md has the figures). It runs only when
// QUILL_SNS_EXPERIMENT names a directory, where it writes the plot:
//
//	QUILL_SNS_EXPERIMENT=docs go test -count=1 -v -run TestSNSExperiment ./internal/sns
//
// Fig. 2: four relay workers, each task taking 50 ms (20 tasks/s per
// worker, one at a time), a stream of 72 tasks/s (90% of capacity) dispatched by lottery while load reports
// come every 2 s; each worker's queue is sampled every 100 ms, without the
// correction of §3.3.2 and with it. Table 1: offered load rising in steps
// while auto-launch adds workers (threshold 3 pending tasks, hold-off 5 s).
func TestSNSExperiment(t *testing.T) {
	dir := os.Getenv("QUILL_SNS_EXPERIMENT")
	if dir == "" {
		t.Skip("QUILL_SNS_EXPERIMENT not set: the experiment of docs/benchmarks.md")
	}
	const (
		workers  = 4
		service  = 50 * time.Millisecond
		rate     = 72
		duration = 12 * time.Second
		sample   = 100 * time.Millisecond
	)
	var panels [][][]int
	for _, correct := range []bool{false, true} {
		p := testPoolWith(t, Config{Max: workers, Threshold: 1 << 30, NoCorrection: !correct, ReportInterval: 2 * time.Second}, service)
		startWorkers(t, p, workers)
		series := run(t, p, rate, duration, sample)
		panels = append(panels, series)
		spread, peak := imbalance(series)
		t.Logf("Fig. 2, correction %v: mean spread between the longest and shortest worker queue %.2f tasks, longest queue %d", correct, spread, peak)
		p.Close()
	}
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Fatal(err)
	}
	path := filepath.Join(dir, "sns-fig2.png")
	if err := plot(path, panels); err != nil {
		t.Fatal(err)
	}
	t.Logf("plot: %s (left: without the correction, right: with it; one line per worker, queue length over %v)", path, duration)

	// Table 1: auto-launch as the offered load rises.
	p := testPoolWith(t, Config{Max: 8, Threshold: 3}, 100*time.Millisecond)
	var rows []string
	for _, r := range []int{5, 10, 20, 40, 60} {
		run(t, p, r, 8*time.Second, time.Second)
		st := p.Status()
		rows = append(rows, fmt.Sprintf("| %d tasks/s | %d | %d |", r, len(st.Workers), st.Launches))
	}
	t.Logf("Table 1 (each task 100 ms, threshold 3 pending, hold-off %v):\n| offered load | workers | launches so far |\n|---|---|---|\n%s", holdOff, strings.Join(rows, "\n"))
}

// startWorkers launches n workers and waits until all answer.
func startWorkers(t *testing.T, p *Pool, n int) {
	p.mu.Lock()
	var ws []*worker
	for i := 0; i < n; i++ {
		ws = append(ws, p.launchLocked("experiment"))
	}
	p.mu.Unlock()
	for _, w := range ws {
		p.mu.Lock()
		ready := w.ready
		p.mu.Unlock()
		<-ready
	}
}

// run dispatches rate tasks a second for d through the pool and samples
// every worker's pending tasks (asked of the worker itself) every sample.
func run(t *testing.T, p *Pool, rate int, d, sample time.Duration) [][]int {
	ctx, cancel := context.WithTimeout(context.Background(), d+time.Minute)
	defer cancel()
	relay := Relay{Pool: p}
	var wg sync.WaitGroup
	stop := time.After(d)
	tick := time.NewTicker(time.Second / time.Duration(rate))
	defer tick.Stop()
	samp := time.NewTicker(sample)
	defer samp.Stop()
	var series [][]int
	for {
		select {
		case <-stop:
			wg.Wait()
			return series
		case <-tick.C:
			wg.Add(1)
			go func() {
				defer wg.Done()
				relay.Deliver(ctx, "x.test", "a@x", []string{"b@x.test"}, []byte("x"))
			}()
		case <-samp.C:
			p.mu.Lock()
			var cs []nodepb.WorkerClient
			for _, w := range p.workers {
				if w.client != nil {
					cs = append(cs, w.client)
				}
			}
			p.mu.Unlock()
			row := make([]int, len(cs))
			for i, c := range cs {
				if l, err := c.Load(ctx, &nodepb.Empty{}); err == nil {
					row[i] = int(l.Pending)
				}
			}
			series = append(series, row)
		}
	}
}

// imbalance returns the mean difference between the longest and the
// shortest queue over the samples, and the longest queue seen.
func imbalance(series [][]int) (float64, int) {
	sum, peak, n := 0, 0, 0
	for _, row := range series {
		if len(row) == 0 {
			continue
		}
		lo, hi := row[0], row[0]
		for _, v := range row {
			lo, hi = min(lo, v), max(hi, v)
		}
		sum += hi - lo
		peak = max(peak, hi)
		n++
	}
	if n == 0 {
		return 0, 0
	}
	return float64(sum) / float64(n), peak
}

// plot draws the panels side by side: one line per worker, queue length
// (up) over time (right), on a common scale; a grey line every 5 tasks.
func plot(path string, panels [][][]int) error {
	const pw, h, pad = 600, 300, 20
	img := image.NewRGBA(image.Rect(0, 0, pw*len(panels), h))
	for i := range img.Pix {
		img.Pix[i] = 255
	}
	peak := 1
	for _, s := range panels {
		_, p := imbalance(s)
		peak = max(peak, p)
	}
	colors := []color.RGBA{{200, 40, 40, 255}, {40, 120, 200, 255}, {40, 160, 60, 255}, {200, 140, 20, 255}}
	grey := color.RGBA{200, 200, 200, 255}
	for pi, s := range panels {
		x0 := pi*pw + pad
		w := pw - 2*pad
		y := func(v int) int { return h - pad - v*(h-2*pad)/peak }
		for g := 0; g <= peak; g += 5 {
			line(img, x0, y(g), x0+w, y(g), grey)
		}
		line(img, x0, pad, x0, h-pad, color.RGBA{0, 0, 0, 255})
		line(img, x0, h-pad, x0+w, h-pad, color.RGBA{0, 0, 0, 255})
		for k := 0; k < 4; k++ {
			for i := 1; i < len(s); i++ {
				if k >= len(s[i]) || k >= len(s[i-1]) {
					continue
				}
				xa, xb := x0+(i-1)*w/len(s), x0+i*w/len(s)
				line(img, xa, y(s[i-1][k]), xb, y(s[i][k]), colors[k])
			}
		}
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	defer f.Close()
	return png.Encode(f, img)
}

// line draws a segment (Bresenham).
func line(img *image.RGBA, x0, y0, x1, y1 int, c color.RGBA) {
	dx, dy := abs(x1-x0), -abs(y1-y0)
	sx, sy := 1, 1
	if x0 > x1 {
		sx = -1
	}
	if y0 > y1 {
		sy = -1
	}
	e := dx + dy
	for {
		img.SetRGBA(x0, y0, c)
		if x0 == x1 && y0 == y1 {
			return
		}
		e2 := 2 * e
		if e2 >= dy {
			e += dy
			x0 += sx
		}
		if e2 <= dx {
			e += dx
			y0 += sy
		}
	}
}

func abs(v int) int {
	if v < 0 {
		return -v
	}
	return v
}

// Package telemetry is what a node says of itself to the admin console, and
// the cluster-wide view the console draws from every node's word.
//
// Porcupine's nodes already tell each other their load (§5, through RPC
// replies and gossip); an operator needs more than that, from every node at
// once: what each holds, its disk, its replication backlog (§4.2), its
// repair progress (§4.4), its soft-state rebuild (§3.3) and its rates over
// the last hour. A node builds its own Report (Reporter, from the managers'
// figures and counters it samples every few seconds); the Telemetry RPC
// service hands it to any node that asks; and a View on every node asks
// every member at once with a short deadline, keeping the last report of a
// member that did not answer, marked stale with its age, so a console never
// waits on a dead node and every node's console shows the same cluster.
//
// Written here: no library gathers a mail cluster's figures; the per-minute
// series (series.go) and the merge of members with reports (view.go) are
// pure, the RPC and the clock at the edges.
package telemetry

import (
	"sync"
	"time"
)

// Report is one node's figures at one moment.
type Report struct {
	Node     string    `json:"node"`
	Hostname string    `json:"hostname"`
	Island   string    `json:"island,omitempty"`
	Boot     uint64    `json:"boot"`
	Started  time.Time `json:"started"`
	At       time.Time `json:"at"`

	// What the node holds, from its last repair scan.
	Messages        int64     `json:"messages"`
	MessageBytes    int64     `json:"message_bytes"`
	Queued          int64     `json:"queued"`
	Objects         int64     `json:"objects"`
	UnderReplicated int64     `json:"under_replicated"`
	Rehomed         int64     `json:"rehomed"`
	LastRepair      time.Time `json:"last_repair,omitzero"`

	// The rebalancer: on, bytes held above the mean, messages moved.
	Rebalancing      bool  `json:"rebalancing,omitempty"`
	RebalanceSurplus int64 `json:"rebalance_surplus"`
	RebalanceMoved   int64 `json:"rebalance_moved"`

	DiskFree  int64 `json:"disk_free"`
	DiskTotal int64 `json:"disk_total"`
	DiskFull  bool  `json:"disk_full,omitempty"`

	Pending     int     `json:"pending"`
	LoadAverage float64 `json:"load_average"`

	LogPending int `json:"log_pending"`
	LogWaiting int `json:"log_waiting"`
	LogDone    int `json:"log_done"`

	// Users counts the live profiles of the buckets the node manages:
	// summed over the live members, the cluster's users.
	Users          int   `json:"users"`
	BucketsManaged int   `json:"buckets_managed"`
	BucketsReady   int   `json:"buckets_ready"`
	Connections    int   `json:"connections"`
	HeapBytes      int64 `json:"heap_bytes"`

	// Rates: per-minute counts of the last Window minutes, oldest first,
	// the first starting at SeriesStart.
	SeriesStart   time.Time `json:"series_start"`
	Deliveries    []float64 `json:"deliveries"`
	Logins        []float64 `json:"logins"`
	LoginFailures []float64 `json:"login_failures"`
	Errors        []float64 `json:"errors"`

	Workers []WorkerPool `json:"workers,omitempty"`
}

// WorkerPool is one SNS worker class on the node.
type WorkerPool struct {
	Class   string `json:"class"`
	Workers int    `json:"workers"`
	Max     int    `json:"max"`
	Load    int    `json:"load"`
}

// Counters are the running totals a node's rates come from. Each returns
// the total since the process started.
type Counters struct {
	Deliveries    func() float64
	Logins        func() float64
	LoginFailures func() float64
	Errors        func() float64
}

// Reporter makes this node's reports: Figures fills everything but the
// rates, which it keeps itself from Counters.
type Reporter struct {
	Figures  func(*Report)
	Counters Counters

	mu   sync.Mutex
	rate [4]Series
}

// sampleInterval is how often Run reads the counters: well under a minute,
// so every minute's start is seen within a few seconds of it.
const sampleInterval = 10 * time.Second

// Run samples the counters until stop is closed.
func (r *Reporter) Run(stop <-chan struct{}) {
	t := time.NewTicker(sampleInterval)
	defer t.Stop()
	for {
		r.sample(time.Now())
		select {
		case <-stop:
			return
		case <-t.C:
		}
	}
}

func (r *Reporter) counters() [4]func() float64 {
	c := r.Counters
	return [4]func() float64{c.Deliveries, c.Logins, c.LoginFailures, c.Errors}
}

func (r *Reporter) sample(now time.Time) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for i, f := range r.counters() {
		if f != nil {
			r.rate[i].Observe(now, f())
		}
	}
}

// Report returns this node's figures now.
func (r *Reporter) Report(now time.Time) Report {
	var rep Report
	if r.Figures != nil {
		r.Figures(&rep)
	}
	rep.At = now
	r.mu.Lock()
	defer r.mu.Unlock()
	outs := [4]*[]float64{&rep.Deliveries, &rep.Logins, &rep.LoginFailures, &rep.Errors}
	for i, f := range r.counters() {
		v := 0.0
		if f != nil {
			v = f()
		}
		rep.SeriesStart, *outs[i] = r.rate[i].Counts(now, v)
	}
	return rep
}

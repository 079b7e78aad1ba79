package admin

import (
	"context"
	"fmt"
	"hash/fnv"
	"html/template"
	"slices"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/queue"
)

// palette holds colours far apart, given to the nodes in the order of
// their ids, so nodes of a small cluster never look alike; the same
// members get the same colours on every node's console.
var palette = []string{"#3b6fd4", "#2e9e5b", "#d9822b", "#8e44ad", "#c0392b", "#16a2b8",
	"#b7950b", "#d35493", "#5d6d7e", "#1e8449", "#6c3483", "#a04000"}

// colors maps the nodes last drawn to their colours (setColors).
var colors struct {
	sync.Mutex
	of map[cluster.NodeID]string
}

// setColors gives the nodes of a picture their colours, by the order of
// their ids.
func setColors(ids []cluster.NodeID) {
	sorted := slices.Clone(ids)
	slices.Sort(sorted)
	sorted = slices.Compact(sorted)
	m := make(map[cluster.NodeID]string, len(sorted))
	for i, id := range sorted {
		m[id] = palette[i%len(palette)]
	}
	colors.Lock()
	colors.of = m
	colors.Unlock()
}

// nodeColor gives each node its colour: its place among the nodes last
// drawn, or a hue hashed from its id for a node not among them.
func nodeColor(id any) template.CSS {
	colors.Lock()
	c, ok := colors.of[cluster.NodeID(fmt.Sprint(id))]
	colors.Unlock()
	if ok {
		return template.CSS(c)
	}
	h := fnv.New32a()
	h.Write([]byte(fmt.Sprint(id)))
	return template.CSS(fmt.Sprintf("hsl(%d,55%%,45%%)", h.Sum32()%360))
}

// queueView is the outbound queue as the dashboard draws it.
type queueView struct {
	queue.Listing
	Shown []queuedRow
}

type queuedRow struct {
	ID, From, Age, Next, Last string
	Waiting                   []string
	Replicas                  []cluster.NodeID
}

// dashboardQueueRows bounds the rows of the queue table.
const dashboardQueueRows = 50

func (s *Server) queueView(ctx context.Context) *queueView {
	if s.Queue == nil {
		return nil
	}
	v := &queueView{Listing: s.Queue.ListAll(ctx, "")}
	now := time.Now()
	for _, e := range v.Entries[:min(len(v.Entries), dashboardQueueRows)] {
		row := queuedRow{ID: e.ID, From: e.From, Age: now.Sub(e.Created).Round(time.Second).String(), Replicas: e.Replicas, Next: "-"}
		var next time.Time
		for _, r := range e.Recipients {
			if r.State != queue.Queued && r.State != queue.Failed {
				continue
			}
			row.Waiting = append(row.Waiting, r.Address)
			if next.IsZero() || r.NextTry.Before(next) {
				next = r.NextTry
			}
			if r.LastReply != "" {
				row.Last = r.LastReply
			}
		}
		if !next.IsZero() {
			row.Next = "in " + max(0, next.Sub(now)).Round(time.Second).String()
		}
		v.Shown = append(v.Shown, row)
	}
	return v
}

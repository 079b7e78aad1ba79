package admin

import (
	"context"
	"fmt"
	"hash/fnv"
	"html/template"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/queue"
)

// nodeColor gives each node a colour of its own, the same on every page
// and every node's console (a hash of its id).
func nodeColor(id any) template.CSS {
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

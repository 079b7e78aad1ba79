package admin

import (
	"context"
	"fmt"
	"hash/fnv"
	"html/template"
	"net/http"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/sns"
)

// The dashboard draws the cluster as Porcupine Fig. 3 does: the user map's
// buckets, each coloured by the node that manages it, beside the nodes and
// their load. It refreshes itself every few seconds.
var dashboardTmpl = template.Must(template.New("d").Funcs(template.FuncMap{
	"color": nodeColor,
}).Parse(`<!doctype html>
<html><head><meta charset="utf-8"><title>Quill cluster</title>
<meta http-equiv="refresh" content="5">
<style>
body{font-family:system-ui,sans-serif;margin:2em;color:#222}
table{border-collapse:collapse}td,th{padding:4px 10px;border-bottom:1px solid #ddd;text-align:left}
.grid{display:grid;grid-template-columns:repeat(32,18px);gap:2px;margin-top:1em}
.b{width:18px;height:18px;font-size:8px;color:#fff;text-align:center;line-height:18px;border-radius:2px}
.bar{height:10px;background:#4a90d9;display:inline-block}
.sw{display:inline-block;width:12px;height:12px;border-radius:2px;margin-right:6px}
</style></head><body>
<h1>Quill cluster</h1>
<p>User-map epoch {{.Epoch}} · {{len .Members}} node(s) · {{.Users}} user(s) · this node manages {{.Managed}} bucket(s), {{.Ready}} with soft state rebuilt</p>
<h2>Nodes</h2>
<table><tr><th>node</th><th>state</th><th>buckets</th><th>load (pending disk ops)</th><th>listeners</th></tr>
{{range .Members}}<tr><td><span class="sw" style="background:{{color .ID}}"></span>{{.ID}}</td><td>{{.State}}</td><td>{{.Buckets}}</td>
<td><span class="bar" style="width:{{.Load}}px"></span> {{.Load}}</td><td>{{range $k, $v := .Addrs}}{{$k}} {{$v}} {{end}}</td></tr>{{end}}
</table>
{{with .Replication}}<h2>Replication on this node</h2>
<p>{{.Replicas}} copies per message by default, write policy {{.WritePolicy}} ·
holds {{.Objects}} object(s) (messages, queued mail){{if .UnderReplicated}}, <b>{{.UnderReplicated}} with fewer live copies than wanted</b>{{else}}, all with their copies{{end}} ·
update log: {{.Pending}} pending, {{.Waiting}} waiting for absent nodes, {{.Done}} done and retiring</p>{{end}}
{{if .TLS}}<h2>TLS on this node</h2>
<p>in the order a handshake tries them; the first is served to clients that ask for no name this node covers</p>
<table><tr><th>certificate for</th><th>valid until</th><th>from</th></tr>
{{range .TLS}}<tr><td>{{range .Names}}{{.}} {{end}}{{if .SelfSigned}}<b>(self-signed: clients will not trust it; give --tls-cert/--tls-key or quill tls set)</b>{{end}}</td>
<td>{{.NotAfter.Format "2006-01-02"}}</td><td>{{if .Cluster}}cluster state {{.Cluster}} ({{.Source}}), served by every node{{else}}{{.CertFile}}{{end}}</td></tr>{{end}}
</table>{{end}}
{{with .SNS}}<h2>SNS manager</h2>
<p>{{if .Manager}}{{if .Self}}<b>this node</b>{{else}}<span class="sw" title="{{.Manager}}" style="background:{{color .Manager}}"></span> {{.Manager}}{{end}} (term {{.Term}}){{else}}none heard yet{{end}} ·
this node is {{if .Overflow}}an overflow node (workers only when the dedicated nodes are full){{else}}a dedicated node{{end}} · {{.Elections}} time(s) it stood for manager</p>
{{if .Table}}<table><tr><th>node</th><th>class</th><th>workers</th><th>load (tasks)</th><th>pool</th></tr>
{{range .Table}}<tr><td><span class="sw" title="{{.Node}}" style="background:{{color .Node}}"></span> {{.Node}}</td><td>{{.Class}}</td><td>{{.Workers}} of {{.Max}}</td>
<td><span class="bar" style="width:{{.Pending}}0px"></span> {{.Pending}}</td><td>{{if .Overflow}}overflow{{else}}dedicated{{end}}</td></tr>{{end}}</table>{{end}}{{end}}
{{range .Workers}}<h2>Workers on this node: {{.Class}}</h2>
<p>SNS worker processes, at most {{.Max}} · {{.Launches}} launched · {{.Restarts}} restarted after dying · {{.Remote}} task(s) handed to other nodes' workers</p>
{{if .Workers}}<table><tr><th>worker</th><th>pid</th><th>state</th><th>load (tasks)</th><th>started</th><th>restarts</th></tr>
{{range .Workers}}<tr><td>{{.ID}}</td><td>{{.PID}}</td><td>{{if .Alive}}running{{else}}starting{{end}}</td>
<td><span class="bar" style="width:{{.Load}}0px"></span> {{.Load}}</td><td>{{.Started.Format "15:04:05"}}</td><td>{{.Restarts}}</td></tr>{{end}}</table>
{{else}}<p>none running: the first task launches one</p>{{end}}{{end}}
{{with .Queue}}<h2>Outbound queue</h2>
<p>{{len .Entries}} message(s) waiting to leave for other domains{{if gt (len .Entries) (len .Shown)}} (the {{len .Shown}} oldest shown){{end}}{{range $n, $why := .Unreachable}} · <b>{{$n}} did not answer</b>{{end}}</p>
{{if .Shown}}<table><tr><th>id</th><th>age</th><th>from</th><th>waiting for</th><th>replicas</th><th>next try</th><th>last reply</th></tr>
{{range .Shown}}<tr><td title="{{.ID}}">{{slice .ID 0 8}}</td><td>{{.Age}}</td><td>{{if .From}}{{.From}}{{else}}&lt;&gt; (report){{end}}</td>
<td>{{range .Waiting}}{{.}} {{end}}</td><td>{{range .Replicas}}<span class="sw" title="{{.}}" style="background:{{color .}}"></span>{{end}}</td>
<td>{{.Next}}</td><td>{{.Last}}</td></tr>{{end}}</table>{{end}}{{end}}
<h2>User map (256 buckets)</h2>
<div class="grid">{{range .Buckets}}<div class="b" title="bucket {{.Bucket}}: {{.Node}} (epoch {{.Epoch}})" style="background:{{color .Node}}">{{.Bucket}}</div>{{end}}</div>
<p><a href="/cluster">JSON</a> · <a href="/metrics">metrics</a></p>
</body></html>`))

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

func (s *Server) dashboard(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	data := struct {
		ClusterStatus
		Queue   *queueView
		Workers []sns.Status
		SNS     *sns.ManagerStatus
	}{}
	// The two questions to every node at once: each waits up to
	// cluster.FanOutWait for a late node, one after the other would
	// take the page past a second.
	queued := make(chan *queueView, 1)
	go func() { queued <- s.queueView(r.Context()) }()
	data.ClusterStatus = s.status(r.Context())
	data.Queue = <-queued
	if s.Node.Workers != nil {
		data.Workers = s.Node.Workers()
	}
	if s.Node.SNSManager != nil {
		data.SNS = s.Node.SNSManager()
	}
	if err := dashboardTmpl.Execute(w, data); err != nil {
		s.Logger.Error("dashboard", "err", err)
	}
}

// Package admin is the node's HTTP admin API (user management, cluster view,
// Prometheus metrics) and the dashboard that draws the cluster: nodes, the
// 256 buckets of the user map (Porcupine §3.2) and their load. It listens on
// loopback by default; bound anywhere else it requires the bearer token
// generated into the data directory.
package admin

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/guard"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/rebalance"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/saslsrv"
	"github.com/quillmail/quill/internal/sns"
	"github.com/quillmail/quill/internal/telemetry"
	"github.com/quillmail/quill/internal/tlscert"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/usermgr"
)

// TokenFile is the name of the admin token file in the data directory.
const TokenFile = "admin.token"

// maxRequestBody bounds admin request bodies; they are small JSON objects.
const maxRequestBody = 64 << 10

// LoadToken reads the admin token of a data directory, creating it (mode
// 0600) if missing.
func LoadToken(dataDir string) (string, error) {
	path := filepath.Join(dataDir, TokenFile)
	b, err := os.ReadFile(path)
	if err == nil {
		return strings.TrimSpace(string(b)), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("admin token %s: %w", path, err)
	}
	var r [24]byte
	rand.Read(r[:])
	tok := hex.EncodeToString(r[:])
	if err := os.WriteFile(path, []byte(tok+"\n"), 0o600); err != nil {
		return "", fmt.Errorf("admin token %s: %w", path, err)
	}
	return tok, nil
}

// NodeInfo describes the node for the cluster view.
type NodeInfo struct {
	ID      cluster.NodeID
	Started time.Time
	Addrs   map[string]string // protocol -> listen address
	// TLS lists the certificates the node's listeners present.
	TLS     func() []tlscert.Info
	Load    func() int // pending disk operations
	UserMap func() cluster.UserMap
	Members func() []cluster.MemberInfo
	// Replication reports the replication manager's state.
	Replication func() ReplicationStatus
	// Workers reports the node's SNS worker pools (nil: none).
	Workers func() []sns.Status
	// SNSManager is this node's view of the SNS manager (nil: none).
	SNSManager func() *sns.ManagerStatus
}

// ReplicationStatus is the JSON of GET /api/replication: this node's update
// log and what its last repair scan found (Porcupine §4.4).
type ReplicationStatus struct {
	Node        cluster.NodeID `json:"node"`
	Replicas    int            `json:"replicas"`
	WritePolicy string         `json:"write_policy"`
	replica.LogStats
	replica.RepairStats
	// Rebalance is the rebalancer's progress (native store).
	Rebalance *rebalance.Status `json:"rebalance,omitempty"`
}

// Server is the admin HTTP handler.
type Server struct {
	Users *usermgr.Manager
	// TLS manages the cluster's certificates (/api/tls).
	TLS TLS
	// Queue is the outbound queue (/api/queue).
	Queue Queue
	// DKIM manages the domains' signing keys (/api/dkim).
	DKIM DKIM
	// Policies manages the domains' inbound policies (/api/policies).
	Policies Policies
	// Islands shows and changes the islands (/api/islands; nil on
	// Cassandra).
	Islands Islands
	// Domains manages the served domains and aliases (/api/domains,
	// /api/aliases); users are added only in them. nil: any domain.
	Domains Domains
	// Mail is the users' mailboxes (/api/users/{address}/mailboxes,
	// messages, flags: `quill import` and `quill export`); nil: none.
	Mail Mail
	// MaxMessageBytes is the largest message the mail API stores
	// (--max-message-size).
	MaxMessageBytes int64
	// Backup streams any node's backup (/api/backup); nil: none.
	Backup Backup
	Node   NodeInfo
	// Token, when non-empty, is required on every request except
	// /healthz and the console's sign-in page and files, on loopback too
	// (any local account could otherwise read and change every user):
	// "Authorization: Bearer TOKEN", or a console session a browser gets
	// by signing in (signin.go).
	Token string
	// Verifier and Logins check an admin user's console sign-in the way
	// every protocol's login is checked (the proxy, the guard's delays
	// and lockouts); nil Verifier: the token only.
	Verifier saslsrv.Verifier
	Logins   guard.Logins
	// View gathers every member's telemetry for the console (nil: this
	// node's membership alone, without figures).
	View *telemetry.View
	// Hostname is this node's, for the console's title.
	Hostname string
	// Pprof serves Go's profiler under /debug/pprof/ (heap dumps hold
	// mail and passwords in memory: off unless asked for).
	Pprof  bool
	Logger *slog.Logger

	sessions sessions
}

// Handler returns the HTTP handler.
func (s *Server) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, r *http.Request) { io.WriteString(w, "ok\n") })
	mux.HandleFunc("GET /api/users", s.listUsers)
	mux.HandleFunc("POST /api/users", s.addUser)
	mux.HandleFunc("PUT /api/users/{address}/password", s.setPassword)
	mux.HandleFunc("GET /api/users/{address}", s.showUser)
	mux.HandleFunc("PUT /api/users/{address}/replication", s.setReplication)
	mux.HandleFunc("PUT /api/users/{address}/spread", s.setSpread)
	mux.HandleFunc("PUT /api/users/{address}/admin", s.setAdmin)
	mux.HandleFunc("DELETE /api/users/{address}", s.deleteUser)
	mux.HandleFunc("GET /api/users/{address}/quota", s.getQuota)
	mux.HandleFunc("PUT /api/users/{address}/quota", s.setQuota)
	mux.HandleFunc("GET /api/users/{address}/mailboxes", s.listMailboxes)
	mux.HandleFunc("POST /api/users/{address}/mailboxes", s.ensureMailbox)
	mux.HandleFunc("GET /api/users/{address}/messages", s.listMessages)
	mux.HandleFunc("POST /api/users/{address}/messages", s.appendMessage)
	mux.HandleFunc("GET /api/users/{address}/messages/{id}", s.getMessage)
	mux.HandleFunc("POST /api/users/{address}/flags", s.setFlags)
	mux.HandleFunc("GET /api/backup", s.backup)
	mux.HandleFunc("GET /api/domains", s.listDomains)
	mux.HandleFunc("POST /api/domains", s.addDomain)
	mux.HandleFunc("PUT /api/domains/{name}", s.setDomain)
	mux.HandleFunc("DELETE /api/domains/{name}", s.deleteDomain)
	mux.HandleFunc("GET /api/domains/{name}/usage", s.domainUsage)
	mux.HandleFunc("GET /api/aliases", s.listAliases)
	mux.HandleFunc("PUT /api/aliases/{address}", s.setAlias)
	mux.HandleFunc("DELETE /api/aliases/{address}", s.deleteAlias)
	mux.HandleFunc("GET /api/tls", s.listCerts)
	mux.HandleFunc("PUT /api/tls", s.setCert)
	mux.HandleFunc("DELETE /api/tls/{name...}", s.deleteCert)
	mux.HandleFunc("GET /api/dkim", s.listDKIM)
	mux.HandleFunc("PUT /api/dkim/{domain}", s.setDKIM)
	mux.HandleFunc("DELETE /api/dkim/{domain}", s.deleteDKIM)
	mux.HandleFunc("GET /api/policies", s.listPolicies)
	mux.HandleFunc("PUT /api/policies/{domain}", s.setPolicy)
	mux.HandleFunc("DELETE /api/policies/{domain}", s.deletePolicy)
	mux.HandleFunc("GET /api/sns", s.workers)
	mux.HandleFunc("GET /api/sns/manager", s.snsManager)
	mux.HandleFunc("GET /api/queue", s.listQueue)
	mux.HandleFunc("GET /api/queue/{id}", s.showQueued)
	mux.HandleFunc("POST /api/queue/{id}/retry", s.actQueued("retry"))
	mux.HandleFunc("DELETE /api/queue/{id}", s.actQueued("delete"))
	mux.HandleFunc("GET /cluster", s.clusterStatus)
	mux.HandleFunc("GET /api/cluster", s.clusterStatus)
	mux.HandleFunc("GET /api/replication", s.replication)
	mux.HandleFunc("GET /api/islands", s.islandStatus)
	mux.HandleFunc("POST /api/islands/{name}/remove", s.removeIsland)
	mux.Handle("GET /metrics", promhttp.HandlerFor(metrics.Registry, promhttp.HandlerOpts{}))
	s.consoleRoutes(mux)
	if s.Pprof {
		// Go's profiler, for operators chasing a slow node (--pprof).
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
	}
	return s.auth(mux)
}

type userJSON struct {
	Address  string    `json:"address"`
	Password string    `json:"password,omitempty"`
	Created  time.Time `json:"created,omitzero"`
	// Replicas and WritePolicy are the user's replication settings (0 and
	// "": the cluster's defaults).
	Replicas    int    `json:"replicas,omitempty"`
	WritePolicy string `json:"write_policy,omitempty"`
	// Spread is over how many nodes the user's mail may spread (0: the
	// cluster's --spread), Porcupine §5.
	Spread int `json:"spread,omitempty"`
	// Admin lets the user sign in to the console.
	Admin bool `json:"admin,omitempty"`
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

func writeError(w http.ResponseWriter, code int, err error) {
	writeJSON(w, code, map[string]string{"error": err.Error()})
}

func statusOf(err error) int {
	switch {
	case errors.Is(err, userdb.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, userdb.ErrExists):
		return http.StatusConflict
	case errors.Is(err, rpc.ErrUnavailable), errors.Is(err, rpc.ErrNotManager), errors.Is(err, context.DeadlineExceeded):
		// The user's manager did not answer (dying, too slow for
		// readWait, or its bucket moving): try again later.
		return http.StatusServiceUnavailable
	default:
		return http.StatusBadRequest
	}
}

func readJSON(r *http.Request, v any) error {
	dec := json.NewDecoder(io.LimitReader(r.Body, maxRequestBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fmt.Errorf("request body: %w", err)
	}
	return nil
}

// listedUserJSON is a user as GET /api/users lists it.
type listedUserJSON struct {
	userJSON
	// Stale is set when the user comes from the last answer of its
	// bucket's manager, which did not answer within cluster.FanOutWait.
	Stale *cluster.Stale `json:"stale,omitempty"`
}

// UnreachableHeader names, on a listing answered without some live
// nodes, those nodes (comma-separated): what only they hold is their last
// answer's, marked stale, or missing.
const UnreachableHeader = "Quill-Unreachable"

// listUsers answers GET /api/users: every node answers for the buckets it
// manages, within cluster.FanOutWait (usermgr.Manager.Users).
func (s *Server) listUsers(w http.ResponseWriter, r *http.Request) {
	l := s.Users.Users(r.Context())
	out := make([]listedUserJSON, len(l.Profiles))
	for i, p := range l.Profiles {
		out[i] = listedUserJSON{userJSON: userJSON{Address: p.Address, Created: p.Created, Replicas: p.Replicas,
			WritePolicy: p.WritePolicy, Spread: p.Spread, Admin: p.Admin}, Stale: p.Stale}
	}
	if len(l.Unreachable) > 0 {
		var names []string
		for n := range l.Unreachable {
			names = append(names, string(n))
		}
		slices.Sort(names)
		w.Header().Set(UnreachableHeader, strings.Join(names, ", "))
	}
	writeJSON(w, http.StatusOK, out)
}

func (s *Server) addUser(w http.ResponseWriter, r *http.Request) {
	var u userJSON
	if err := readJSON(r, &u); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	p, err := s.createUser(r.Context(), u)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	writeJSON(w, http.StatusCreated, userJSON{Address: p.Address, Created: p.Created, Admin: p.Admin})
}

// createUser adds a user (API and console): only in a served domain, the
// domain's first user becoming its postmaster, with the replication
// settings and admin flag asked for.
func (s *Server) createUser(ctx context.Context, u userJSON) (*userdb.Profile, error) {
	if _, err := replica.ParsePolicy(u.WritePolicy); err != nil {
		return nil, err
	}
	if err := s.checkUserDomain(u.Address); err != nil {
		return nil, err
	}
	p, err := s.Users.AddUser(ctx, u.Address, u.Password)
	if err != nil {
		return nil, err
	}
	if s.Domains != nil {
		s.claimPostmaster(ctx, p.Address)
	}
	if u.Replicas != 0 || u.WritePolicy != "" {
		if err := s.Users.SetReplication(ctx, p.Address, u.Replicas, u.WritePolicy); err != nil {
			return nil, err
		}
	}
	if u.Spread != 0 {
		if err := s.Users.SetSpread(ctx, p.Address, u.Spread); err != nil {
			return nil, err
		}
		p.Spread = u.Spread
	}
	if u.Admin {
		if err := s.Users.SetAdmin(ctx, p.Address, true); err != nil {
			return nil, err
		}
		p.Admin = true
	}
	s.Logger.Info("user added", "user", p.Address, "admin", u.Admin, "by", whoOf(ctx))
	return p, nil
}

func (s *Server) setPassword(w http.ResponseWriter, r *http.Request) {
	var u userJSON
	if err := readJSON(r, &u); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	addr := r.PathValue("address")
	if err := s.Users.SetPassword(r.Context(), addr, u.Password); err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	s.Logger.Info("password changed", "user", addr)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) setReplication(w http.ResponseWriter, r *http.Request) {
	var u userJSON
	if err := readJSON(r, &u); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	addr := r.PathValue("address")
	if err := s.Users.SetReplication(r.Context(), addr, u.Replicas, u.WritePolicy); err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	s.Logger.Info("replication settings changed", "user", addr, "replicas", u.Replicas, "write_policy", u.WritePolicy)
	w.WriteHeader(http.StatusNoContent)
}

// spreadJSON is PUT /api/users/{address}/spread.
type spreadJSON struct {
	Spread int `json:"spread"`
}

func (s *Server) setSpread(w http.ResponseWriter, r *http.Request) {
	var u spreadJSON
	if err := readJSON(r, &u); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	addr := r.PathValue("address")
	if err := s.Users.SetSpread(r.Context(), addr, u.Spread); err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	s.Logger.Info("spread changed", "user", addr, "spread", u.Spread, "by", whoOf(r.Context()))
	w.WriteHeader(http.StatusNoContent)
}

// shownUserJSON is GET /api/users/{address}: the user's settings, its mail
// map (the soft state the user's manager keeps: the nodes the balancer and
// the mailbox views look at) and the nodes that answer, now, that they
// hold some of its mail (the hard state the map stands for; Porcupine
// §3.3). Both are empty on the Cassandra store, which holds every user's
// mail.
type shownUserJSON struct {
	userJSON
	MailMap []cluster.NodeID `json:"mail_map"`
	Holders []cluster.NodeID `json:"holders"`
}

func (s *Server) showUser(w http.ResponseWriter, r *http.Request) {
	addr := r.PathValue("address")
	// The holders first: a node that stores a new message is in the mail
	// map by the time its delivery is confirmed, so a map read after the
	// holders names every holder but one in mid-delivery.
	holders, err := s.Users.MailHolders(r.Context(), addr)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	p, mailMap, err := s.Users.Lookup(r.Context(), addr)
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	if mailMap == nil {
		mailMap = []cluster.NodeID{}
	}
	if holders == nil {
		holders = []cluster.NodeID{}
	}
	writeJSON(w, http.StatusOK, shownUserJSON{userJSON: userJSON{Address: p.Address, Created: p.Created, Replicas: p.Replicas,
		WritePolicy: p.WritePolicy, Spread: p.Spread, Admin: p.Admin}, MailMap: mailMap, Holders: holders})
}

func (s *Server) setAdmin(w http.ResponseWriter, r *http.Request) {
	var u userJSON
	if err := readJSON(r, &u); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	addr := r.PathValue("address")
	if err := s.Users.SetAdmin(r.Context(), addr, u.Admin); err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	s.Logger.Info("console access changed", "user", addr, "admin", u.Admin, "by", whoOf(r.Context()))
	w.WriteHeader(http.StatusNoContent)
}

// quotaJSON is a user's quota limits (PUT) and usage (GET): bytes and
// messages, 0 for no limit.
type quotaJSON struct {
	Storage      int64 `json:"storage"`
	Messages     int64 `json:"messages"`
	StorageUsed  int64 `json:"storage_used"`
	MessagesUsed int64 `json:"messages_used"`
}

// readWait bounds what a read of the admin API asks of one other node (a
// user's usage from its writer), as cluster.FanOutWait bounds each node's
// answer to a listing: past it the read answers 503, within a second.
const readWait = cluster.FanOutWait

// withinReadWait runs read under a deadline of readWait and stops waiting
// for it then, even if it goes on: a writer's call can wait past its
// context for the user's lock, held by the user's other work (a view
// loading from a node that stands still). A read is safe to leave running.
func withinReadWait[T any](ctx context.Context, read func(context.Context) (T, error)) (T, error) {
	// The deadline is cancelled here, not by the read's goroutine: that
	// goroutine cancelling as it finished made the select below see the
	// result and a cancelled context at once, and pick the cancellation
	// half the time (a read that answered in 1 ms reported "no answer",
	// as a 400: CI under load, TestNoStallManagerKilled).
	ctx, cancel := context.WithTimeout(ctx, readWait)
	defer cancel()
	type result struct {
		v   T
		err error
	}
	done := make(chan result, 1)
	go func() {
		v, err := read(ctx)
		done <- result{v, err}
	}()
	select {
	case r := <-done:
		return r.v, r.err
	case <-ctx.Done():
		select {
		case r := <-done: // answered as the deadline came
			return r.v, r.err
		default:
		}
		var zero T
		return zero, fmt.Errorf("no answer within %v: %w", readWait, ctx.Err())
	}
}

func (s *Server) getQuota(w http.ResponseWriter, r *http.Request) {
	addr := r.PathValue("address")
	u, err := withinReadWait(r.Context(), func(ctx context.Context) (mailbox.Usage, error) { return s.Users.Usage(ctx, addr) })
	if err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	writeJSON(w, http.StatusOK, quotaJSON{Storage: u.QuotaStorage, Messages: u.QuotaMessages, StorageUsed: u.Storage, MessagesUsed: u.Messages})
}

func (s *Server) setQuota(w http.ResponseWriter, r *http.Request) {
	var q quotaJSON
	if err := readJSON(r, &q); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	addr := r.PathValue("address")
	if err := s.Users.SetQuota(r.Context(), addr, q.Storage, q.Messages); err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	s.Logger.Info("quota changed", "user", addr, "storage", q.Storage, "messages", q.Messages)
	w.WriteHeader(http.StatusNoContent)
}

func (s *Server) deleteUser(w http.ResponseWriter, r *http.Request) {
	addr := r.PathValue("address")
	if err := s.Users.DeleteUser(r.Context(), addr); err != nil {
		writeError(w, statusOf(err), err)
		return
	}
	s.Logger.Info("user deleted", "user", addr)
	w.WriteHeader(http.StatusNoContent)
}

// ClusterStatus is the JSON of GET /cluster.
type ClusterStatus struct {
	Epoch uint64 `json:"epoch"`
	// Managed and Ready count the buckets this node manages and those
	// whose soft state is rebuilt (Porcupine §3.3).
	Managed int            `json:"managed"`
	Ready   int            `json:"ready"`
	Members []MemberStatus `json:"members"`
	Buckets []BucketStatus `json:"buckets"`
	Users   int            `json:"users"`
	// Unreachable names the live nodes that did not answer the user
	// listing within cluster.FanOutWait, and why; their members' Users
	// are their last answer's (UsersStale).
	Unreachable map[cluster.NodeID]string `json:"unreachable,omitempty"`
	// IslandEpoch is the installed island table's epoch (0: no table,
	// one island); Buckets then name their islands.
	IslandEpoch uint64 `json:"island_epoch,omitempty"`
	// Replication is this node's update log and repair state.
	Replication *ReplicationStatus `json:"replication,omitempty"`
	// TLS is the certificates this node presents.
	TLS []tlscert.Info `json:"tls,omitempty"`
}

// MemberStatus is one node in the cluster view.
type MemberStatus struct {
	ID       cluster.NodeID    `json:"id"`
	Self     bool              `json:"self,omitempty"`
	State    string            `json:"state"`
	Boot     uint64            `json:"boot"`
	Load     int               `json:"load"`
	DiskFull bool              `json:"disk_full,omitempty"`
	Buckets  int               `json:"buckets"`
	Gossip   string            `json:"gossip,omitempty"`
	RPC      string            `json:"rpc,omitempty"`
	Started  time.Time         `json:"started,omitzero"`
	Addrs    map[string]string `json:"addrs,omitempty"`
	// Since is when this node saw State begin.
	Since time.Time `json:"since,omitzero"`
	// Stale marks Load and DiskFull of a member that is not live: the
	// last it gossiped, about as old as its state.
	Stale *cluster.Stale `json:"stale,omitempty"`
	// Users counts the users of the buckets the member manages, as it
	// answered the user listing; UsersStale marks its last answer,
	// standing in when it did not answer in time.
	Users      int            `json:"users"`
	UsersStale *cluster.Stale `json:"users_stale,omitempty"`
	// HeldBytes and HeldMessages are the message bytes and copies the
	// member gossiped it holds (its last scan; internal/rebalance).
	HeldBytes    int64 `json:"held_bytes"`
	HeldMessages int   `json:"held_messages"`
	// Island is the member's island (internal/island; "default" when it
	// names none).
	Island string `json:"island"`
}

// BucketStatus is one user-map entry: its manager ("" when its island
// has no live member) and, with an island table, its island.
type BucketStatus struct {
	Bucket int            `json:"bucket"`
	Node   cluster.NodeID `json:"node"`
	Epoch  uint64         `json:"epoch"`
	Island string         `json:"island,omitempty"`
}

// status gathers GET /cluster: this node's view, and the users of every
// node (the one question it asks the others, within cluster.FanOutWait).
func (s *Server) status(ctx context.Context) ClusterStatus {
	um := s.Node.UserMap()
	users := s.Users.Users(ctx)
	st := ClusterStatus{Epoch: um.Epoch, Users: len(users.Profiles), Unreachable: users.Unreachable}
	now := time.Now()
	st.Managed, st.Ready = s.Users.Reconstruction()
	count := map[cluster.NodeID]int{}
	var isl IslandStatus
	if s.Islands != nil {
		isl = s.Islands.IslandStatus()
		st.IslandEpoch = isl.Epoch
	}
	for b := 0; b < cluster.Buckets; b++ {
		bs := BucketStatus{Bucket: b, Node: um.Node[b], Epoch: um.Changed[b]}
		if isl.Table {
			bs.Island = isl.Owners[b]
		}
		st.Buckets = append(st.Buckets, bs)
		count[um.Node[b]]++
	}
	for _, mi := range s.Node.Members() {
		ms := MemberStatus{ID: mi.ID, State: mi.State, Load: mi.Load, DiskFull: mi.DiskFull,
			Boot: mi.Member.Boot, Buckets: count[mi.ID], Gossip: mi.Gossip, RPC: mi.RPC, Since: mi.Since,
			Users: users.PerNode[mi.ID].Users, UsersStale: users.PerNode[mi.ID].Stale,
			HeldBytes: mi.Held, HeldMessages: mi.Messages, Island: mi.IslandOf()}
		if mi.State != "alive" && mi.State != "suspect" && !mi.Since.IsZero() {
			ms.Stale = cluster.StaleSince(mi.Since, now)
		}
		if mi.ID == s.Node.ID {
			ms.Load, ms.Started, ms.Addrs, ms.Self = s.Node.Load(), s.Node.Started, s.Node.Addrs, true
		}
		st.Members = append(st.Members, ms)
	}
	if s.Node.Replication != nil {
		r := s.Node.Replication()
		st.Replication = &r
	}
	if s.Node.TLS != nil {
		st.TLS = s.Node.TLS()
	}
	return st
}

func (s *Server) replication(w http.ResponseWriter, r *http.Request) {
	if s.Node.Replication == nil {
		writeError(w, http.StatusNotFound, errors.New("no replication manager on this node"))
		return
	}
	writeJSON(w, http.StatusOK, s.Node.Replication())
}

func (s *Server) clusterStatus(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.status(r.Context()))
}

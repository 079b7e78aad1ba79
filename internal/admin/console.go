package admin

// The admin console: server-rendered pages (html/template) that htmx
// (vendored in ui/static, no CDN) refreshes and submits without reloading,
// and which work as plain forms without it. Every page reads the cluster
// through this node: the cluster picture from every member's telemetry
// (internal/telemetry), users, domains, aliases and quotas through the same
// managers the API uses, so every node's console shows the same cluster.

import (
	"context"
	"embed"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"net/http"
	"net/url"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/config"
	"github.com/quillmail/quill/internal/domain"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/sns"
	"github.com/quillmail/quill/internal/telemetry"
	"github.com/quillmail/quill/internal/tlscert"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/usermgr"
)

//go:embed ui
var ui embed.FS

// consoleDeadline bounds what one console page waits for from other nodes
// (listings, usage, telemetry): a page answers within a second while nodes
// are dying, showing what arrived.
const consoleDeadline = 900 * time.Millisecond

// usageTimeout bounds one user's usage asked of their writer for a page.
const usageTimeout = 700 * time.Millisecond

// usageParallel is how many users' usage a page asks for at once.
const usageParallel = 8

// pageRows is how many rows a listing page shows.
const pageRows = 50

var consoleFuncs = template.FuncMap{
	"color": nodeColor,
	// islandColor draws islands apart from nodes: a hue hashed from the
	// island's name.
	"islandColor": func(name string) template.CSS { return nodeColor("island:" + name) },
	"bytes":       Bytes,
	"since":       Since,
	"size":        func(n int64) string { return limitText(n, config.FormatSize) },
	"exact":       config.FormatSizeExact,
	"count":       func(n int64) string { return limitText(n, func(n int64) string { return strconv.FormatInt(n, 10) }) },
	"pct": func(part, whole int64) int {
		if whole <= 0 {
			return 0
		}
		return int(100 * part / whole)
	},
	"ago": func(t time.Time) string {
		if t.IsZero() {
			return "never"
		}
		return Since(time.Since(t)) + " ago"
	},
	"join": strings.Join,
	"add":  func(a, b int) int { return a + b },
	"used": func(free, total int64) int64 { return total - free },
	"search": func(path, hint, q string) map[string]string {
		return map[string]string{"Path": path, "Hint": hint, "Q": q}
	},
	"path": url.PathEscape,
}

func limitText(n int64, format func(int64) string) string {
	if n <= 0 {
		return "no limit"
	}
	return format(n)
}

// pages are the console's templates, each page parsed with the layout.
var pages = func() map[string]*template.Template {
	layout := template.Must(template.New("layout.html").Funcs(consoleFuncs).ParseFS(ui, "ui/layout.html", "ui/parts.html"))
	out := map[string]*template.Template{}
	names, err := fs.Glob(ui, "ui/page_*.html")
	if err != nil {
		panic(err)
	}
	for _, n := range names {
		name := strings.TrimSuffix(strings.TrimPrefix(n, "ui/page_"), ".html")
		out[name] = template.Must(template.Must(layout.Clone()).ParseFS(ui, n))
	}
	return out
}()

// page is what every console page gets.
type page struct {
	Title    string
	Nav      string
	Who      string
	Node     cluster.NodeID
	Hostname string
	OK, Err  string
	Data     any
}

func (s *Server) consoleRoutes(mux *http.ServeMux) {
	static, _ := fs.Sub(ui, "ui/static")
	files := http.FileServerFS(static)
	mux.Handle("GET /static/", http.StripPrefix("/static/", http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Cache-Control", "max-age=3600")
		files.ServeHTTP(w, r)
	})))
	mux.HandleFunc("GET /signin", s.signInPage)
	mux.HandleFunc("POST /signin", s.signInPost)
	mux.HandleFunc("POST /signout", s.signOut)
	mux.HandleFunc("GET /{$}", s.overviewPage)
	mux.HandleFunc("GET /ui/cluster", s.clusterPart)
	mux.HandleFunc("GET /api/telemetry", s.telemetryJSON)
	mux.HandleFunc("GET /users", s.usersPage)
	mux.HandleFunc("POST /users", s.usersAdd)
	mux.HandleFunc("GET /users/{address}", s.userPage)
	mux.HandleFunc("POST /users/{address}", s.userPost)
	mux.HandleFunc("GET /domains", s.domainsPage)
	mux.HandleFunc("POST /domains", s.domainsAdd)
	mux.HandleFunc("GET /domains/{name}", s.domainPage)
	mux.HandleFunc("POST /domains/{name}", s.domainPost)
	mux.HandleFunc("GET /aliases", s.aliasesPage)
	mux.HandleFunc("POST /aliases", s.aliasesPost)
	mux.HandleFunc("GET /quotas", s.quotasPage)
	mux.HandleFunc("GET /queue", s.queuePage)
	mux.HandleFunc("POST /queue/{id}", s.queuePost)
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, name, title string, data any) {
	t := pages[name]
	if name != "overview" && s.Node.Members != nil { // the overview set them from its picture
		var ids []cluster.NodeID
		for _, m := range s.Node.Members() {
			ids = append(ids, m.ID)
		}
		setColors(ids)
	}
	p := page{Title: title, Nav: name, Who: whoOf(r.Context()), Node: s.Node.ID, Hostname: s.Hostname,
		OK: r.URL.Query().Get("ok"), Err: r.URL.Query().Get("err"), Data: data}
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	w.Header().Set("Content-Security-Policy", "default-src 'self'; style-src 'self' 'unsafe-inline'; img-src 'self' data:")
	w.Header().Set("X-Frame-Options", "DENY")
	if err := t.ExecuteTemplate(w, "layout.html", p); err != nil {
		s.Logger.Error("console page", "page", name, "err", err)
	}
}

// done sends the browser back to a page with what happened (post, then
// redirect, then get: a reload does not post again).
func done(w http.ResponseWriter, r *http.Request, to string, err error, ok string) {
	q := url.Values{}
	if err != nil {
		q.Set("err", err.Error())
	} else {
		q.Set("ok", ok)
	}
	sep := "?"
	if strings.Contains(to, "?") {
		sep = "&"
	}
	http.Redirect(w, r, to+sep+q.Encode(), http.StatusSeeOther)
}

// --- sign-in

func (s *Server) signInPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, "signin", "Sign in", struct{ Next string }{safeNext(r.URL.Query().Get("next"))})
}

// safeNext keeps a sign-in's return address on this console: a path of
// it, with no scheme or host, no backslash (browsers read "/\" as "//")
// and no control character (which browsers strip, and url.Parse refuses).
func safeNext(next string) string {
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || !strings.HasPrefix(next, "/") ||
		strings.HasPrefix(next, "//") || strings.HasPrefix(next, "/signin") ||
		strings.ContainsFunc(next, func(r rune) bool { return r == '\\' || r < 0x20 || r == 0x7f }) {
		return "/"
	}
	return next
}

func (s *Server) signInPost(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
	next := safeNext(r.PostFormValue("next"))
	who, pw, err := s.signIn(r)
	if err != nil {
		s.Logger.Warn("console sign-in failed", "user", r.PostFormValue("user"), "remote", r.RemoteAddr, "err", err)
		done(w, r, "/signin?next="+url.QueryEscape(next), err, "")
		return
	}
	s.Logger.Info("console sign-in", "who", who, "remote", r.RemoteAddr)
	s.startSession(w, r, who, pw)
	http.Redirect(w, r, next, http.StatusSeeOther)
}

func (s *Server) signOut(w http.ResponseWriter, r *http.Request) {
	if c, err := r.Cookie(sessionCookie); err == nil {
		s.sessions.drop(c.Value)
	}
	http.SetCookie(w, &http.Cookie{Name: sessionCookie, Value: "", Path: "/", MaxAge: -1, HttpOnly: true, SameSite: http.SameSiteStrictMode})
	http.Redirect(w, r, "/signin", http.StatusSeeOther)
}

// --- the cluster

// clusterView is the overview's picture.
type clusterView struct {
	telemetry.Cluster
	Buckets []BucketStatus
	// Legend is every node that manages buckets, with how many.
	Legend    []legendEntry
	Epoch     uint64
	UsersErr  string
	Queue     *queueView
	SNS       *sns.ManagerStatus
	Workers   []sns.Status
	Charts    []template.HTML
	PerNode   template.HTML
	DeadNodes int
	// TLS is the certificates this node presents.
	TLS []tlscert.Info
	// Islands is the bucket→island table (nil: not kept here).
	Islands *IslandStatus
}

type legendEntry struct {
	Node    cluster.NodeID
	Buckets int
}

// gather builds the picture, asking the other nodes at once and waiting
// at most consoleDeadline for any of them.
func (s *Server) gather(ctx context.Context) clusterView {
	ctx, cancel := context.WithTimeout(ctx, consoleDeadline)
	defer cancel()
	var v clusterView
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		v.Queue = s.queueView(ctx)
	}()
	if s.View != nil {
		v.Cluster = s.View.Gather(ctx)
	} else {
		v.Cluster = telemetry.Merge(time.Now(), s.Node.ID, s.Node.Members(), nil, nil, nil, nil, 0)
	}
	if v.UsersPartial {
		v.UsersErr = "a live node's count is missing"
	}
	wg.Wait()
	um := s.Node.UserMap()
	v.Epoch = um.Epoch
	var ids []cluster.NodeID
	for _, n := range v.Nodes {
		ids = append(ids, n.ID)
	}
	setColors(append(ids, um.Node[:]...))
	count := map[cluster.NodeID]int{}
	for b := 0; b < cluster.Buckets; b++ {
		v.Buckets = append(v.Buckets, BucketStatus{Bucket: b, Node: um.Node[b], Epoch: um.Changed[b]})
		count[um.Node[b]]++
	}
	for n, c := range count {
		v.Legend = append(v.Legend, legendEntry{Node: n, Buckets: c})
	}
	sort.Slice(v.Legend, func(i, j int) bool { return v.Legend[i].Node < v.Legend[j].Node })
	if s.Islands != nil {
		st := s.Islands.IslandStatus()
		v.Islands = &st
	}
	if s.Node.SNSManager != nil {
		v.SNS = s.Node.SNSManager()
	}
	if s.Node.Workers != nil {
		v.Workers = s.Node.Workers()
	}
	if s.Node.TLS != nil {
		v.TLS = s.Node.TLS()
	}
	v.Charts = []template.HTML{
		Chart("Deliveries per minute", []Line{{Name: "deliveries", Color: "#2f7ed8", Values: v.Deliveries}}, false),
		Chart("Logins per minute", []Line{{Name: "logins", Color: "#2e9e5b", Values: v.Logins},
			{Name: "failed", Color: "#d9822b", Values: v.LoginFailures}}, true),
		Chart("Errors per minute (refusals, failed deliveries)", []Line{{Name: "errors", Color: "#c0392b", Values: v.Errors}}, false),
	}
	var per []Line
	for _, n := range v.Nodes {
		if n.Report != nil {
			per = append(per, Line{Name: string(n.ID), Color: string(nodeColor(n.ID)),
				Values: telemetry.Align(n.Report.Deliveries, n.Report.SeriesStart, v.SeriesStart)})
		}
		if n.State != "alive" && n.State != "suspect" {
			v.DeadNodes++
		}
	}
	v.PerNode = Chart("Deliveries per minute by node", per, false)
	return v
}

func (s *Server) overviewPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, "overview", "Cluster", s.gather(r.Context()))
}

// clusterPart is the overview's body alone, which the page asks for every
// few seconds.
func (s *Server) clusterPart(w http.ResponseWriter, r *http.Request) {
	w.Header().Set("Content-Type", "text/html; charset=utf-8")
	if err := pages["overview"].ExecuteTemplate(w, "cluster", s.gather(r.Context())); err != nil {
		s.Logger.Error("console cluster", "err", err)
	}
}

// telemetryJSON is the picture as JSON, for tools and tests.
func (s *Server) telemetryJSON(w http.ResponseWriter, r *http.Request) {
	v := s.gather(r.Context())
	writeJSON(w, http.StatusOK, v.Cluster)
}

// --- users

type userRow struct {
	userdb.Profile
	Usage    *mailbox.Usage
	UsageErr bool
}

type usersView struct {
	Q           string
	Rows        []userRow
	Total       int
	Page, Pages int
	Err         string
	Domains     []domain.Domain
}

// usages asks the users' writers for their usage, a few at a time, each
// bounded: a page shows what arrived.
func (s *Server) usages(ctx context.Context, rows []userRow) {
	sem := make(chan struct{}, usageParallel)
	var wg sync.WaitGroup
	for i := range rows {
		wg.Add(1)
		sem <- struct{}{}
		go func(row *userRow) {
			defer wg.Done()
			defer func() { <-sem }()
			cctx, cancel := context.WithTimeout(ctx, usageTimeout)
			defer cancel()
			u, err := s.Users.Usage(cctx, row.Address)
			if err != nil {
				row.UsageErr = true
				return
			}
			row.Usage = &u
		}(&rows[i])
	}
	wg.Wait()
}

// unreachable says which nodes a listing had to do without: their users
// are those of their last answer, or missing.
func unreachable(l usermgr.UserListing) string {
	if len(l.Unreachable) == 0 {
		return ""
	}
	var names []string
	for n := range l.Unreachable {
		names = append(names, string(n))
	}
	slices.Sort(names)
	return "not every node answered in time (" + strings.Join(names, ", ") + "): their users are as they last answered, or missing"
}

// pageOf cuts a listing to the page asked for (1-based).
func pageOf[T any](all []T, r *http.Request) ([]T, int, int) {
	pages := max(1, (len(all)+pageRows-1)/pageRows)
	p, _ := strconv.Atoi(r.URL.Query().Get("page"))
	p = min(max(p, 1), pages)
	return all[(p-1)*pageRows : min(len(all), p*pageRows)], p, pages
}

// userList lists the users a listing page shows: those keep takes (given
// the lower-cased search), a page of them, with their usage.
func (s *Server) userList(r *http.Request, keep func(p userdb.Profile, q string) bool) usersView {
	ctx, cancel := context.WithTimeout(r.Context(), consoleDeadline)
	defer cancel()
	v := usersView{Q: strings.TrimSpace(r.URL.Query().Get("q"))}
	l := s.Users.Users(ctx)
	v.Err = unreachable(l)
	q := strings.ToLower(v.Q)
	var match []userdb.Profile
	for _, p := range l.Profiles {
		if keep(p.Profile, q) {
			match = append(match, p.Profile)
		}
	}
	v.Total = len(match)
	shown, page, pages := pageOf(match, r)
	v.Page, v.Pages = page, pages
	for _, p := range shown {
		v.Rows = append(v.Rows, userRow{Profile: p})
	}
	s.usages(ctx, v.Rows)
	return v
}

func (s *Server) usersPage(w http.ResponseWriter, r *http.Request) {
	v := s.userList(r, func(p userdb.Profile, q string) bool { return q == "" || strings.Contains(p.Address, q) })
	if s.Domains != nil {
		v.Domains = s.Domains.Domains()
	}
	s.render(w, r, "users", "Users", v)
}

func (s *Server) usersAdd(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
	u := userJSON{Address: strings.TrimSpace(r.PostFormValue("address")), Password: r.PostFormValue("password"),
		Admin: r.PostFormValue("admin") != ""}
	p, err := s.createUser(r.Context(), u)
	if err == nil && (r.PostFormValue("storage") != "" || r.PostFormValue("messages") != "") {
		err = s.setQuotaForm(r, p.Address)
	}
	if err != nil {
		done(w, r, "/users", err, "")
		return
	}
	done(w, r, "/users?q="+url.QueryEscape(p.Address), nil, "user "+p.Address+" added")
}

// setQuotaForm sets a user's quota from a form's storage (a size such as
// 2G) and messages fields.
func (s *Server) setQuotaForm(r *http.Request, addr string) error {
	storage, messages, err := quotaFields(r)
	if err != nil {
		return err
	}
	if err := s.Users.SetQuota(r.Context(), addr, storage, messages); err != nil {
		return err
	}
	s.Logger.Info("quota changed", "user", addr, "storage", storage, "messages", messages, "by", whoOf(r.Context()))
	return nil
}

// quotaFields reads a form's storage (a size, empty or 0 for no limit) and
// messages fields.
func quotaFields(r *http.Request) (storage, messages int64, err error) {
	if f := strings.TrimSpace(r.PostFormValue("storage")); f != "" {
		if storage, err = config.ParseSize(f); err != nil {
			return 0, 0, fmt.Errorf("storage limit: %w", err)
		}
	}
	if f := strings.TrimSpace(r.PostFormValue("messages")); f != "" {
		if messages, err = strconv.ParseInt(f, 10, 64); err != nil || messages < 0 {
			return 0, 0, fmt.Errorf("message limit %q: want a whole number, 0 for none", f)
		}
	}
	return storage, messages, nil
}

type userView struct {
	userdb.Profile
	Usage    *mailbox.Usage
	UsageErr string
	Aliases  []domain.Alias
}

// findUser asks the user's bucket manager for the profile (one node, not
// a listing of the cluster).
func (s *Server) findUser(ctx context.Context, addr string) (*userdb.Profile, error) {
	p, _, err := s.Users.Lookup(ctx, addr)
	if err == nil && p.Deleted {
		err = fmt.Errorf("user %s: %w", addr, userdb.ErrNotFound)
	}
	if err != nil {
		return nil, err
	}
	return p, nil
}

func (s *Server) userPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), consoleDeadline)
	defer cancel()
	addr := userdb.Normalize(r.PathValue("address"))
	p, err := s.findUser(ctx, addr)
	if err != nil {
		done(w, r, "/users", err, "")
		return
	}
	v := userView{Profile: *p}
	if u, err := s.Users.Usage(ctx, addr); err != nil {
		v.UsageErr = err.Error()
	} else {
		v.Usage = &u
	}
	if s.Domains != nil {
		for _, a := range s.Domains.Aliases(userdb.Domain(addr)) {
			if slices.Contains(a.Targets, addr) {
				v.Aliases = append(v.Aliases, a)
			}
		}
	}
	s.render(w, r, "user", addr, v)
}

// userPost applies one of the user page's forms (action=...).
func (s *Server) userPost(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
	addr := userdb.Normalize(r.PathValue("address"))
	back := "/users/" + url.PathEscape(addr)
	ctx := r.Context()
	by := whoOf(ctx)
	var err error
	var ok string
	switch r.PostFormValue("action") {
	case "password":
		if err = s.Users.SetPassword(ctx, addr, r.PostFormValue("password")); err == nil {
			s.sessions.dropWho(addr)
			ok = "password changed"
			s.Logger.Info("password changed", "user", addr, "by", by)
		}
	case "quota":
		if err = s.setQuotaForm(r, addr); err == nil {
			ok = "quota set"
		}
	case "replication":
		n, _ := strconv.Atoi(r.PostFormValue("replicas"))
		pol := r.PostFormValue("policy")
		if _, err = replica.ParsePolicy(pol); err == nil {
			if err = s.Users.SetReplication(ctx, addr, n, pol); err == nil {
				ok = "replication settings changed"
				s.Logger.Info("replication settings changed", "user", addr, "replicas", n, "write_policy", pol, "by", by)
			}
		}
	case "admin":
		on := r.PostFormValue("admin") != ""
		if err = s.Users.SetAdmin(ctx, addr, on); err == nil {
			if !on {
				s.sessions.dropWho(addr)
			}
			ok = "console access changed"
			s.Logger.Info("console access changed", "user", addr, "admin", on, "by", by)
		}
	case "delete":
		if err = s.Users.DeleteUser(ctx, addr); err == nil {
			s.sessions.dropWho(addr)
			s.Logger.Info("user deleted", "user", addr, "by", by)
			done(w, r, "/users", nil, "user "+addr+" deleted")
			return
		}
	default:
		err = errors.New("unknown action")
	}
	done(w, r, back, err, ok)
}

// --- domains

type domainRow struct {
	domain.Domain
	Users, Aliases int
}

func (s *Server) domainRows(ctx context.Context) ([]domainRow, string) {
	if s.Domains == nil {
		return nil, "this node serves any domain (no domain list)"
	}
	l := s.Users.Users(ctx)
	warn := unreachable(l)
	var rows []domainRow
	for _, d := range s.Domains.Domains() {
		row := domainRow{Domain: d, Aliases: len(s.Domains.Aliases(d.Name))}
		for _, u := range l.Profiles {
			if userdb.Domain(u.Address) == d.Name {
				row.Users++
			}
		}
		rows = append(rows, row)
	}
	return rows, warn
}

func (s *Server) domainsPage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), consoleDeadline)
	defer cancel()
	rows, warn := s.domainRows(ctx)
	q := strings.ToLower(strings.TrimSpace(r.URL.Query().Get("q")))
	var match []domainRow
	for _, d := range rows {
		if q == "" || strings.Contains(d.Name, q) {
			match = append(match, d)
		}
	}
	s.render(w, r, "domains", "Domains", struct {
		Q    string
		Rows []domainRow
		Warn string
	}{q, match, warn})
}

func (s *Server) domainsAdd(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
	if s.Domains == nil {
		done(w, r, "/domains", errors.New("this node has no domain list"), "")
		return
	}
	d := domain.Domain{Name: strings.TrimSpace(r.PostFormValue("name")), Postmaster: strings.TrimSpace(r.PostFormValue("postmaster"))}
	d, err := s.Domains.AddDomain(r.Context(), d)
	if err == nil {
		s.Logger.Info("domain added", "domain", d.Name, "by", whoOf(r.Context()))
	}
	done(w, r, "/domains", err, "domain "+d.Name+" added")
}

func (s *Server) domainOf(name string) (domain.Domain, bool) {
	if s.Domains == nil {
		return domain.Domain{}, false
	}
	for _, d := range s.Domains.Domains() {
		if d.Name == name {
			return d, true
		}
	}
	return domain.Domain{}, false
}

func (s *Server) domainPage(w http.ResponseWriter, r *http.Request) {
	name := strings.ToLower(r.PathValue("name"))
	d, ok := s.domainOf(name)
	if !ok {
		done(w, r, "/domains", fmt.Errorf("domain %s: %w", name, domain.ErrNotFound), "")
		return
	}
	v := struct {
		domain.Domain
		Aliases  []domain.Alias
		Usage    *usermgr.DomainUsage
		UsageErr string
	}{Domain: d, Aliases: s.Domains.Aliases(name)}
	ctx, cancel := context.WithTimeout(r.Context(), consoleDeadline)
	defer cancel()
	if u, err := s.Users.DomainUsage(ctx, name); err != nil {
		v.UsageErr = err.Error()
	} else {
		v.Usage = &u
	}
	s.render(w, r, "domain", name, v)
}

func (s *Server) domainPost(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
	name := strings.ToLower(r.PathValue("name"))
	d, ok := s.domainOf(name)
	if !ok {
		done(w, r, "/domains", fmt.Errorf("domain %s: %w", name, domain.ErrNotFound), "")
		return
	}
	ctx := r.Context()
	switch r.PostFormValue("action") {
	case "delete":
		err := s.Domains.DeleteDomain(ctx, name)
		if err != nil {
			done(w, r, "/domains/"+url.PathEscape(name), err, "")
			return
		}
		s.Logger.Info("domain deleted", "domain", name, "by", whoOf(ctx))
		done(w, r, "/domains", nil, "domain "+name+" deleted")
	default:
		d.Postmaster = strings.TrimSpace(r.PostFormValue("postmaster"))
		d.CatchAll = strings.TrimSpace(r.PostFormValue("catch_all"))
		storage, messages, err := quotaFields(r)
		if err != nil {
			done(w, r, "/domains/"+url.PathEscape(name), err, "")
			return
		}
		d.QuotaStorage, d.QuotaMessages, d.QuotaPermanent = storage, messages, r.PostFormValue("quota_permanent") != ""
		_, err = s.Domains.SetDomain(ctx, d)
		if err == nil {
			s.Logger.Info("domain changed", "domain", name, "postmaster", d.Postmaster, "catch_all", d.CatchAll, "by", whoOf(ctx))
		}
		done(w, r, "/domains/"+url.PathEscape(name), err, "domain "+name+" saved")
	}
}

// --- aliases

func (s *Server) aliasesPage(w http.ResponseWriter, r *http.Request) {
	var all []domain.Alias
	if s.Domains != nil {
		all = s.Domains.Aliases("")
	}
	q := strings.ToLower(strings.TrimSpace(r.URL.Query().Get("q")))
	var match []domain.Alias
	for _, a := range all {
		if q == "" || strings.Contains(a.Address, q) || slices.ContainsFunc(a.Targets, func(t string) bool { return strings.Contains(t, q) }) {
			match = append(match, a)
		}
	}
	shown, page, pages := pageOf(match, r)
	s.render(w, r, "aliases", "Aliases", struct {
		Q           string
		Rows        []domain.Alias
		Total       int
		Page, Pages int
		Edit        string
	}{q, shown, len(match), page, pages, r.URL.Query().Get("edit")})
}

// aliasesPost adds or changes an alias (action=save: address, targets
// separated by commas, spaces or lines) or deletes one (action=delete).
func (s *Server) aliasesPost(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
	if s.Domains == nil {
		done(w, r, "/aliases", errors.New("this node has no domain list"), "")
		return
	}
	ctx := r.Context()
	addr := strings.TrimSpace(r.PostFormValue("address"))
	switch r.PostFormValue("action") {
	case "delete":
		err := s.Domains.DeleteAlias(ctx, addr)
		if err == nil {
			s.Logger.Info("alias deleted", "alias", addr, "by", whoOf(ctx))
		}
		done(w, r, "/aliases", err, "alias "+addr+" deleted")
	default:
		targets := strings.FieldsFunc(r.PostFormValue("targets"), func(c rune) bool { return c == ',' || c == ' ' || c == '\n' || c == '\r' || c == '\t' })
		a, err := s.Domains.SetAlias(ctx, domain.Alias{Address: addr, Targets: targets})
		if err == nil {
			s.Logger.Info("alias set", "alias", a.Address, "targets", a.Targets, "by", whoOf(ctx))
		}
		done(w, r, "/aliases?q="+url.QueryEscape(a.Address), err, "alias "+a.Address+" saved")
	}
}

// --- quotas

// quotasPage lists the users with limits, or any user a search names.
func (s *Server) quotasPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, "quotas", "Quotas", s.userList(r, func(p userdb.Profile, q string) bool {
		if q == "" {
			return p.QuotaStorage > 0 || p.QuotaMessages > 0
		}
		return strings.Contains(p.Address, q)
	}))
}

// --- the outbound queue

func (s *Server) queuePage(w http.ResponseWriter, r *http.Request) {
	ctx, cancel := context.WithTimeout(r.Context(), consoleDeadline)
	defer cancel()
	s.render(w, r, "queue", "Outbound queue", s.queueView(ctx))
}

func (s *Server) queuePost(w http.ResponseWriter, r *http.Request) {
	r.Body = http.MaxBytesReader(w, r.Body, maxRequestBody)
	id, action := r.PathValue("id"), r.PostFormValue("action")
	if err := queue.ValidID(id); err != nil {
		done(w, r, "/queue", err, "")
		return
	}
	if action != "retry" && action != "delete" {
		done(w, r, "/queue", errors.New("unknown action"), "")
		return
	}
	if s.Queue == nil {
		done(w, r, "/queue", errors.New("this node has no outbound queue"), "")
		return
	}
	_, err := s.Queue.Act(r.Context(), id, action)
	if err == nil {
		s.Logger.Info("queue entry "+action, "id", id, "by", whoOf(r.Context()))
	}
	done(w, r, "/queue", err, "entry "+id+": "+action+" done")
}

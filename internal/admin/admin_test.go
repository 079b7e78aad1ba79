package admin_test

import (
	"encoding/json"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/admin"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/core"
	"github.com/quillmail/quill/internal/sns"
)

func newServer(t *testing.T, token string) *httptest.Server {
	ts, _ := newServerCore(t, token, false)
	return ts
}

// newServerCore is newServer with the node's core, and with domains (users
// only in served domains) if asked.
func newServerCore(t *testing.T, token string, domains bool) (*httptest.Server, *core.Core) {
	c, err := core.New(core.Options{DataDir: t.TempDir(), Log: slog.New(slog.DiscardHandler), SubaddressSeparator: "+"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := &admin.Server{Users: c.Users, Token: token, Logger: slog.New(slog.DiscardHandler), Node: admin.NodeInfo{
		ID: c.ID, Started: time.Now(), Load: c.Boxes.Pending, UserMap: c.Members.UserMap,
		Members: c.Members.Members,
		Workers: func() []sns.Status {
			return []sns.Status{{Class: sns.RelayClass, Max: 2, Launches: 1, Workers: []sns.WorkerStatus{{ID: 1, PID: 42, Alive: true}}}}
		},
		SNSManager: func() *sns.ManagerStatus {
			return &sns.ManagerStatus{Manager: "n-other", Term: 3, Table: []sns.NodeLoad{
				{Node: "n-other", Class: sns.RelayClass, Workers: 1, Max: 2, Pending: 3},
				{Node: string(c.ID), Class: sns.RelayClass, Workers: 1, Max: 2, Overflow: true}}}
		}}}
	if domains {
		s.Domains = c
	}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return ts, c
}

func call(t *testing.T, method, url, token, body string) (int, string) {
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var sb strings.Builder
	buf := make([]byte, 4096)
	for {
		n, err := resp.Body.Read(buf)
		sb.Write(buf[:n])
		if err != nil {
			break
		}
	}
	return resp.StatusCode, sb.String()
}

func TestUserLifecycle(t *testing.T) {
	ts := newServer(t, "")
	if c, b := call(t, "POST", ts.URL+"/api/users", "", `{"address":"Alice@Example.org","password":"pw"}`); c != 201 {
		t.Fatalf("add: %d %s", c, b)
	}
	if c, b := call(t, "POST", ts.URL+"/api/users", "", `{"address":"alice@example.org","password":"pw"}`); c != 409 || !strings.Contains(b, "alice@example.org") {
		t.Fatalf("duplicate add: %d %s", c, b)
	}
	if c, b := call(t, "POST", ts.URL+"/api/users", "", `{"address":"not-an-address","password":"pw"}`); c != 400 {
		t.Fatalf("bad address: %d %s", c, b)
	}
	if c, b := call(t, "POST", ts.URL+"/api/users", "", `{"address":"x@y.org"}`); c != 400 || !strings.Contains(b, "password") {
		t.Fatalf("no password: %d %s", c, b)
	}
	c, b := call(t, "GET", ts.URL+"/api/users", "", "")
	var list []struct{ Address, Password string }
	json.Unmarshal([]byte(b), &list)
	if c != 200 || len(list) != 1 || list[0].Address != "alice@example.org" || list[0].Password != "" {
		t.Fatalf("list: %d %s", c, b)
	}
	if c, b := call(t, "PUT", ts.URL+"/api/users/alice@example.org/password", "", `{"password":"new"}`); c != 204 {
		t.Fatalf("passwd: %d %s", c, b)
	}
	if c, b := call(t, "PUT", ts.URL+"/api/users/nobody@example.org/password", "", `{"password":"new"}`); c != 404 {
		t.Fatalf("passwd unknown: %d %s", c, b)
	}
	if c, b := call(t, "DELETE", ts.URL+"/api/users/alice@example.org", "", ""); c != 204 {
		t.Fatalf("del: %d %s", c, b)
	}
	if c, _ := call(t, "DELETE", ts.URL+"/api/users/alice@example.org", "", ""); c != 404 {
		t.Fatalf("del twice: %d", c)
	}
}

func TestTokenAndViews(t *testing.T) {
	ts := newServer(t, "sekrit")
	if c, _ := call(t, "GET", ts.URL+"/api/users", "", ""); c != 401 {
		t.Fatalf("no token: %d", c)
	}
	if c, _ := call(t, "GET", ts.URL+"/api/users", "wrong", ""); c != 401 {
		t.Fatalf("wrong token: %d", c)
	}
	if c, _ := call(t, "GET", ts.URL+"/healthz", "", ""); c != 200 {
		t.Fatalf("healthz needs no token: %d", c)
	}
	c, b := call(t, "GET", ts.URL+"/cluster", "sekrit", "")
	var st admin.ClusterStatus
	if c != 200 || json.Unmarshal([]byte(b), &st) != nil || len(st.Buckets) != cluster.Buckets || st.Members[0].Buckets != cluster.Buckets {
		t.Fatalf("cluster: %d %s", c, b)
	}
	if c, b := call(t, "GET", ts.URL+"/", "sekrit", ""); c != 200 || !strings.Contains(b, "bucket 255") ||
		!strings.Contains(b, "Workers (SNS)") || !strings.Contains(b, "n-other</td>") || !strings.Contains(b, "</html>") {
		t.Fatalf("console (the whole page, with the SNS manager's table): %d\n%s", c, b)
	}
	if c, b := call(t, "GET", ts.URL+"/api/sns/manager", "sekrit", ""); c != 200 || !strings.Contains(b, `"manager": "n-other"`) {
		t.Fatalf("/api/sns/manager: %d %s", c, b)
	}
	if c, b := call(t, "GET", ts.URL+"/metrics", "sekrit", ""); c != 200 || !strings.Contains(b, "quill_messages_delivered_total") {
		t.Fatalf("metrics: %d", c)
	}
}

// A browser opening /?token= gets a console session cookie, which opens
// the console; a wrong token in the query sets nothing and sends the
// browser to the sign-in page.
func TestDashboardTokenCookie(t *testing.T) {
	ts := newServer(t, "sekrit")
	client := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	resp, err := client.Get(ts.URL + "/?token=wrong")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || !strings.HasPrefix(resp.Header.Get("Location"), "/signin") || len(resp.Cookies()) != 0 {
		t.Fatalf("wrong token: %d to %q, cookies %v", resp.StatusCode, resp.Header.Get("Location"), resp.Cookies())
	}
	resp, err = client.Get(ts.URL + "/?token=sekrit")
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusSeeOther || len(resp.Cookies()) != 1 || !resp.Cookies()[0].HttpOnly {
		t.Fatalf("right token: %d, cookies %v", resp.StatusCode, resp.Cookies())
	}
	if v := resp.Cookies()[0].Value; strings.Contains(v, "sekrit") {
		t.Fatalf("the session cookie carries the token itself: %q", v)
	}
	req, _ := http.NewRequest("GET", ts.URL+"/", nil)
	req.AddCookie(resp.Cookies()[0])
	resp, err = client.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("dashboard with the cookie: %d", resp.StatusCode)
	}
}

// The profiler is not served unless asked for.
func TestPprofOffByDefault(t *testing.T) {
	ts := newServer(t, "sekrit")
	if c, _ := call(t, "GET", ts.URL+"/debug/pprof/", "sekrit", ""); c != 404 {
		t.Fatalf("/debug/pprof/ without --pprof: %d, want 404", c)
	}
}

// /cluster counts each node's users as it answered the listing, and a
// listing every node answered in time carries no stale marks and names
// no unreachable node.
func TestClusterCountsUsersPerNode(t *testing.T) {
	ts := newServer(t, "")
	for _, u := range []string{"a@example.org", "b@example.org"} {
		if c, b := call(t, "POST", ts.URL+"/api/users", "", `{"address":"`+u+`","password":"pw"}`); c != 201 {
			t.Fatalf("add %s: %d %s", u, c, b)
		}
	}
	c, b := call(t, "GET", ts.URL+"/cluster", "", "")
	var st admin.ClusterStatus
	if c != 200 || json.Unmarshal([]byte(b), &st) != nil || st.Users != 2 || st.Members[0].Users != 2 ||
		st.Members[0].UsersStale != nil || st.Unreachable != nil || st.Members[0].Since.IsZero() {
		t.Fatalf("cluster: %d %s", c, b)
	}
	resp, err := http.Get(ts.URL + "/api/users")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var users []map[string]any
	if err := json.NewDecoder(resp.Body).Decode(&users); err != nil || len(users) != 2 || users[0]["stale"] != nil ||
		resp.Header.Get(admin.UnreachableHeader) != "" {
		t.Fatalf("users: %v %v %v", users, err, resp.Header)
	}
}

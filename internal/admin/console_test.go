package admin_test

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/cookiejar"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/admin"
	"github.com/quillmail/quill/internal/core"
	"github.com/quillmail/quill/internal/telemetry"
)

// consoleServer is a console on a one-node core with domains, admin-user
// sign-in and telemetry.
func consoleServer(t *testing.T) (*httptest.Server, *core.Core) {
	c, err := core.New(core.Options{DataDir: t.TempDir(), Log: slog.New(slog.DiscardHandler), SubaddressSeparator: "+"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	rep := &telemetry.Reporter{Figures: func(r *telemetry.Report) { r.Node, r.Hostname, r.Messages = string(c.ID), "mx1.test", 42 }}
	view := telemetry.NewView(telemetry.Sources{Self: c.ID, Members: c.Members.Members, Local: rep.Report})
	s := &admin.Server{Users: c.Users, Domains: c, Verifier: c.Proxy, View: view, Token: "sekrit",
		Logger: slog.New(slog.DiscardHandler), Node: admin.NodeInfo{ID: c.ID, Started: time.Now(), Load: c.Boxes.Pending,
			UserMap: c.Members.UserMap, Members: c.Members.Members}}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	return ts, c
}

// browser is a client with a cookie jar that does not follow redirects,
// so each step's answer can be checked.
type browser struct {
	t  *testing.T
	c  *http.Client
	ts *httptest.Server
}

func newBrowser(t *testing.T, ts *httptest.Server) *browser {
	jar, _ := cookiejar.New(nil)
	return &browser{t: t, ts: ts, c: &http.Client{Jar: jar,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

// get returns the status, the redirect target and the body.
func (b *browser) get(path string) (int, string, string) {
	resp, err := b.c.Get(b.ts.URL + path)
	if err != nil {
		b.t.Fatal(err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(resp.Body)
	return resp.StatusCode, resp.Header.Get("Location"), string(body)
}

// post sends a form as the console's own page does.
func (b *browser) post(path string, form url.Values, origin string) (int, string) {
	req, _ := http.NewRequest("POST", b.ts.URL+path, strings.NewReader(form.Encode()))
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if origin != "" {
		req.Header.Set("Origin", origin)
	}
	resp, err := b.c.Do(req)
	if err != nil {
		b.t.Fatal(err)
	}
	resp.Body.Close()
	return resp.StatusCode, resp.Header.Get("Location")
}

// follow posts and reads the page the answer redirects to.
func (b *browser) follow(path string, form url.Values) string {
	code, to := b.post(path, form, b.ts.URL)
	if code != http.StatusSeeOther {
		b.t.Fatalf("POST %s: %d", path, code)
	}
	_, _, body := b.get(to)
	return body
}

func TestConsoleSignIn(t *testing.T) {
	ts, c := consoleServer(t)
	b := newBrowser(t, ts)
	if code, to, _ := b.get("/users"); code != http.StatusSeeOther || to != "/signin?next=%2Fusers" {
		t.Fatalf("signed out: %d to %q", code, to)
	}
	if code, _, body := b.get("/signin"); code != 200 || !strings.Contains(body, `name="token"`) {
		t.Fatalf("sign-in page: %d", code)
	}
	if code, _, _ := b.get("/static/htmx.min.js"); code != 200 {
		t.Fatalf("htmx without signing in: %d", code)
	}
	if code, _, _ := b.get("/api/users"); code != 200 && code != 401 {
		t.Fatalf("API without a token: %d", code)
	}
	// A wrong token: back to the form with the reason.
	_, to := b.post("/signin", url.Values{"token": {"nope"}, "next": {"/users"}}, "")
	if !strings.HasPrefix(to, "/signin?") || !strings.Contains(to, "wrong+admin+token") {
		t.Fatalf("wrong token sent to %q", to)
	}
	// A user who is not an administrator cannot sign in; one who is can.
	ctx := context.Background()
	if _, err := c.Users.AddUser(ctx, "ann@example.org", "pw-ann-1"); err != nil {
		t.Fatal(err)
	}
	_, to = b.post("/signin", url.Values{"user": {"ann@example.org"}, "password": {"pw-ann-1"}}, "")
	if !strings.Contains(to, "not+an+administrator") {
		t.Fatalf("non-admin user sent to %q", to)
	}
	if err := c.Users.SetAdmin(ctx, "ann@example.org", true); err != nil {
		t.Fatal(err)
	}
	_, to = b.post("/signin", url.Values{"user": {"ann@example.org"}, "password": {"wrong"}}, "")
	if !strings.Contains(to, "wrong+address+or+password") {
		t.Fatalf("wrong password sent to %q", to)
	}
	code, to := b.post("/signin", url.Values{"user": {"ann@example.org"}, "password": {"pw-ann-1"}, "next": {"/users"}}, "")
	if code != http.StatusSeeOther || to != "/users" {
		t.Fatalf("admin sign-in: %d to %q", code, to)
	}
	if code, _, body := b.get("/users"); code != 200 || !strings.Contains(body, "ann@example.org") || !strings.Contains(body, "admin") {
		t.Fatalf("users page after sign-in: %d", code)
	}
	// An administrator demoted elsewhere loses the console at the next
	// check of the session.
	defer admin.SetSessionRecheck(0)()
	if err := c.Users.SetAdmin(ctx, "ann@example.org", false); err != nil {
		t.Fatal(err)
	}
	if code, to, _ := b.get("/users"); code != http.StatusSeeOther || !strings.HasPrefix(to, "/signin") {
		t.Fatalf("a demoted administrator's session: %d to %q", code, to)
	}
	// A return address elsewhere is not followed.
	for _, next := range []string{"//evil.example/", "/\\evil.example", "/\tevil", "https://evil.example/"} {
		_, to = b.post("/signin", url.Values{"token": {"sekrit"}, "next": {next}}, "")
		if to != "/" {
			t.Fatalf("sign-in with next=%q returned to %q", next, to)
		}
	}
	// A sign-in posted from another site's page is refused.
	if _, to := b.post("/signin", url.Values{"token": {"sekrit"}}, "http://evil.example"); !strings.Contains(to, "another+site") {
		t.Fatalf("cross-site sign-in sent to %q", to)
	}
	// Signing out ends the session.
	b.post("/signout", nil, ts.URL)
	if code, _, _ := b.get("/users"); code != http.StatusSeeOther {
		t.Fatalf("after sign-out: %d", code)
	}
}

func TestConsoleManagesDomainsUsersAliasesQuotas(t *testing.T) {
	ts, _ := consoleServer(t)
	b := newBrowser(t, ts)
	if _, to := b.post("/signin", url.Values{"token": {"sekrit"}}, ""); to != "/" {
		t.Fatalf("sign-in: %q", to)
	}
	// A change from another site's page is refused.
	if code, _ := b.post("/domains", url.Values{"name": {"evil.test"}}, "http://evil.example"); code != http.StatusForbidden {
		t.Fatalf("cross-site POST: %d", code)
	}
	if body := b.follow("/users", url.Values{"address": {"bob@example.org"}, "password": {"pw"}}); !strings.Contains(body, "not served here") {
		t.Fatalf("a user in a domain not served: %s", body)
	}
	if body := b.follow("/domains", url.Values{"name": {"example.org"}}); !strings.Contains(body, "domain example.org added") ||
		!strings.Contains(body, `data-domain="example.org"`) {
		t.Fatalf("domain add: %s", body)
	}
	body := b.follow("/users", url.Values{"address": {"bob@example.org"}, "password": {"pw-bob-1"}, "storage": {"2M"}, "messages": {"100"}})
	if !strings.Contains(body, "user bob@example.org added") || !strings.Contains(body, "of 2.0M") {
		t.Fatalf("user add with a quota: %s", body)
	}
	// The domain's first user became its postmaster.
	if _, _, body := b.get("/domains/example.org"); !strings.Contains(body, `value="bob@example.org"`) {
		t.Fatalf("domain page: %s", body)
	}
	if body := b.follow("/aliases", url.Values{"action": {"save"}, "address": {"sales@example.org"}, "targets": {"bob@example.org"}}); !strings.Contains(body, `data-alias="sales@example.org"`) {
		t.Fatalf("alias add: %s", body)
	}
	if _, _, body := b.get("/aliases?q=bob"); !strings.Contains(body, "sales@example.org") {
		t.Fatalf("alias search by target: %s", body)
	}
	if _, _, body := b.get("/quotas"); !strings.Contains(body, `data-user="bob@example.org"`) || !strings.Contains(body, "2.0M") {
		t.Fatalf("quotas page: %s", body)
	}
	if body := b.follow("/users/bob@example.org", url.Values{"action": {"quota"}, "storage": {""}, "messages": {"5"}}); !strings.Contains(body, "quota set") {
		t.Fatalf("quota change: %s", body)
	}
	if _, _, body := b.get("/users?q=bob"); !strings.Contains(body, "of 5 messages") || strings.Contains(body, "of 2.0M") {
		t.Fatalf("users page after the quota change: %s", body)
	}
	if body := b.follow("/users/bob@example.org", url.Values{"action": {"quota"}, "storage": {"lots"}}); !strings.Contains(body, "storage limit") {
		t.Fatalf("a bad size: %s", body)
	}
	// A domain in use cannot go; its alias and user can, then it can.
	if body := b.follow("/domains/example.org", url.Values{"action": {"delete"}}); !strings.Contains(body, "in use") {
		t.Fatalf("deleting a domain in use: %s", body)
	}
	b.follow("/aliases", url.Values{"action": {"delete"}, "address": {"sales@example.org"}})
	if body := b.follow("/users/bob@example.org", url.Values{"action": {"delete"}}); !strings.Contains(body, "user bob@example.org deleted") {
		t.Fatalf("user delete: %s", body)
	}
	if body := b.follow("/domains/example.org", url.Values{"action": {"delete"}}); !strings.Contains(body, "domain example.org deleted") {
		t.Fatalf("domain delete: %s", body)
	}
	// The cluster picture, whole and as the fragment the page refreshes.
	_, _, body = b.get("/")
	for _, want := range []string{"1 of 1</b>", "mx1.test", `data-state="alive"`, "bucket 255", "Deliveries per minute", "<svg"} {
		if !strings.Contains(body, want) {
			t.Fatalf("overview lacks %q:\n%s", want, body)
		}
	}
	if _, _, part := b.get("/ui/cluster"); strings.Contains(part, "<html") || !strings.Contains(part, "42 (0 B)") {
		t.Fatalf("cluster fragment: %s", part)
	}
}

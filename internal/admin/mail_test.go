package admin_test

import (
	"encoding/json"
	"log/slog"
	"net/http/httptest"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/quillmail/quill/internal/admin"
	"github.com/quillmail/quill/internal/core"
	"github.com/quillmail/quill/internal/migrate"
	"github.com/quillmail/quill/internal/proxy"
)

// The mail API on a real core: mailboxes made once, messages stored with
// their flags and date through the IMAP path, listed with their keys,
// read back, flags set; the size limit, the quota and bad input refused.
func TestMailAPI(t *testing.T) {
	c, err := core.New(core.Options{DataDir: t.TempDir(), Log: slog.New(slog.DiscardHandler)})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	s := &admin.Server{Users: c.Users, Logger: slog.New(slog.DiscardHandler), Mail: &proxy.IMAPStore{P: c.Proxy},
		MaxMessageBytes: 1000, Node: admin.NodeInfo{ID: c.ID}}
	ts := httptest.NewServer(s.Handler())
	t.Cleanup(ts.Close)
	u := ts.URL + "/api/users/bob@example.org"
	if code, b := call(t, "GET", u+"/mailboxes", "", ""); code != 404 {
		t.Fatalf("mailboxes of an unknown user: %d %s", code, b)
	}
	if code, b := call(t, "POST", ts.URL+"/api/users", "", `{"address":"bob@example.org","password":"pw"}`); code != 201 {
		t.Fatalf("add user: %d %s", code, b)
	}
	code, b := call(t, "GET", u+"/mailboxes", "", "")
	if code != 200 || !strings.Contains(b, `"special_use": "\\Sent"`) || !strings.Contains(b, `"max_message_size": 1000`) {
		t.Fatalf("mailboxes: %d %s", code, b)
	}
	if code, b := call(t, "POST", u+"/mailboxes", "", `{"name":"Foo/Bär","subscribed":true}`); code != 201 || !strings.Contains(b, `"subscribed": true`) {
		t.Fatalf("create: %d %s", code, b)
	}
	if code, b := call(t, "POST", u+"/mailboxes", "", `{"name":"Foo/Bär","subscribed":true}`); code != 200 {
		t.Fatalf("create again: %d %s", code, b)
	}
	for _, bad := range []string{`{"name":"a//b"}`, `{"name":"x","special_use":"\\Bogus"}`, `{"name":"x","extra":1}`} {
		if code, b := call(t, "POST", u+"/mailboxes", "", bad); code != 400 {
			t.Errorf("create %s: %d %s", bad, code, b)
		}
	}
	box := url.QueryEscape("Foo/Bär")
	msg := "Subject: hi\r\n\r\n8-bit \xe9\r\n"
	date := time.Date(2020, 2, 3, 4, 5, 6, 0, time.UTC)
	code, b = call(t, "POST", u+"/messages?mailbox="+box+"&flag=%5CSeen&flag=%24Label1&date="+date.Format(time.RFC3339), "", msg)
	if code != 201 || !strings.Contains(b, `"uid": 1`) {
		t.Fatalf("append: %d %s", code, b)
	}
	var appended struct{ ID string }
	json.Unmarshal([]byte(b), &appended)
	code, b = call(t, "GET", u+"/messages?keys=1&mailbox="+box, "", "")
	lines := strings.Split(strings.TrimSpace(b), "\n")
	var got struct {
		UID   uint32
		Size  int64
		Date  time.Time
		Flags []string
		Key   string
	}
	if code != 200 || len(lines) != 2 || json.Unmarshal([]byte(lines[0]), &got) != nil || lines[1] != `{"end":1}` {
		t.Fatalf("list: %d %q", code, lines)
	}
	if got.UID != 1 || got.Size != int64(len(msg)) || !got.Date.Equal(date) || !migrate.SameFlags(got.Flags, []string{`\Seen`, `$Label1`}) ||
		got.Key != migrate.KeyOf([]byte(msg)) {
		t.Errorf("listed %+v", got)
	}
	if code, b := call(t, "GET", u+"/messages/"+appended.ID, "", ""); code != 200 || b != msg {
		t.Errorf("get: %d %q", code, b)
	}
	if code, b := call(t, "POST", u+"/flags", "", `{"mailbox":"Foo/Bär","uids":[1],"flags":["\\Flagged"]}`); code != 200 || !strings.Contains(b, `"updated": 1`) {
		t.Errorf("flags: %d %s", code, b)
	}
	if _, b := call(t, "GET", u+"/messages?mailbox="+box, "", ""); !strings.Contains(b, `"flags":["\\Flagged"]`) || strings.Contains(b, `"key"`) {
		t.Errorf("after flags: %s", b)
	}
	for what, tc := range map[string]struct {
		query, body string
		code        int
	}{
		"too big":    {"mailbox=INBOX", strings.Repeat("x", 1001), 413},
		"empty":      {"mailbox=INBOX", "", 400},
		"bad flag":   {"mailbox=INBOX&flag=a%20b", msg, 400},
		"bad date":   {"mailbox=INBOX&date=yesterday", msg, 400},
		"no mailbox": {"mailbox=Nope", msg, 404},
	} {
		if code, b := call(t, "POST", u+"/messages?"+tc.query, "", tc.body); code != tc.code {
			t.Errorf("append %s: %d %s, want %d", what, code, b, tc.code)
		}
	}
	if code, b := call(t, "PUT", u+"/quota", "", `{"storage":0,"messages":1}`); code != 204 {
		t.Fatalf("quota: %d %s", code, b)
	}
	if code, b := call(t, "POST", u+"/messages?mailbox=INBOX", "", msg); code != 507 || !strings.Contains(b, "quota") {
		t.Errorf("over quota: %d %s", code, b)
	}
}

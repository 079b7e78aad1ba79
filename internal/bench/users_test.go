package bench

import (
	"bytes"
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
)

func TestParseUsers(t *testing.T) {
	in := "# bench users\nuser00001@d.example secret\n\n  user00002@d.example  \n"
	users, err := ParseUsers(strings.NewReader(in), "dflt")
	if err != nil {
		t.Fatal(err)
	}
	want := []User{{"user00001@d.example", "secret"}, {"user00002@d.example", "dflt"}}
	if len(users) != 2 || users[0] != want[0] || users[1] != want[1] {
		t.Fatalf("got %v", users)
	}
	for _, bad := range []string{"", "# nothing\n", "a@b c d\n", "nobody pw\n"} {
		if _, err := ParseUsers(strings.NewReader(bad), "x"); err == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

func TestGenerateUsers(t *testing.T) {
	u := GenerateUsers(3, "b.example", "pw")
	if len(u) != 3 || u[2] != (User{"user00003@b.example", "pw"}) {
		t.Fatalf("got %v", u)
	}
}

func TestCreatorCreates(t *testing.T) {
	var mu sync.Mutex
	seen := map[string]string{"user00002@d.example": "old"}
	domains := map[string]bool{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer tok" {
			http.Error(w, "no", http.StatusUnauthorized)
			return
		}
		if r.Method == http.MethodPost && r.URL.Path == "/api/domains" {
			var d struct{ Name string }
			json.NewDecoder(r.Body).Decode(&d)
			mu.Lock()
			defer mu.Unlock()
			domains[d.Name] = true
			w.WriteHeader(http.StatusCreated)
			return
		}
		if r.Method != http.MethodPost || r.URL.Path != "/api/users" {
			http.NotFound(w, r)
			return
		}
		var body struct{ Address, Password string }
		if err := json.NewDecoder(r.Body).Decode(&body); err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		mu.Lock()
		defer mu.Unlock()
		if !domains[body.Address[strings.LastIndexByte(body.Address, '@')+1:]] {
			http.Error(w, "domain not served", http.StatusBadRequest)
			return
		}
		if _, ok := seen[body.Address]; ok {
			w.WriteHeader(http.StatusConflict)
			return
		}
		seen[body.Address] = body.Password
		w.WriteHeader(http.StatusCreated)
	}))
	defer srv.Close()

	var progress bytes.Buffer
	c := &Creator{BaseURL: srv.URL + "/", Token: "tok", Parallel: 3, Progress: &progress}
	res, err := c.Create(context.Background(), GenerateUsers(50, "d.example", "pw"))
	if err != nil {
		t.Fatal(err)
	}
	if res.Created != 49 || res.Existed != 1 {
		t.Errorf("got %+v", res)
	}
	if len(seen) != 50 || seen["user00050@d.example"] != "pw" {
		t.Errorf("server has %d users", len(seen))
	}
	if !strings.Contains(progress.String(), "50/50") {
		t.Errorf("progress %q", progress.String())
	}

	c.Token = "wrong"
	if _, err := c.Create(context.Background(), GenerateUsers(5, "e.example", "pw")); err == nil ||
		!strings.Contains(err.Error(), "401") {
		t.Errorf("bad token: %v", err)
	}
}

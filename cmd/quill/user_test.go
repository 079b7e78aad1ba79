package main

import (
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

// TestAdminReadRetriedWhenBusy: a read the admin API answers 503 (a node
// that waited cluster.FanOutWait for another) is asked again and gets the
// answer; a write answered 503 is not sent again (it may have been made).
func TestAdminReadRetriedWhenBusy(t *testing.T) {
	var gets, puts atomic.Int32
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		n := &gets
		if r.Method != "GET" {
			n = &puts
		}
		if n.Add(1) <= 2 {
			w.WriteHeader(http.StatusServiceUnavailable)
			w.Write([]byte(`{"error": "no answer within 500ms: context deadline exceeded"}`))
			return
		}
		w.Write([]byte(`{"messages": 7}`))
	}))
	defer srv.Close()
	c := &adminClient{server: srv.URL, token: "t"}
	var q struct{ Messages int }
	if err := c.do("GET", "/api/users/a@example.org/quota", nil, &q); err != nil || q.Messages != 7 {
		t.Fatalf("GET after two 503s: %v, %+v", err, q)
	}
	if n := gets.Load(); n != 3 {
		t.Errorf("GET sent %d times, want 3", n)
	}
	err := c.do("PUT", "/api/users/a@example.org/quota", map[string]int{"messages": 1}, nil)
	if !isBusy(err) {
		t.Fatalf("PUT answered 503: %v, want the 503", err)
	}
	if n := puts.Load(); n != 1 {
		t.Errorf("PUT sent %d times, want 1", n)
	}
}

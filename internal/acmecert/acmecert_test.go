package acmecert

import (
	"io"
	"net/http/httptest"
	"testing"
	"time"
)

func TestNeedsOrder(t *testing.T) {
	now := time.Date(2026, 11, 24, 0, 0, 0, 0, time.UTC)
	day := 24 * time.Hour
	acmeCert := func(names []string, start time.Time, life time.Duration) Cert {
		return Cert{Names: names, NotBefore: start, NotAfter: start.Add(life)}
	}
	names := []string{"mail.example.org", "imap.example.org"}
	for _, tc := range []struct {
		name  string
		certs []Cert
		want  bool
	}{
		{"none", nil, true},
		{"fresh", []Cert{acmeCert(names, now.Add(-10*day), 90*day)}, false},
		{"two thirds used", []Cert{acmeCert(names, now.Add(-61*day), 90*day)}, true},
		{"expired", []Cert{acmeCert(names, now.Add(-100*day), 90*day)}, true},
		{"covers one name only", []Cert{acmeCert(names[:1], now, 90*day)}, true},
		{"case of names", []Cert{acmeCert([]string{"MAIL.example.org", "imap.EXAMPLE.org"}, now, 90*day)}, false},
		{"operator's, with life left", []Cert{{Names: names, NotBefore: now, NotAfter: now.Add(90 * day)}}, false},
		{"operator's, near its end", []Cert{{Names: names, NotBefore: now.Add(-85 * day), NotAfter: now.Add(5 * day)}}, true},
		{"an old one and a renewed one", []Cert{acmeCert(names, now.Add(-89*day), 90*day), acmeCert(names, now.Add(-day), 90*day)}, false},
	} {
		if got := NeedsOrder(names, tc.certs, now); got != tc.want {
			t.Errorf("%s: NeedsOrder = %v, want %v", tc.name, got, tc.want)
		}
	}
}

func TestChallengeHandler(t *testing.T) {
	h := ChallengeHandler(func(name string) ([]byte, bool) {
		if name == ChallengePrefix+"tok" {
			return []byte("tok.thumbprint"), true
		}
		return nil, false
	})
	for path, want := range map[string]int{
		"/.well-known/acme-challenge/tok":   200,
		"/.well-known/acme-challenge/other": 404,
		"/.well-known/acme-challenge/":      404,
		"/.well-known/acme-challenge/a/b":   404,
		"/":                                 404,
	} {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, httptest.NewRequest("GET", path, nil))
		if rec.Code != want {
			t.Errorf("GET %s: %d, want %d", path, rec.Code, want)
		}
		if want == 200 {
			if b, _ := io.ReadAll(rec.Body); string(b) != "tok.thumbprint" {
				t.Errorf("answer %q", b)
			}
		}
	}
}

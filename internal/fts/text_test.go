package fts

import (
	"slices"
	"strings"
	"testing"
)

func tokens(s string) []string {
	var out []string
	Tokens(s, func(t string) { out = append(out, t) })
	return out
}

func TestTokens(t *testing.T) {
	if got := tokens("hello, wörld-42 _x_"); !slices.Equal(got, []string{"hello", "wörld", "42", "x"}) {
		t.Fatalf("tokens: %q", got)
	}
	// A run longer than maxToken is kept as overlapping windows: every
	// piece up to needleToken+1 bytes lies inside one.
	long := strings.Repeat("abcdefghijklmnopqrstuvwxyz0123456789", 5) // 180 bytes
	win := tokens(long)
	for i := 0; i+needleToken <= len(long); i++ {
		piece := long[i : i+needleToken]
		if !slices.ContainsFunc(win, func(w string) bool { return strings.Contains(w, piece) }) {
			t.Fatalf("piece at %d of a long token is in no window %q", i, win)
		}
	}
	// A needle's long token gives pieces of itself, each cut to
	// needleToken bytes: each is a piece of any text that holds it.
	got := NeedleTokens("Foo-" + long)
	if len(got) < 2 || got[0] != "foo" {
		t.Fatalf("needle tokens %q", got)
	}
	for _, p := range got[1:] {
		if len(p) > needleToken || !strings.Contains(long, p) {
			t.Fatalf("needle token %q: over %d bytes or not a piece of the needle", p, needleToken)
		}
	}
}

func TestBodyTextLeavesOutBase64(t *testing.T) {
	raw := "Content-Type: multipart/mixed; boundary=b\r\n\r\n--b\r\nContent-Type: text/plain; charset=utf-8\r\nContent-Transfer-Encoding: base64\r\n\r\nSGVsbG8gV29ybGQ=\r\n--b\r\nContent-Type: image/png; name=pic.png\r\nContent-Transfer-Encoding: base64\r\n\r\niVBORw0KGgo=\r\n--b--\r\n"
	got := BodyText([]byte(raw))
	for _, want := range []string{"hello world", "pic.png"} {
		if !strings.Contains(got, want) {
			t.Errorf("body text %q lacks %q", got, want)
		}
	}
	for _, not := range []string{"sgvsbg8", "ivborw0"} {
		if strings.Contains(got, not) {
			t.Errorf("body text %q holds base64 %q", got, not)
		}
	}
}

func TestBitset(t *testing.T) {
	var a, b Bitset
	for _, d := range []uint32{1, 64, 200} {
		a.Set(d)
	}
	b.Set(64)
	b.Set(500)
	a.And(b)
	if !a.Has(64) || a.Has(1) || a.Has(200) || a.Has(500) {
		t.Fatalf("and: %v", a)
	}
	a.Or(b)
	if !a.Has(500) || a.Empty() {
		t.Fatalf("or: %v", a)
	}
}

// A multipart whose boundary is missing or never appears is searched as
// written.
func TestBodyTextBrokenMultipart(t *testing.T) {
	for _, raw := range []string{
		"Content-Type: multipart/mixed\r\n\r\nplain words here\r\n",
		"Content-Type: multipart/mixed; boundary=zz\r\n\r\nplain words here\r\n",
		"Content-Type: message/rfc822\r\n\r\nplain words here\r\n",
	} {
		if got := BodyText([]byte(raw)); !strings.Contains(got, "plain words") {
			t.Errorf("%q: body text %q", raw, got)
		}
	}
}

package queue

import "testing"

// FuzzParseSTSPolicy: a policy from any HTTPS server never panics the
// parser, and one it accepts has a known mode and, unless none, an mx.
func FuzzParseSTSPolicy(f *testing.F) {
	f.Add("version: STSv1\nmode: enforce\nmx: *.example.net\nmax_age: 604800\n")
	f.Add("version: STSv1\r\nmode: testing\r\nmx: a\r\nmx: b\r\nmax_age: 99999999999\r\n")
	f.Add("version: STSv1\nmode: none\nmax_age: 1")
	f.Fuzz(func(t *testing.T, text string) {
		p, err := parseSTSPolicy(text)
		if err != nil {
			return
		}
		if p.Mode != "enforce" && p.Mode != "testing" && p.Mode != "none" || (p.Mode != "none" && len(p.MX) == 0) || p.MaxAge > stsMaxAge {
			t.Fatalf("accepted %q as %+v", text, p)
		}
		for _, m := range p.MX {
			p.matches(m)
		}
	})
}

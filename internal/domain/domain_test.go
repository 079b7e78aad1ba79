package domain

import (
	"slices"
	"testing"
)

type tables struct {
	domains map[string]Domain
	aliases map[string]Alias
}

func (t tables) Domain(n string) (Domain, bool) { d, ok := t.domains[n]; return d, ok }
func (t tables) Alias(a string) (Alias, bool)   { x, ok := t.aliases[a]; return x, ok }

func TestValidName(t *testing.T) {
	for _, ok := range []string{"example.org", "a-b.c0.example", "localhost", "xn--bcher-kva.example"} {
		if err := ValidName(ok); err != nil {
			t.Errorf("%s: %v", ok, err)
		}
	}
	for _, bad := range []string{"", "Example.org", "a_b.org", "-a.org", "a-.org", "a..org", ".org", "org.", "a b.org", "a/b.org"} {
		if ValidName(bad) == nil {
			t.Errorf("%q accepted", bad)
		}
	}
}

// Aliases of aliases are followed, each address once, and a loop ends.
func TestExpand(t *testing.T) {
	tb := tables{aliases: map[string]Alias{
		"all@x.org":  {Targets: []string{"team@x.org", "boss@x.org"}},
		"team@x.org": {Targets: []string{"a@x.org", "b@x.org", "all@x.org"}},
		"loop1@x":    {Targets: []string{"loop2@x"}},
		"loop2@x":    {Targets: []string{"loop1@x"}},
	}}
	if got, ok := Expand("all@x.org", tb); !ok || !slices.Equal(got, []string{"a@x.org", "b@x.org", "boss@x.org"}) {
		t.Errorf("all@: %v %v", got, ok)
	}
	if got, ok := Expand("loop1@x", tb); !ok || len(got) != 0 {
		t.Errorf("a loop: %v %v, want nothing", got, ok)
	}
	if _, ok := Expand("a@x.org", tb); ok {
		t.Error("a@ is no alias")
	}
}

func TestFallbacks(t *testing.T) {
	tb := tables{domains: map[string]Domain{
		"x.org": {Name: "x.org", Postmaster: "pm@x.org", CatchAll: "all@x.org"},
		"y.org": {Name: "y.org"},
	}}
	for _, c := range []struct {
		addr, sep string
		want      []string
	}{
		{"a+tag@x.org", "+", []string{"a@x.org", "all@x.org"}},
		{"a-tag@x.org", "-", []string{"a@x.org", "all@x.org"}},
		{"a+tag@x.org", "", []string{"all@x.org"}},
		{"+tag@x.org", "+", []string{"all@x.org"}},
		{"postmaster@x.org", "+", []string{"pm@x.org", "all@x.org"}},
		{"abuse+spam@x.org", "+", []string{"abuse@x.org", "pm@x.org", "all@x.org"}},
		{"postmaster@y.org", "+", nil},
		{"a+b@z.org", "+", []string{"a@z.org"}},
	} {
		if got := Fallbacks(c.addr, c.sep, tb); !slices.Equal(got, c.want) {
			t.Errorf("Fallbacks(%s, %q) = %v, want %v", c.addr, c.sep, got, c.want)
		}
	}
}

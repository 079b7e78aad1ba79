package admin_test

import (
	"context"
	"encoding/json"
	"slices"
	"strings"
	"testing"

	"github.com/quillmail/quill/internal/domain"
)

// Issue 14 item 1: users only in served domains, with addresses that are
// safe; domains and aliases through the API; and what an address reaches:
// an alias first, then the user, then the address without its tag, the
// postmaster for RFC 2142's role addresses, the catch-all.
func TestDomainsAliasesAndWhatAnAddressReaches(t *testing.T) {
	ts, c := newServerCore(t, "", true)
	must := func(method, path, body string, want int) string {
		t.Helper()
		code, b := call(t, method, ts.URL+path, "", body)
		if code != want {
			t.Fatalf("%s %s %s: %d %s, want %d", method, path, body, code, b, want)
		}
		return b
	}
	if b := must("POST", "/api/users", `{"address":"victim@gmail.com","password":"pw"}`, 400); !strings.Contains(b, `domain \"gmail.com\" is not served`) {
		t.Errorf("user in a domain nobody added: %s", b)
	}
	must("POST", "/api/domains", `{"name":"a_b.org"}`, 400)
	must("POST", "/api/domains", `{"name":"Example.ORG"}`, 201)
	must("POST", "/api/domains", `{"name":"example.org"}`, 409)
	for _, bad := range []string{"../x@example.org", "a/b@example.org", ".x@example.org"} {
		must("POST", "/api/users", `{"address":"`+bad+`","password":"pw"}`, 400)
	}
	must("POST", "/api/users", `{"address":"alice@example.org","password":"pw"}`, 201)
	must("POST", "/api/users", `{"address":"bob@example.org","password":"pw"}`, 201)
	var ds []domain.Domain
	if err := json.Unmarshal([]byte(must("GET", "/api/domains", "", 200)), &ds); err != nil || len(ds) != 1 || ds[0].Postmaster != "alice@example.org" {
		t.Errorf("the first user is not the postmaster: %+v %v", ds, err)
	}

	must("PUT", "/api/aliases/sales@example.org", `{"targets":["Alice@example.org","bob@example.org","alice@example.org"]}`, 200)
	must("PUT", "/api/aliases/team@example.org", `{"targets":["sales@example.org","carol@elsewhere.net"]}`, 400) // no forwarding
	must("PUT", "/api/aliases/team@example.org", `{"targets":["sales@example.org","dave@example.org"]}`, 200)
	must("PUT", "/api/aliases/bob@example.org", `{"targets":["alice@example.org"]}`, 200) // an alias before the user
	must("PUT", "/api/aliases/x@other.org", `{"targets":["alice@example.org"]}`, 400)     // not a served domain
	must("PUT", "/api/aliases/loop@example.org", `{"targets":["loop@example.org"]}`, 400)
	must("PUT", "/api/aliases/none@example.org", `{"targets":[]}`, 400)
	var as []domain.Alias
	if err := json.Unmarshal([]byte(must("GET", "/api/aliases?domain=example.org", "", 200)), &as); err != nil || len(as) != 3 ||
		as[1].Address != "sales@example.org" || !slices.Equal(as[1].Targets, []string{"alice@example.org", "bob@example.org"}) {
		t.Errorf("aliases: %+v %v", as, err)
	}
	must("DELETE", "/api/domains/example.org", "", 409) // users and aliases left

	ctx := context.Background()
	reach := func(addr string, want ...string) {
		t.Helper()
		users, _, err := c.Proxy.Recipients(ctx, addr, 0)
		if len(want) == 0 {
			if err == nil {
				t.Errorf("%s reaches %v, want nobody", addr, users)
			}
			return
		}
		if err != nil || !slices.Equal(users, want) {
			t.Errorf("%s reaches %v (%v), want %v", addr, users, err, want)
		}
	}
	reach("alice@example.org", "alice@example.org")
	reach("sales@example.org", "alice@example.org") // bob@ is an alias of alice@
	reach("team@example.org", "alice@example.org")  // dave@ is no user: left out
	reach("alice+news@example.org", "alice@example.org")
	reach("Postmaster@example.org", "alice@example.org")
	reach("abuse+x@example.org", "alice@example.org")
	reach("nobody@example.org")
	must("PUT", "/api/domains/example.org", `{"catch_all":"carol@elsewhere.net"}`, 400)
	must("PUT", "/api/domains/example.org", `{"catch_all":"Carol@Example.org"}`, 200)
	reach("nobody@example.org") // the catch-all is no user
	must("POST", "/api/users", `{"address":"carol@example.org","password":"pw"}`, 201)
	reach("nobody@example.org", "carol@example.org")
	reach("postmaster@example.org", "carol@example.org") // set's postmaster was left empty
	must("PUT", "/api/domains/example.org", `{"postmaster":"bob@example.org","catch_all":"carol@example.org"}`, 200)
	reach("postmaster@example.org", "alice@example.org") // bob@ is an alias of alice@

	must("DELETE", "/api/aliases/bob@example.org", "", 204)
	must("DELETE", "/api/aliases/bob@example.org", "", 404)
	reach("sales@example.org", "alice@example.org", "bob@example.org")
	for _, a := range []string{"sales", "team"} {
		must("DELETE", "/api/aliases/"+a+"@example.org", "", 204)
	}
	for _, u := range []string{"alice", "bob", "carol"} {
		must("DELETE", "/api/users/"+u+"@example.org", "", 204)
	}
	must("DELETE", "/api/domains/example.org", "", 204)
	must("DELETE", "/api/domains/example.org", "", 404)
	if b := must("GET", "/api/domains", "", 200); strings.TrimSpace(b) != "[]" {
		t.Errorf("domains after the delete: %s", b)
	}
}

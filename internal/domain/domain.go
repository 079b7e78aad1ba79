// Package domain holds what a cluster knows of the mail domains it serves:
// the domains themselves, with their settings, and the aliases within them,
// and it decides which users an address stands for.
//
// Porcupine keeps users' profiles as hard state in its user profile database
// (§2.2, §3.1); a domain and an alias are the same kind of state one level
// up, but every node needs them to answer any RCPT, so they are clusterwide
// objects (package clusterwide: replicated to every node, newest stamp
// wins). This package is the decisions alone, pure functions over a Tables
// view of those objects; the node stores and reads them.
//
// Resolution follows what Postfix's virtual alias maps do, as operators
// expect of any mail server: an alias is looked at before a mailbox of the
// same name; an address that is neither stands, in turn, for its address
// without a sub-address tag (RFC 5233: user+tag@), for the domain's
// postmaster when it is one of RFC 2142's role addresses, and for the
// domain's catch-all.
package domain

import (
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"
)

// Domain is one served domain and its settings.
type Domain struct {
	Name    string    `json:"name"`
	Created time.Time `json:"created"`
	// Postmaster receives the mail of the domain's RFC 2142 role addresses
	// (RoleLocals) that are neither users nor aliases.
	Postmaster string `json:"postmaster,omitempty"`
	// CatchAll, if set, receives the mail of any address of the domain that
	// nothing else takes.
	CatchAll string `json:"catch_all,omitempty"`
	// QuotaStorage and QuotaMessages limit the mail of all the domain's
	// users together: bytes and messages, 0 for no limit (beside each
	// user's own quota).
	QuotaStorage  int64 `json:"quota_storage,omitempty"`
	QuotaMessages int64 `json:"quota_messages,omitempty"`
	// QuotaPermanent makes a delivery refused for a quota (the user's or
	// the domain's) a permanent failure, 552 5.2.2, that the sender's
	// server bounces at once, instead of 452 4.2.2, which it retries
	// until the mailbox has room or the message expires.
	QuotaPermanent bool `json:"quota_permanent,omitempty"`
}

// Limited says the domain has a quota of its own.
func (d Domain) Limited() bool { return d.QuotaStorage > 0 || d.QuotaMessages > 0 }

// Alias is an address that delivers to others.
type Alias struct {
	Address string   `json:"address"`
	Targets []string `json:"targets"`
}

// RoleLocals are the local parts every served domain must take mail for:
// postmaster (RFC 5321 §4.5.1) and abuse (RFC 2142 §2).
var RoleLocals = []string{"postmaster", "abuse"}

// DefaultSeparator is the sub-address separator (RFC 5233) unless the node
// is told another.
const DefaultSeparator = "+"

// maxTargets bounds an alias's targets, and maxDepth the aliases followed
// from one address: an alias is a list, not a mailing-list manager, and a
// loop of aliases must end.
const (
	maxTargets = 100
	maxDepth   = 8
)

// Errors of the domain and alias operations.
var (
	// ErrNotFound says no domain or alias has that name.
	ErrNotFound = errors.New("not found")
	// ErrExists says a domain is served already.
	ErrExists = errors.New("already exists")
	// ErrInUse says a domain still has users or aliases.
	ErrInUse = errors.New("in use")
)

// Tables is the view of the cluster's domains and aliases a decision reads.
type Tables interface {
	Domain(name string) (Domain, bool)
	Alias(addr string) (Alias, bool)
}

// ValidName checks a domain name as mail can use it: letters, digits and
// hyphens in dot-separated labels of 1 to 63 octets, 253 in all, no label
// starting or ending with a hyphen (RFC 1035 §2.3.1, RFC 5321 §4.1.2;
// internationalized names in their xn-- form).
func ValidName(name string) error {
	if name == "" || len(name) > 253 {
		return fmt.Errorf("domain %q: length must be 1 to 253", name)
	}
	for _, label := range strings.Split(name, ".") {
		if label == "" || len(label) > 63 {
			return fmt.Errorf("domain %q: labels must be 1 to 63 octets", name)
		}
		if label[0] == '-' || label[len(label)-1] == '-' {
			return fmt.Errorf("domain %q: a label may not start or end with a hyphen", name)
		}
		for _, c := range []byte(label) {
			if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '-') {
				return fmt.Errorf("domain %q: character %q not allowed (letters, digits, hyphens; lower case)", name, c)
			}
		}
	}
	return nil
}

// Normalize lower-cases and trims a domain name.
func Normalize(name string) string { return strings.ToLower(strings.TrimSpace(name)) }

// split returns an address's local part and domain ("" and addr when it
// has no @).
func split(addr string) (local, dom string) {
	i := strings.LastIndexByte(addr, '@')
	if i < 0 {
		return "", addr
	}
	return addr[:i], addr[i+1:]
}

// Expand returns what an alias delivers to, following aliases among its
// targets (depth-first, each address once, at most maxDepth deep): the
// addresses that are not aliases, in order. ok is false when addr is not
// an alias.
func Expand(addr string, t Tables) (out []string, ok bool) {
	if _, ok := t.Alias(addr); !ok {
		return nil, false
	}
	seen := map[string]bool{}
	var walk func(a string, depth int)
	walk = func(a string, depth int) {
		if seen[a] {
			return
		}
		seen[a] = true
		al, isAlias := t.Alias(a)
		if !isAlias || depth >= maxDepth {
			if !isAlias {
				out = append(out, a)
			}
			return
		}
		for _, tg := range al.Targets {
			walk(tg, depth+1)
		}
	}
	walk(addr, 0)
	return out, true
}

// Fallbacks returns, in the order they are tried, the addresses that stand
// for addr when it is neither a user nor an alias: addr without its
// sub-address tag (sep empty: none), the domain's postmaster for a role
// address, the domain's catch-all. A domain the tables do not have has
// no postmaster and no catch-all.
func Fallbacks(addr, sep string, t Tables) []string {
	local, dom := split(addr)
	var out []string
	if sep != "" {
		if i := strings.Index(local, sep); i > 0 {
			out = append(out, local[:i]+"@"+dom)
			local = local[:i] // postmaster+x@ is postmaster@ too
		}
	}
	d, ok := t.Domain(dom)
	if !ok {
		return out
	}
	if d.Postmaster != "" && slices.Contains(RoleLocals, local) {
		out = append(out, d.Postmaster)
	}
	if d.CatchAll != "" {
		out = append(out, d.CatchAll)
	}
	return out
}

// CheckAlias checks an alias before it is stored: an address valid for a
// new one (validNew) in a served domain (served reports which are), one to
// maxTargets targets, each an address (validAddress: an existing user's
// may be older than today's rules) in a served domain, since mail is not
// forwarded elsewhere (that needs SRS), and none the alias itself.
func CheckAlias(a Alias, validNew, validAddress func(string) error, served func(string) bool) error {
	if err := validNew(a.Address); err != nil {
		return fmt.Errorf("alias: %w", err)
	}
	if _, dom := split(a.Address); !served(dom) {
		return fmt.Errorf("alias %s: domain %s is not served here (add it first)", a.Address, dom)
	}
	if len(a.Targets) == 0 || len(a.Targets) > maxTargets {
		return fmt.Errorf("alias %s: want 1 to %d targets, have %d", a.Address, maxTargets, len(a.Targets))
	}
	for _, tg := range a.Targets {
		if tg == a.Address {
			return fmt.Errorf("alias %s: delivers to itself", a.Address)
		}
		if err := validAddress(tg); err != nil {
			return fmt.Errorf("alias %s: target: %w", a.Address, err)
		}
		if _, dom := split(tg); !served(dom) {
			return fmt.Errorf("alias %s: target %s: domain %s is not served here (mail is not forwarded to other domains)", a.Address, tg, dom)
		}
	}
	return nil
}

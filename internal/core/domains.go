package core

import (
	"context"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/domain"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/userdb"
)

// The served domains and their aliases are clusterwide objects (every node
// answers RCPT for any of them): domainPrefix + name holds a domain.Domain,
// aliasPrefix + address a domain.Alias, both JSON.
const (
	domainPrefix = "domain/"
	aliasPrefix  = "alias/"
)

// wideTables is domain.Tables over this node's replica of the clusterwide
// objects (in memory: a RCPT reads it without I/O).
type wideTables struct{ c *Core }

func (t wideTables) Domain(name string) (domain.Domain, bool) {
	var d domain.Domain
	return d, t.c.wideJSON(domainPrefix+name, &d)
}

func (t wideTables) Alias(addr string) (domain.Alias, bool) {
	var a domain.Alias
	return a, t.c.wideJSON(aliasPrefix+addr, &a)
}

// wideJSON decodes the clusterwide object name into v; false when there is
// none (or it does not read, which is logged: a bad object is as good as
// none for a decision).
func (c *Core) wideJSON(name string, v any) bool {
	o, ok := c.Wide.Get(name)
	if !ok {
		return false
	}
	if err := json.Unmarshal(o.Data, v); err != nil {
		c.log.Warn("clusterwide object does not read", "object", name, "err", err)
		return false
	}
	return true
}

// HasDomain reports whether a domain was added (quill domain add).
func (c *Core) HasDomain(name string) bool {
	_, ok := wideTables{c}.Domain(domain.Normalize(name))
	return ok
}

// ServesDomain reports whether the cluster takes mail for a domain: it was
// added, or (a cluster from before domains were objects) a user lives
// there.
func (c *Core) ServesDomain(name string) bool { return c.Proxy.ServesDomain(name) }

// putWide stores a clusterwide object (deleted: its tombstone) on every
// live node, durable here at least.
func (c *Core) putWide(ctx context.Context, name string, v any, deleted bool) error {
	var data []byte
	if !deleted {
		var err error
		if data, err = json.Marshal(v); err != nil {
			return err
		}
	}
	_, err := c.Wide.Put(ctx, c.Repl, c.AliveIDs(), name, data, deleted, replica.One)
	return err
}

// AddDomain adds a domain to those the cluster serves; a domain already
// served is an error.
func (c *Core) AddDomain(ctx context.Context, d domain.Domain) (domain.Domain, error) {
	d.Name = domain.Normalize(d.Name)
	if err := domain.ValidName(d.Name); err != nil {
		return d, err
	}
	if c.HasDomain(d.Name) {
		return d, fmt.Errorf("domain %s: %w", d.Name, domain.ErrExists)
	}
	d.Created = time.Now().UTC().Truncate(time.Second)
	if err := c.checkDomainTargets(&d); err != nil {
		return d, err
	}
	if err := c.putWide(ctx, domainPrefix+d.Name, d, false); err != nil {
		return d, fmt.Errorf("domain %s: %w", d.Name, err)
	}
	c.log.Info("domain added", "domain", d.Name, "postmaster", d.Postmaster, "catch_all", d.CatchAll)
	return d, nil
}

// SetDomain changes a domain's postmaster and catch-all.
func (c *Core) SetDomain(ctx context.Context, d domain.Domain) (domain.Domain, error) {
	d.Name = domain.Normalize(d.Name)
	old, ok := wideTables{c}.Domain(d.Name)
	if !ok {
		return d, fmt.Errorf("domain %s: %w", d.Name, domain.ErrNotFound)
	}
	d.Created = old.Created
	if err := c.checkDomainTargets(&d); err != nil {
		return d, err
	}
	if err := c.putWide(ctx, domainPrefix+d.Name, d, false); err != nil {
		return d, fmt.Errorf("domain %s: %w", d.Name, err)
	}
	c.log.Info("domain changed", "domain", d.Name, "postmaster", d.Postmaster, "catch_all", d.CatchAll,
		"quota_storage", d.QuotaStorage, "quota_messages", d.QuotaMessages, "quota_permanent", d.QuotaPermanent)
	return d, nil
}

// checkDomainTargets normalizes and checks a domain's postmaster and
// catch-all: addresses, if set, in a served domain (or the domain itself).
func (c *Core) checkDomainTargets(d *domain.Domain) error {
	if d.QuotaStorage < 0 || d.QuotaMessages < 0 {
		return fmt.Errorf("domain %s: quota of %d bytes and %d messages: limits cannot be negative", d.Name, d.QuotaStorage, d.QuotaMessages)
	}
	d.Postmaster, d.CatchAll = userdb.Normalize(d.Postmaster), userdb.Normalize(d.CatchAll)
	for _, a := range []struct{ what, addr string }{{"postmaster", d.Postmaster}, {"catch-all", d.CatchAll}} {
		if a.addr == "" {
			continue
		}
		if err := userdb.ValidateAddress(a.addr); err != nil {
			return fmt.Errorf("domain %s: %s: %w", d.Name, a.what, err)
		}
		if dom := userdb.Domain(a.addr); dom != d.Name && !c.ServesDomain(dom) {
			return fmt.Errorf("domain %s: %s %s: domain %s is not served here (mail is not forwarded to other domains)", d.Name, a.what, a.addr, dom)
		}
	}
	return nil
}

// DeleteDomain stops serving a domain. A domain that still has users or
// aliases is kept: deleting it would bounce their mail while they exist.
func (c *Core) DeleteDomain(ctx context.Context, name string) error {
	name = domain.Normalize(name)
	if !c.HasDomain(name) {
		return fmt.Errorf("domain %s: %w", name, domain.ErrNotFound)
	}
	if c.Users.ServesDomain(name) {
		return fmt.Errorf("domain %s: %w: it has users (delete them first)", name, domain.ErrInUse)
	}
	if as := c.Aliases(name); len(as) > 0 {
		return fmt.Errorf("domain %s: %w: it has %d aliases (delete them first)", name, domain.ErrInUse, len(as))
	}
	if err := c.putWide(ctx, domainPrefix+name, nil, true); err != nil {
		return fmt.Errorf("domain %s: %w", name, err)
	}
	c.log.Info("domain deleted", "domain", name)
	return nil
}

// Domains lists the served domains by name.
func (c *Core) Domains() []domain.Domain {
	var out []domain.Domain
	for _, o := range c.Wide.List(domainPrefix) {
		var d domain.Domain
		if err := json.Unmarshal(o.Data, &d); err == nil {
			out = append(out, d)
		}
	}
	slices.SortFunc(out, func(a, b domain.Domain) int { return strings.Compare(a.Name, b.Name) })
	return out
}

// SetAlias makes (or replaces) an alias of a served domain.
func (c *Core) SetAlias(ctx context.Context, a domain.Alias) (domain.Alias, error) {
	a.Address = userdb.Normalize(a.Address)
	for i := range a.Targets {
		a.Targets[i] = userdb.Normalize(a.Targets[i])
	}
	a.Targets = slices.Compact(slices.Sorted(slices.Values(a.Targets)))
	if err := domain.CheckAlias(a, userdb.ValidateNewAddress, userdb.ValidateAddress, c.ServesDomain); err != nil {
		return a, err
	}
	if err := c.putWide(ctx, aliasPrefix+a.Address, a, false); err != nil {
		return a, fmt.Errorf("alias %s: %w", a.Address, err)
	}
	c.log.Info("alias set", "alias", a.Address, "targets", strings.Join(a.Targets, ","))
	return a, nil
}

// DeleteAlias removes an alias.
func (c *Core) DeleteAlias(ctx context.Context, addr string) error {
	addr = userdb.Normalize(addr)
	if _, ok := (wideTables{c}).Alias(addr); !ok {
		return fmt.Errorf("alias %s: %w", addr, domain.ErrNotFound)
	}
	if err := c.putWide(ctx, aliasPrefix+addr, nil, true); err != nil {
		return fmt.Errorf("alias %s: %w", addr, err)
	}
	c.log.Info("alias deleted", "alias", addr)
	return nil
}

// Aliases lists the aliases of a domain (all domains: ""), by address.
func (c *Core) Aliases(dom string) []domain.Alias {
	dom = domain.Normalize(dom)
	var out []domain.Alias
	for _, o := range c.Wide.List(aliasPrefix) {
		var a domain.Alias
		if err := json.Unmarshal(o.Data, &a); err != nil {
			continue
		}
		if dom == "" || userdb.Domain(a.Address) == dom {
			out = append(out, a)
		}
	}
	slices.SortFunc(out, func(a, b domain.Alias) int { return strings.Compare(a.Address, b.Address) })
	return out
}

package admin

import (
	"context"
	"errors"
	"fmt"
	"net/http"

	"github.com/quillmail/quill/internal/domain"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/usermgr"
)

// Domains manages the served domains and their aliases (/api/domains,
// /api/aliases): core.Core.
type Domains interface {
	AddDomain(ctx context.Context, d domain.Domain) (domain.Domain, error)
	SetDomain(ctx context.Context, d domain.Domain) (domain.Domain, error)
	DeleteDomain(ctx context.Context, name string) error
	Domains() []domain.Domain
	HasDomain(name string) bool
	SetAlias(ctx context.Context, a domain.Alias) (domain.Alias, error)
	DeleteAlias(ctx context.Context, addr string) error
	Aliases(dom string) []domain.Alias
}

// domainStatus maps a domain or alias operation's error to its HTTP status.
func domainStatus(err error) int {
	switch {
	case errors.Is(err, domain.ErrNotFound):
		return http.StatusNotFound
	case errors.Is(err, domain.ErrExists), errors.Is(err, domain.ErrInUse):
		return http.StatusConflict
	default:
		return http.StatusBadRequest
	}
}

func (s *Server) listDomains(w http.ResponseWriter, r *http.Request) {
	ds := s.Domains.Domains()
	if ds == nil {
		ds = []domain.Domain{}
	}
	writeJSON(w, http.StatusOK, ds)
}

// writeDone reads a T from the request body, lets fill set what the path
// says, runs do and answers with its result (code) or its error.
func writeDone[T any](w http.ResponseWriter, r *http.Request, code int, fill func(*T), do func(context.Context, T) (T, error)) {
	var v T
	if err := readJSON(r, &v); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	fill(&v)
	v, err := do(r.Context(), v)
	if err != nil {
		writeError(w, domainStatus(err), err)
		return
	}
	writeJSON(w, code, v)
}

// addDomain answers POST /api/domains with a domain.Domain (name,
// postmaster, catch_all).
func (s *Server) addDomain(w http.ResponseWriter, r *http.Request) {
	writeDone(w, r, http.StatusCreated, func(*domain.Domain) {}, s.Domains.AddDomain)
}

// setDomain answers PUT /api/domains/{name}: its postmaster and catch-all.
func (s *Server) setDomain(w http.ResponseWriter, r *http.Request) {
	writeDone(w, r, http.StatusOK, func(d *domain.Domain) { d.Name = r.PathValue("name") }, s.Domains.SetDomain)
}

func (s *Server) deleteDomain(w http.ResponseWriter, r *http.Request) {
	if err := s.Domains.DeleteDomain(r.Context(), r.PathValue("name")); err != nil {
		writeError(w, domainStatus(err), err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// domainUsage answers GET /api/domains/{name}/usage: what the domain's
// users take together (at most 30 s old) and its quota.
func (s *Server) domainUsage(w http.ResponseWriter, r *http.Request) {
	name := domain.Normalize(r.PathValue("name"))
	d, ok := s.domainOf(name)
	if !ok {
		writeError(w, http.StatusNotFound, fmt.Errorf("domain %s: %w", name, domain.ErrNotFound))
		return
	}
	u, err := s.Users.DomainUsage(r.Context(), name)
	if err != nil {
		writeError(w, http.StatusServiceUnavailable, err)
		return
	}
	writeJSON(w, http.StatusOK, struct {
		usermgr.DomainUsage
		QuotaStorage  int64 `json:"quota_storage"`
		QuotaMessages int64 `json:"quota_messages"`
	}{u, d.QuotaStorage, d.QuotaMessages})
}

// listAliases answers GET /api/aliases[?domain=D].
func (s *Server) listAliases(w http.ResponseWriter, r *http.Request) {
	as := s.Domains.Aliases(r.URL.Query().Get("domain"))
	if as == nil {
		as = []domain.Alias{}
	}
	writeJSON(w, http.StatusOK, as)
}

// setAlias answers PUT /api/aliases/{address} with {"targets": [...]}.
func (s *Server) setAlias(w http.ResponseWriter, r *http.Request) {
	writeDone(w, r, http.StatusOK, func(a *domain.Alias) { a.Address = r.PathValue("address") }, s.Domains.SetAlias)
}

func (s *Server) deleteAlias(w http.ResponseWriter, r *http.Request) {
	if err := s.Domains.DeleteAlias(r.Context(), r.PathValue("address")); err != nil {
		writeError(w, domainStatus(err), err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}

// checkUserDomain refuses a user outside the served domains: adding one
// would make the cluster take mail for a domain nobody added.
func (s *Server) checkUserDomain(addr string) error {
	if s.Domains == nil {
		return nil
	}
	dom := userdb.Domain(userdb.Normalize(addr))
	if !s.Domains.HasDomain(dom) {
		return fmt.Errorf("user %s: domain %q is not served here (add it first: quill domain add %s)", addr, dom, dom)
	}
	return nil
}

// claimPostmaster makes a domain's first user its postmaster (RFC 2142:
// postmaster@ and abuse@ must reach someone) when none was named.
func (s *Server) claimPostmaster(ctx context.Context, user string) {
	dom := userdb.Domain(user)
	for _, d := range s.Domains.Domains() {
		if d.Name != dom || d.Postmaster != "" {
			continue
		}
		d.Postmaster = user
		if _, err := s.Domains.SetDomain(ctx, d); err != nil {
			s.Logger.Warn("domain: first user not made postmaster", "domain", dom, "user", user, "err", err)
		}
	}
}

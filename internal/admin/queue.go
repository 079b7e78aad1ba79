package admin

import (
	"context"
	"errors"
	"net/http"

	"github.com/quillmail/quill/internal/mailauth"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/sns"
)

// Queue is what the admin API needs of the outbound queue (queue.Queue
// is the one in use): the cluster-wide listing and the operator's
// actions, carried out on a node that holds the entry.
type Queue interface {
	ListAll(ctx context.Context, id string) queue.Listing
	Act(ctx context.Context, id, action string) (*queue.Entry, error)
}

func (s *Server) listQueue(w http.ResponseWriter, r *http.Request) {
	l := s.Queue.ListAll(r.Context(), "")
	if l.Unavailable != "" {
		writeError(w, http.StatusServiceUnavailable, errors.New("outbound queue: "+l.Unavailable))
		return
	}
	writeJSON(w, http.StatusOK, l)
}

func (s *Server) showQueued(w http.ResponseWriter, r *http.Request) {
	id := r.PathValue("id")
	if err := queue.ValidID(id); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	l := s.Queue.ListAll(r.Context(), id)
	if l.Unavailable != "" {
		writeError(w, http.StatusServiceUnavailable, errors.New("queue entry "+id+": "+l.Unavailable))
		return
	}
	if len(l.Entries) == 0 {
		writeError(w, http.StatusNotFound, errors.New("queue entry "+id+": "+queue.ErrNotFound.Error()))
		return
	}
	writeJSON(w, http.StatusOK, l.Entries[0])
}

func (s *Server) actQueued(action string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		id := r.PathValue("id")
		if err := queue.ValidID(id); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
		e, err := s.Queue.Act(r.Context(), id, action)
		switch {
		case errors.Is(err, queue.ErrNotFound):
			writeError(w, http.StatusNotFound, err)
		case err != nil:
			writeError(w, http.StatusServiceUnavailable, err)
		default:
			s.Logger.Info("queue entry "+action, "id", id)
			writeJSON(w, http.StatusOK, e)
		}
	}
}

// DKIM is what the admin API needs to manage the domains' DKIM signing
// keys (node.Node is the one in use).
type DKIM interface {
	SetDKIMKey(ctx context.Context, domain, selector string) ([]mailauth.KeyInfo, error)
	DeleteDKIMKey(ctx context.Context, domain string) error
	DKIMKeys() ([]mailauth.KeyInfo, error)
}

func (s *Server) listDKIM(w http.ResponseWriter, r *http.Request) {
	keys, err := s.DKIM.DKIMKeys()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, keys)
}

func (s *Server) setDKIM(w http.ResponseWriter, r *http.Request) {
	var req struct {
		Selector string `json:"selector"`
	}
	if r.ContentLength != 0 {
		if err := readJSON(r, &req); err != nil {
			writeError(w, http.StatusBadRequest, err)
			return
		}
	}
	k, err := s.DKIM.SetDKIMKey(r.Context(), r.PathValue("domain"), req.Selector)
	if err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	writeJSON(w, http.StatusOK, k)
}

func (s *Server) deleteDKIM(w http.ResponseWriter, r *http.Request) {
	writeDeleted(w, s.DKIM.DeleteDKIMKey(r.Context(), r.PathValue("domain")))
}

// Policies is what the admin API needs to manage the local domains'
// inbound policies (node.Node).
type Policies interface {
	SetDomainPolicy(ctx context.Context, p mailauth.Policy) error
	DeleteDomainPolicy(ctx context.Context, domain string) error
	DomainPolicies() ([]mailauth.Policy, error)
}

func (s *Server) listPolicies(w http.ResponseWriter, r *http.Request) {
	ps, err := s.Policies.DomainPolicies()
	if err != nil {
		writeError(w, http.StatusInternalServerError, err)
		return
	}
	writeJSON(w, http.StatusOK, ps)
}

// setPolicy answers PUT /api/policies/{domain} with a mailauth.Policy
// (its domain is the path's).
func (s *Server) setPolicy(w http.ResponseWriter, r *http.Request) {
	var p mailauth.Policy
	if err := readJSON(r, &p); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	p.Domain = r.PathValue("domain")
	if err := s.Policies.SetDomainPolicy(r.Context(), p); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	writeJSON(w, http.StatusOK, p)
}

func (s *Server) deletePolicy(w http.ResponseWriter, r *http.Request) {
	writeDeleted(w, s.Policies.DeleteDomainPolicy(r.Context(), r.PathValue("domain")))
}

// workers answers GET /api/sns: this node's worker pools.
func (s *Server) workers(w http.ResponseWriter, r *http.Request) {
	var out []sns.Status
	if s.Node.Workers != nil {
		out = s.Node.Workers()
	}
	writeJSON(w, http.StatusOK, out)
}

// snsManager answers GET /api/sns/manager: the SNS manager as this node
// sees it (who, its term, the launch table of load reports).
func (s *Server) snsManager(w http.ResponseWriter, r *http.Request) {
	if s.Node.SNSManager == nil {
		writeJSON(w, http.StatusOK, nil)
		return
	}
	writeJSON(w, http.StatusOK, s.Node.SNSManager())
}

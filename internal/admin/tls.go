package admin

import (
	"context"
	"errors"
	"net/http"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/clusterwide"
	"github.com/quillmail/quill/internal/tlscert"
)

// TLS is what the admin API needs to manage the cluster's certificates
// (node.Node is the one in use).
type TLS interface {
	SetCertificate(ctx context.Context, chain, key []byte, source string) (tlscert.Info, []cluster.NodeID, error)
	DeleteCertificate(ctx context.Context, name string) error
}

// certJSON is a certificate as PUT /api/tls takes it: PEM text, the chain
// (leaf first) and its key.
type certJSON struct {
	Cert string `json:"cert"`
	Key  string `json:"key"`
}

// setCertJSON is the answer to PUT /api/tls.
type setCertJSON struct {
	tlscert.Info
	AckedBy []cluster.NodeID `json:"acked_by"`
}

func (s *Server) listCerts(w http.ResponseWriter, r *http.Request) {
	writeJSON(w, http.StatusOK, s.Node.TLS())
}

func (s *Server) setCert(w http.ResponseWriter, r *http.Request) {
	var c certJSON
	if err := readJSON(r, &c); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	info, acked, err := s.TLS.SetCertificate(r.Context(), []byte(c.Cert), []byte(c.Key), "operator")
	if err != nil {
		status := http.StatusServiceUnavailable
		if errors.Is(err, tlscert.ErrBadCertificate) {
			status = http.StatusBadRequest
		}
		writeError(w, status, err)
		return
	}
	s.Logger.Info("tls certificate set", "names", info.Names, "object", info.Cluster)
	writeJSON(w, http.StatusOK, setCertJSON{Info: info, AckedBy: acked})
}

func (s *Server) deleteCert(w http.ResponseWriter, r *http.Request) {
	writeDeleted(w, s.TLS.DeleteCertificate(r.Context(), r.PathValue("name")))
}

// writeDeleted answers the deletion of a clusterwide object: 204, 404 for
// one that is not there, 503 when the cluster could not take it.
func writeDeleted(w http.ResponseWriter, err error) {
	switch {
	case errors.Is(err, clusterwide.ErrNotFound):
		writeError(w, http.StatusNotFound, err)
	case err != nil:
		writeError(w, http.StatusServiceUnavailable, err)
	default:
		w.WriteHeader(http.StatusNoContent)
	}
}

package admin

import (
	"context"
	"errors"
	"io"
	"net/http"
)

// Backup streams the backup archive of a node of the cluster
// (backup.Nodes): node "" is this one.
type Backup interface {
	Backup(ctx context.Context, node string, w io.Writer) error
}

// backup is GET /api/backup[?node=ID]: the node's hard state as a tar
// archive (internal/backup), its manifest last; an archive cut short by
// a failure has none, which `quill backup` refuses.
func (s *Server) backup(w http.ResponseWriter, r *http.Request) {
	if s.Backup == nil {
		writeError(w, http.StatusNotFound, errors.New("no backups on this node"))
		return
	}
	node := r.URL.Query().Get("node")
	if node == "" {
		node = string(s.Node.ID)
	}
	w.Header().Set("Content-Type", "application/x-tar")
	w.Header().Set("X-Quill-Node", node)
	if err := s.Backup.Backup(r.Context(), node, w); err != nil {
		s.Logger.Error("backup failed", "node", node, "err", err)
		return
	}
	s.Logger.Info("backup streamed", "node", node)
}

package admin

import (
	"context"
	"errors"
	"net/http"

	"github.com/quillmail/quill/internal/islandmgr"
)

// Islands is the cluster's islands (Archipelago; internal/islandmgr) as the
// admin API sees them.
type Islands interface {
	// IslandStatus returns the installed table, summed up, and what this
	// node's island manager is doing.
	IslandStatus() IslandStatus
	// RemoveIsland asks that an island lose all its buckets.
	RemoveIsland(ctx context.Context, name string) error
}

// IslandStatus is the JSON of GET /api/islands.
type IslandStatus struct {
	// Table is false while the cluster has one island (no --island
	// anywhere): every node may hold any user's state.
	Table   bool            `json:"table"`
	Epoch   uint64          `json:"epoch,omitempty"`
	Islands []IslandSummary `json:"islands,omitempty"`
	// Owners names each bucket's island (empty without a table).
	Owners  []string          `json:"owners,omitempty"`
	Manager *islandmgr.Status `json:"manager,omitempty"`
}

// IslandSummary is one island of the table, or one the members name that
// the table does not have yet.
type IslandSummary struct {
	Name    string   `json:"name"`
	Buckets int      `json:"buckets"`
	Nodes   []string `json:"nodes"` // live nodes
	InTable bool     `json:"in_table"`
}

func (s *Server) islandStatus(w http.ResponseWriter, r *http.Request) {
	if s.Islands == nil {
		writeError(w, http.StatusNotFound, errors.New("islands are not kept on this node (Cassandra store)"))
		return
	}
	writeJSON(w, http.StatusOK, s.Islands.IslandStatus())
}

func (s *Server) removeIsland(w http.ResponseWriter, r *http.Request) {
	if s.Islands == nil {
		writeError(w, http.StatusNotFound, errors.New("islands are not kept on this node (Cassandra store)"))
		return
	}
	name := r.PathValue("name")
	if err := s.Islands.RemoveIsland(r.Context(), name); err != nil {
		writeError(w, http.StatusBadRequest, err)
		return
	}
	writeJSON(w, http.StatusAccepted, map[string]string{"island": name, "state": "removing: its buckets move at the coordinator's next plan"})
}

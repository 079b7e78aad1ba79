package backup

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/nodepb"
	"google.golang.org/grpc"
)

// chunkSize is the size of one streamed piece of an archive: big enough
// that per-message costs vanish, well under the RPC message limit.
const chunkSize = 1 << 20

// stallTimeout ends a backup stream from another node that sends nothing
// for this long (the node hung or the network went away); a checkpoint
// itself takes well under a second, the stream then flows steadily.
const stallTimeout = 2 * time.Minute

// Server is a node's Backup service: the node's own archive (Write).
type Server struct {
	nodepb.UnimplementedBackupServer
	Dir  string
	DB   Checkpointer
	Node cluster.NodeID
	// Hold, if set, keeps files the checkpoint may name from being
	// removed until the archive is written (the sweep of body files):
	// it returns the release.
	Hold func() (release func())
}

// Register exposes the service to the other nodes.
func (s *Server) Register(r grpc.ServiceRegistrar) { nodepb.RegisterBackupServer(r, s) }

// WriteTo streams this node's archive to w.
func (s *Server) WriteTo(ctx context.Context, w io.Writer) (*Manifest, error) {
	if s.Hold != nil {
		defer s.Hold()()
	}
	return Write(ctxWriter{ctx: ctx, w: w}, s.Dir, s.DB, string(s.Node))
}

// Checkpoint implements nodepb.BackupServer.
func (s *Server) Checkpoint(_ *nodepb.BackupRequest, st grpc.ServerStreamingServer[nodepb.BackupChunk]) error {
	bw := bufio.NewWriterSize(sendWriter{st}, chunkSize)
	if _, err := s.WriteTo(st.Context(), bw); err != nil {
		return err
	}
	return bw.Flush()
}

// sendWriter sends each write as one chunk.
type sendWriter struct {
	st grpc.ServerStreamingServer[nodepb.BackupChunk]
}

func (s sendWriter) Write(b []byte) (int, error) {
	if err := s.st.Send(&nodepb.BackupChunk{Data: b}); err != nil {
		return 0, err
	}
	return len(b), nil
}

// Nodes streams the archive of any node of the cluster: this node's
// directly, another's over its Backup service.
type Nodes struct {
	Local *Server
	Conns cluster.Conns
}

// Backup writes node's archive ("" or this node: the local one) to w.
func (n *Nodes) Backup(ctx context.Context, node string, w io.Writer) error {
	if node == "" || cluster.NodeID(node) == n.Local.Node {
		_, err := n.Local.WriteTo(ctx, w)
		return err
	}
	cc, err := n.Conns.Conn(cluster.NodeID(node))
	if err != nil {
		return fmt.Errorf("backup of node %s: %w", node, err)
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	watch := time.AfterFunc(stallTimeout, cancel)
	defer watch.Stop()
	stream, err := nodepb.NewBackupClient(cc).Checkpoint(ctx, &nodepb.BackupRequest{})
	if err != nil {
		return fmt.Errorf("backup of node %s: %w", node, err)
	}
	for {
		c, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			return nil
		}
		if err != nil {
			if ctx.Err() != nil && !watch.Stop() {
				return fmt.Errorf("backup of node %s: nothing for %v", node, stallTimeout)
			}
			return fmt.Errorf("backup of node %s: %w", node, err)
		}
		watch.Reset(stallTimeout)
		if _, err := w.Write(c.Data); err != nil {
			return err
		}
	}
}

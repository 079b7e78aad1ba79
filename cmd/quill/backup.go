package main

import (
	"context"
	"fmt"
	"io"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/backup"
	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

func init() {
	var c adminClient
	var to string
	var whole bool
	cmd := &cobra.Command{
		Use:   "backup --to DIR [--cluster]",
		Short: "Back up a running node's hard state (a consistent Pebble checkpoint and its data files), or every live node's",
		Long: `Backup asks a running node for a consistent copy of its hard state (a Pebble checkpoint of its
store and the files of its data directory) and writes it into DIR/<node id>, checked against the
digests the node sends. With --cluster every live member is backed up the same way, through the
node asked, each into its own directory. quill restore puts one back. See docs/migration.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runBackup(&c, to, whole)
		},
	}
	c.flags(cmd)
	cmd.Flags().StringVar(&to, "to", "", "directory to write the backup into (required); each node's goes into a subdirectory named by its id")
	cmd.Flags().BoolVar(&whole, "cluster", false, "back up every live member of the cluster, not only the node asked")
	cmd.MarkFlagRequired("to")
	rootCmd.AddCommand(cmd)

	var from, data string
	restore := &cobra.Command{
		Use:   "restore --from DIR/<node id> --data DATA",
		Short: "Restore a node's backup into a new or empty data directory (the node stopped), then start it with quill serve",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			if _, err := os.Stat(filepath.Join(from, backup.ManifestName)); err != nil {
				if nodes, _ := backup.NodeDirs(from); len(nodes) > 0 {
					return fmt.Errorf("%s holds the backups of %d nodes (%s): restore each into its node's data directory, --from %s",
						from, len(nodes), strings.Join(nodes, ", "), filepath.Join(from, nodes[0]))
				}
			}
			start := time.Now()
			m, err := backup.Restore(from, data)
			if err != nil {
				return err
			}
			fmt.Printf("restored node %s as of %s into %s: %d files, %s, %s; start it with: quill serve --data %s\n",
				m.Node, m.Taken.Local().Format(time.DateTime), data, len(m.Files), humanBytes(m.Bytes()),
				time.Since(start).Round(time.Millisecond), data)
			return nil
		},
	}
	restore.Flags().StringVar(&from, "from", "", "one node's backup: the directory quill backup wrote for it (required)")
	restore.Flags().StringVar(&data, "data", "", "the data directory to restore into: missing or empty (required)")
	restore.MarkFlagRequired("from")
	restore.MarkFlagRequired("data")
	rootCmd.AddCommand(restore)
}

// runBackup backs up the node asked, or every live member through it.
func runBackup(c *adminClient, to string, whole bool) error {
	start := time.Now()
	var st struct {
		Members []struct {
			ID    string `json:"id"`
			State string `json:"state"`
			Self  bool   `json:"self"`
		} `json:"members"`
	}
	if err := c.do("GET", "/api/cluster", nil, &st); err != nil {
		return err
	}
	var nodes, away []string
	for _, m := range st.Members {
		switch {
		case !whole && !m.Self:
		case m.State == "alive":
			nodes = append(nodes, m.ID)
		default:
			away = append(away, m.ID+" ("+m.State+")")
		}
	}
	if len(nodes) == 0 {
		return fmt.Errorf("no live node to back up")
	}
	for _, n := range nodes {
		// Never into an earlier backup: a failure would remove it.
		if _, err := os.Stat(filepath.Join(to, n)); err == nil {
			return fmt.Errorf("backup: %s exists already: back up into a new directory", filepath.Join(to, n))
		}
	}
	if err := os.MkdirAll(to, 0o700); err != nil {
		return fmt.Errorf("backup: %w", err)
	}
	var total int64
	for _, n := range nodes {
		m, err := backupNode(c, n, filepath.Join(to, n))
		if err != nil {
			return fmt.Errorf("backup of node %s: %w", n, err)
		}
		total += m.Bytes()
		fmt.Fprintf(os.Stderr, "backup: node %s: %d files, %s\n", n, len(m.Files), humanBytes(m.Bytes()))
	}
	fmt.Printf("backup: %d nodes, %s into %s, %s\n", len(nodes), humanBytes(total), to, time.Since(start).Round(time.Millisecond))
	if len(away) > 0 {
		fmt.Fprintf(os.Stderr, "backup: not backed up, not alive: %s (their messages have replicas on the others)\n", strings.Join(away, ", "))
	}
	return nil
}

// backupNode streams one node's archive into dir (which must not exist),
// checked as it comes; what it wrote is removed if it fails.
func backupNode(c *adminClient, node, dir string) (*backup.Manifest, error) {
	if _, err := os.Stat(dir); err == nil {
		return nil, fmt.Errorf("%s exists already", dir)
	}
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	resp, err := c.send(ctx, "GET", "/api/backup?node="+url.QueryEscape(node), "application/json", nil)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	// The node sends steadily once its checkpoint is taken; a stream that
	// stops for stallTimeout is given up.
	watch := time.AfterFunc(backupStall, cancel)
	defer watch.Stop()
	var r io.Reader = &resetReader{r: resp.Body, reset: func() { watch.Reset(backupStall) }}
	if term.IsTerminal(int(os.Stderr.Fd())) {
		bar := progressbar.NewOptions64(-1, progressbar.OptionSetWriter(os.Stderr), progressbar.OptionShowBytes(true),
			progressbar.OptionSetDescription("backup "+node), progressbar.OptionThrottle(100*time.Millisecond),
			progressbar.OptionClearOnFinish())
		defer bar.Finish()
		r = io.TeeReader(r, bar)
	}
	m, err := backup.Extract(r, dir)
	if err != nil {
		os.RemoveAll(dir)
		return nil, err
	}
	return m, nil
}

// backupStall bounds the wait for the next bytes of a backup stream.
const backupStall = 2 * time.Minute

// resetReader calls reset after every read that got something.
type resetReader struct {
	r     io.Reader
	reset func()
}

func (r *resetReader) Read(b []byte) (int, error) {
	n, err := r.r.Read(b)
	if n > 0 {
		r.reset()
	}
	return n, err
}

package main

import (
	"context"
	"os"
	"os/signal"
	"syscall"

	"github.com/quillmail/quill/internal/storemigrate"
	"github.com/spf13/cobra"
)

func init() {
	var from, to string
	var verifyOnly bool
	cmd := &cobra.Command{
		Use:   "migrate --from DATA_DIR[,DATA_DIR...] --to cassandra://HOST[:PORT][,HOST...]/KEYSPACE[?rf=3&write=QUORUM&read=QUORUM]",
		Short: "Copy the hard state of stopped native nodes into Apache Cassandra, or back into a new data directory, then verify it",
		Long: `Migrate copies Quill's hard state between the native store and Apache Cassandra
(docs/cassandra.md, "quill migrate"): every user (deleted users' tombstones too), mailbox (name,
UIDVALIDITY, subscription, special use, UID/MODSEQ reservations), message (UID, flags, MODSEQ,
INTERNALDATE, bytes), outbound queue entry and clusterwide object.

  quill migrate --from /var/lib/quill --to cassandra://10.0.0.5,10.0.0.6/mail?rf=3
  quill migrate --from /srv/n1,/srv/n2,/srv/n3 --to cassandra://10.0.0.5:9042/mail
  quill migrate --from cassandra://10.0.0.5/mail --to /var/lib/quill-new

From data directories: the nodes must be stopped (a directory a running quill holds is refused).
Give every node of a cluster to copy the cluster: a message is on R nodes, and the replicas merge
as the nodes would merge them (the newest stamp wins; an expunged message or a deleted user stays
so). From Cassandra: --to is one new or empty data directory, which quill serve --data then serves
as a node of its own.

After the copy a verify pass reads both sides again and compares them user by user and mailbox
by mailbox: message counts, and each message's UID, flags, MODSEQ, INTERNALDATE, size and
SHA-256 of its bytes; any difference is listed and the command exits non-zero. --verify-only runs
just that pass. Copying again changes nothing (Cassandra's writes are stamped with Quill's own
HLC stamps, so last-write-wins keeps the newest).

The Cassandra URL: hosts with optional ports (9042 by default), the keyspace (mail by default,
made with its tables if missing), rf = the keyspace's replication when it is made (3, or
dc1:3,dc2:2), read and write = consistency levels (ONE, QUORUM, ALL, LOCAL_QUORUM; QUORUM).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
			defer stop()
			_, err := storemigrate.Run(ctx, from, to, storemigrate.Options{
				VerifyOnly: verifyOnly,
				Out:        os.Stdout,
				Progress: func(verb string, msgs int, bytes int64) storemigrate.Bar {
					return migrateBar{newProgress(verb, msgs, bytes)}
				},
			})
			return err
		},
	}
	cmd.Flags().StringVar(&from, "from", "", "stopped nodes' data directories (comma-separated), or a cassandra:// URL (required)")
	cmd.Flags().StringVar(&to, "to", "", "a cassandra:// URL, or one new or empty data directory (required)")
	cmd.Flags().BoolVar(&verifyOnly, "verify-only", false, "only compare the two sides, copying nothing")
	cmd.MarkFlagRequired("from")
	cmd.MarkFlagRequired("to")
	rootCmd.AddCommand(cmd)
}

// migrateBar shows a migration's progress as quill import shows its own.
type migrateBar struct{ p *progress }

func (b migrateBar) Folder(name string, msgs int) { b.p.startFolder(name, msgs) }
func (b migrateBar) Message(n int64)              { b.p.add(n) }
func (b migrateBar) Finish()                      { b.p.finish() }

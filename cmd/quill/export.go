package main

import (
	"fmt"
	"os"
	"time"

	"github.com/quillmail/quill/internal/migrate"
	"github.com/spf13/cobra"
)

func init() {
	var c adminClient
	var user, to string
	cmd := &cobra.Command{
		Use:   "export --user U --to DIR",
		Short: "Export a user's mailboxes to a Maildir (Maildir++ folders, flags, internal dates) that Dovecot can serve",
		Long: `Export writes every mailbox of a user into a Maildir tree: INBOX at its root, "Foo/Bar" in
.Foo.Bar, flags in each file's name (keywords through dovecot-keywords), the internal date as
the file's time, subscriptions and UIDs for Dovecot. Run it again into the same directory and
only what changed is written. See docs/migration.md.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return runExport(&mailAPI{c: &c, user: user}, to)
		},
	}
	c.flags(cmd)
	cmd.Flags().StringVar(&user, "user", "", "the Quill user whose mail is exported (required)")
	cmd.Flags().StringVar(&to, "to", "", "the Maildir to write (made if missing; required)")
	cmd.MarkFlagRequired("user")
	cmd.MarkFlagRequired("to")
	rootCmd.AddCommand(cmd)
}

// runExport lists every mailbox first (for the totals), then writes what
// the Maildir lacks and renames what has other flags there.
func runExport(api *mailAPI, root string) error {
	sum := summary{start: time.Now()}
	boxes, err := api.mailboxes()
	if err != nil {
		return err // the node names the user
	}
	if err := os.MkdirAll(root, 0o700); err != nil {
		return fmt.Errorf("export: %w", err)
	}
	type box struct {
		name       string
		subscribed bool
		validity   uint32
		uidNext    uint32
		msgs       []migrate.Item
	}
	var all []box
	var total int
	var totalBytes int64
	for _, b := range boxes.Mailboxes {
		msgs, validity, err := api.list(b.Name, false)
		if err != nil {
			return err
		}
		all = append(all, box{name: b.Name, subscribed: b.Subscribed, validity: validity, uidNext: b.UIDNext, msgs: msgs})
		total += len(msgs)
		for _, m := range msgs {
			totalBytes += m.Size
		}
	}
	sum.folders = len(all)
	w := &migrate.MaildirWriter{Root: root}
	prog := newProgress("export", total, totalBytes)
	dropped := 0
	for _, b := range all {
		f, err := w.Folder(b.name, b.validity, b.uidNext, b.subscribed)
		if err != nil {
			prog.finish()
			return err
		}
		prog.startFolder(b.name, len(b.msgs))
		for _, m := range b.msgs {
			var raw []byte
			flags, there := f.Has(m.Date, m.UID)
			switch {
			case there && migrate.SameFlags(flags, m.Flags):
				sum.same++
			case there:
				sum.flagged++
			default:
				if raw, err = api.body(m.ID); err != nil {
					sum.errors++
					fmt.Fprintf(os.Stderr, "\nexport: mailbox %q UID %d: %v\n", b.name, m.UID, err)
					prog.add(m.Size)
					continue
				}
				sum.copied++
				sum.bytes += int64(len(raw))
			}
			// Written again even when nothing changed, so the folder's
			// dovecot-uidlist lists it.
			if err := f.Write(m.UID, raw, m.Flags, m.Date); err != nil {
				prog.finish()
				return err
			}
			prog.add(m.Size)
		}
		if err := f.Close(); err != nil {
			prog.finish()
			return err
		}
		dropped += f.Dropped
	}
	prog.finish()
	if err := w.Close(); err != nil {
		return err
	}
	sum.print(os.Stdout, "export", false)
	if dropped > 0 {
		fmt.Fprintf(os.Stderr, "export: %d keywords left out: a Maildir folder names at most 26\n", dropped)
	}
	if sum.errors > 0 {
		return fmt.Errorf("%d messages could not be read (listed above); run the export again to retry them", sum.errors)
	}
	return nil
}

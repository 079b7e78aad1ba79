package main

import (
	"bufio"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/migrate"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// maxFailuresInARow ends an import whose messages keep failing one after
// the other: the node is down or refuses everything (quota), and going
// on would only repeat the error for every message left.
const maxFailuresInARow = 20

// importPasswordEnv holds the source's password when no file is given.
const importPasswordEnv = "QUILL_IMPORT_PASSWORD"

func init() {
	var c adminClient
	var user string
	var dryRun bool
	cmd := &cobra.Command{
		Use:   "import",
		Short: "Import mail into a user's mailboxes from a Maildir, mbox files or an IMAP server (rerun: only what is new)",
		Long: `Import copies every folder of a source into a user's mailboxes on a running node, with
flags and internal dates, through the same path IMAP APPEND takes (any node of a cluster).
It can be run again: messages already there are skipped and their flags brought up to date,
so a rerun after new mail at the source copies only the new mail. See docs/migration.md.`,
	}
	c.flags(cmd)
	cmd.PersistentFlags().StringVar(&user, "user", "", "the Quill user the mail goes to (required)")
	cmd.PersistentFlags().BoolVar(&dryRun, "dry-run", false, "read the source and say what would be copied, changing nothing")
	cmd.MarkPersistentFlagRequired("user")

	maildir := &cobra.Command{
		Use: "maildir DIR", Short: "Import a Maildir (Maildir++ folders, Dovecot's keywords and subscriptions)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runImport(&mailAPI{c: &c, user: user}, dryRun, func(int64) (migrate.Source, error) {
				return migrate.Maildir{Root: args[0]}, nil
			})
		},
	}
	var folder string
	mbox := &cobra.Command{
		Use: "mbox PATH", Short: "Import an mbox file (into --folder) or a directory of them (a folder each)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			return runImport(&mailAPI{c: &c, user: user}, dryRun, func(max int64) (migrate.Source, error) {
				return &migrate.Mbox{Path: args[0], Folder: folder, MaxSize: max}, nil
			})
		},
	}
	mbox.Flags().StringVar(&folder, "folder", "INBOX", "the mailbox a single mbox file goes to")

	var from, passwordFile, tlsCA string
	var tlsInsecure bool
	imapCmd := &cobra.Command{
		Use:   "imap --from imaps://user@host[:port]",
		Short: "Import every folder of an IMAP server (as imapsync does: flags, internal dates, subscriptions)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			src, err := migrate.ParseSourceURL(from)
			if err != nil {
				return err
			}
			pw, err := sourcePassword(passwordFile, src.Username)
			if err != nil {
				return err
			}
			tc, err := sourceTLS(tlsCA, tlsInsecure)
			if err != nil {
				return err
			}
			return runImport(&mailAPI{c: &c, user: user}, dryRun, func(max int64) (migrate.Source, error) {
				s, err := migrate.DialIMAP(src, pw, tc)
				if err != nil {
					return nil, err
				}
				s.MaxSize = max
				return s, nil
			})
		},
	}
	imapCmd.Flags().StringVar(&from, "from", "", "the source: imaps://user@host[:port] (implicit TLS), or imap://... (STARTTLS; in the clear to loopback only); a user name with @ is written %40")
	imapCmd.Flags().StringVar(&passwordFile, "password-file", "", "file whose first line is the source's password (default: $"+importPasswordEnv+", or a prompt)")
	imapCmd.Flags().StringVar(&tlsCA, "tls-ca", "", "PEM file of the certificates to trust for the source's TLS (default: the system's)")
	imapCmd.Flags().BoolVar(&tlsInsecure, "tls-insecure", false, "do not check the source's certificate (test rigs only)")
	imapCmd.MarkFlagRequired("from")
	cmd.AddCommand(maildir, mbox, imapCmd)
	rootCmd.AddCommand(cmd)
}

// sourcePassword reads the IMAP source's password: the first line of
// --password-file, else $QUILL_IMPORT_PASSWORD, else a prompt on the
// terminal. Never a flag: command lines are visible to every local user.
func sourcePassword(file, user string) (string, error) {
	if file != "" {
		f, err := os.Open(file)
		if err != nil {
			return "", fmt.Errorf("password file: %w", err)
		}
		defer f.Close()
		line, err := bufio.NewReader(f).ReadString('\n')
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			return "", fmt.Errorf("password file %s: empty first line (%v)", file, err)
		}
		return line, nil
	}
	if pw := os.Getenv(importPasswordEnv); pw != "" {
		return pw, nil
	}
	if !term.IsTerminal(int(os.Stdin.Fd())) {
		return "", fmt.Errorf("no password for the source: give --password-file or set $%s", importPasswordEnv)
	}
	fmt.Fprintf(os.Stderr, "Password of %s at the source: ", user)
	p, err := term.ReadPassword(int(os.Stdin.Fd()))
	fmt.Fprintln(os.Stderr)
	return string(p), err
}

// sourceTLS is the TLS configuration for the source: extra roots from
// --tls-ca, or no check with --tls-insecure.
func sourceTLS(caFile string, insecure bool) (*tls.Config, error) {
	tc := &tls.Config{InsecureSkipVerify: insecure}
	if caFile != "" {
		pem, err := os.ReadFile(caFile)
		if err != nil {
			return nil, fmt.Errorf("--tls-ca: %w", err)
		}
		tc.RootCAs = x509.NewCertPool()
		if !tc.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("--tls-ca %s: no PEM certificate in it", caFile)
		}
	}
	return tc, nil
}

// importJob is one destination mailbox and the source folders that go
// into it (several when special-use mapping merges them).
type importJob struct {
	target     string
	specialUse string
	subscribed bool
	exists     bool
	folders    []int
	// src are the source's messages of all the folders, each with the
	// folder it is in (from); dst the mailbox's.
	src  []migrate.Item
	from []int
	plan migrate.Plan
}

// runImport plans every destination mailbox (listing the source's folders
// and the mailbox, then migrate.Decide), shows the plan, then brings flags
// up to date and copies what is missing, with progress and a summary.
// open makes the source once the node's size limit is known.
func runImport(api *mailAPI, dryRun bool, open func(maxSize int64) (migrate.Source, error)) error {
	sum := summary{start: time.Now()}
	boxes, err := api.mailboxes()
	if err != nil {
		return err // the node names the user
	}
	src, err := open(boxes.MaxMessageSize)
	if err != nil {
		return err
	}
	defer src.Close()
	folders, err := src.Folders()
	if err != nil {
		return err
	}
	var dst []migrate.Mailbox
	for _, b := range boxes.Mailboxes {
		dst = append(dst, b.Mailbox)
	}
	targets := migrate.MapFolders(folders, dst)
	var jobs []*importJob
	byTarget := map[string]*importJob{}
	for i, t := range targets {
		j := byTarget[t]
		if j == nil {
			j = &importJob{target: t}
			j.exists = slices.ContainsFunc(dst, func(m migrate.Mailbox) bool { return m.Name == t })
			if use := folders[i].SpecialUse; use != "" && !slices.ContainsFunc(dst, func(m migrate.Mailbox) bool { return strings.EqualFold(m.SpecialUse, use) }) {
				j.specialUse = use
			}
			byTarget[t] = j
			jobs = append(jobs, j)
		}
		j.folders = append(j.folders, i)
		j.subscribed = j.subscribed || folders[i].Subscribed
	}
	sum.folders = len(folders)
	var toCopy int
	var toCopyBytes int64
	for _, j := range jobs {
		if !dryRun {
			if err := api.ensure(j.target, j.specialUse, j.subscribed); err != nil {
				return fmt.Errorf("mailbox %q: %w", j.target, err)
			}
			j.exists = true
		}
		var dstItems []migrate.Item
		if j.exists {
			if dstItems, _, err = api.list(j.target, true); err != nil {
				return err
			}
		}
		var names []string
		for _, i := range j.folders {
			items, err := src.List(&folders[i])
			if err != nil {
				return err
			}
			for range items {
				j.from = append(j.from, i)
			}
			j.src = append(j.src, items...)
			names = append(names, fmt.Sprintf("%q", folders[i].Name))
		}
		j.plan = migrate.Decide(j.src, dstItems)
		for _, k := range j.plan.Append {
			toCopyBytes += j.src[k].Size
		}
		toCopy += len(j.plan.Append)
		fmt.Fprintf(os.Stderr, "import: %s -> %q: %d at the source, %d to copy, %d already there, %d with other flags\n",
			strings.Join(names, ", "), j.target, len(j.src), len(j.plan.Append), j.plan.Same, len(j.plan.Flags))
	}
	if dryRun {
		for _, j := range jobs {
			sum.copied += len(j.plan.Append)
			sum.same += j.plan.Same
			sum.flagged += len(j.plan.Flags)
		}
		sum.bytes = toCopyBytes
		sum.print(os.Stdout, "import", true)
		return nil
	}
	prog := newProgress("import", toCopy, toCopyBytes)
	inARow := 0
	fail := func(what string, err error) error {
		sum.errors++
		inARow++
		fmt.Fprintf(os.Stderr, "\nimport: %s: %v\n", what, err)
		if inARow >= maxFailuresInARow {
			return fmt.Errorf("%d messages in a row failed, the last: %s: %w", inARow, what, err)
		}
		return nil
	}
	for _, j := range jobs {
		sum.same += j.plan.Same
		if err := setFlags(api, j.target, j.plan.Flags); err != nil {
			if ferr := fail(fmt.Sprintf("flags in %q", j.target), err); ferr != nil {
				return ferr
			}
		} else {
			sum.flagged += len(j.plan.Flags)
		}
		// The messages to copy, per source folder, in the source's order.
		for _, i := range j.folders {
			var items []migrate.Item
			for _, k := range j.plan.Append {
				if j.from[k] == i {
					items = append(items, j.src[k])
				}
			}
			if len(items) == 0 {
				continue
			}
			prog.startFolder(j.target, len(items))
			err := src.Fetch(&folders[i], items, func(it migrate.Item, raw []byte, err error) error {
				what := fmt.Sprintf("folder %q message %s", folders[i].Name, it.ID)
				if err == nil {
					err = api.appendMessage(j.target, raw, it.Flags, it.Date)
				}
				prog.add(it.Size)
				if err != nil {
					return fail(what, err)
				}
				inARow = 0
				sum.copied++
				sum.bytes += int64(len(raw))
				return nil
			})
			if err != nil {
				prog.finish()
				return err
			}
		}
	}
	prog.finish()
	sum.print(os.Stdout, "import", false)
	if sum.errors > 0 {
		return fmt.Errorf("%d messages or flag changes failed (listed above); run the import again to retry them", sum.errors)
	}
	return nil
}

// flagChunk is how many UIDs one flag change call names (the API takes
// up to 10,000).
const flagChunk = 5000

// setFlags applies a plan's flag changes, one call per set of flags.
func setFlags(api *mailAPI, mailbox string, changes []migrate.FlagChange) error {
	bySet := map[string][]uint32{}
	var order []string
	for _, c := range changes {
		k := strings.Join(c.Flags, " ")
		if _, ok := bySet[k]; !ok {
			order = append(order, k)
		}
		bySet[k] = append(bySet[k], c.UID)
	}
	var errs []error
	for _, k := range order {
		flags := []string{}
		if k != "" {
			flags = strings.Split(k, " ")
		}
		for uids := range slices.Chunk(bySet[k], flagChunk) {
			if err := api.setFlags(mailbox, uids, flags); err != nil {
				errs = append(errs, err)
			}
		}
	}
	return errors.Join(errs...)
}

package main

import (
	"bytes"
	"crypto/tls"
	"fmt"
	"io"
	"os"
	"os/signal"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/quillmail/quill/internal/bench"
)

// defaultProbeDuration replaces the 30 s default of --duration when --probe
// is given without --duration: a probe needs many steps.
const defaultProbeDuration = 3 * time.Minute

func init() { rootCmd.AddCommand(newBenchCmd()) }

func newBenchCmd() *cobra.Command {
	var (
		smtpAddr, pop3Addr, imapAddr, workload    string
		domain, password                          string
		adminURL, adminToken, usersFile, jsonFile string
		duration, deadline, step                  time.Duration
		concurrency, nUsers, createPar            int
		probeStart, probeMax                      int
		mix, imapMix, paceRate                    float64
		remoteDomain                              string
		rcpts                                     int
		noAuth                                    bool
		seed                                      uint64
		probe, noCreate, jsonOut, quiet           bool
		useTLS, tlsResume                         bool
		serverPIDs                                []int
		search                                    bench.SearchConfig
		passwordFile                              string
		sizeRange, bodyText                       string
		count                                     int64
	)
	cmd := &cobra.Command{
		Use:   "bench",
		Short: "Drive an SMTP+POP3(+IMAP) server with the Porcupine synthetic workload",
		Long: `bench is a load generator for the synthetic workload of Porcupine §6.1:
users chosen by Zipf (alpha 1.3), messages of mean 4.7 KB with a tail to 1 MiB
(log-normal clipped to [200 B, 1 MiB]), 90% SMTP sessions delivering one message,
10% POP3 sessions that retrieve and delete every waiting message (at most one
POP3 session per user at a time).

--mix-imap F makes a fraction F of the requests IMAP sessions (the rest keep
the --mix split between SMTP and POP3): connect, LOGIN, SELECT INBOX, FETCH 1:*
(UID FLAGS RFC822.SIZE BODY.PEEK[HEADER.FIELDS (FROM SUBJECT DATE)]), then UID
FETCH BODY[] of one random message and UID STORE +FLAGS (\Seen) on it, LOGOUT;
each step has its own deadline. A user has at most one POP3 or IMAP session at
a time. --workload imap is short for --mix-imap 0.5 --mix 1: half SMTP
deliveries that keep the mailboxes filling, half IMAP sessions, no POP3.
--workload submission makes every session a submission: the user logs in
(AUTH PLAIN) and sends one message from their address to --rcpts addresses
of --remote-domain, which the server queues and relays; give --smtp the
submission port (and --tls for implicit TLS, port 465).

With --concurrency N it runs N closed-loop workers for --duration. With --probe it
starts with a few workers and raises their number step by step (--step each)
until at least 10% of the requests of a step miss --deadline, then bisects, and
reports the step with the best delivery rate (as Porcupine's generator does).

Users are user00001@DOMAIN ... (--users of them, all with --password); they are
created through Quill's admin API (--admin) unless --no-create or --users-file is
given. --users-file reads "address [password]" lines instead, most popular first,
for running against another server.

--sizes MIN-MAX draws every message's size uniformly from that range instead
(the CassMail experiments: --sizes 2K-20K, --sizes 200K-2M).

--workload search is the large-mailbox workload (issue 13): one user's INBOX
of --messages generated messages (about 2 KB each, 97 senders, 1,000
subjects, one word each that no other message has). --fill first appends the
messages the INBOX lacks (MULTIAPPEND and LITERAL+ when the server offers
them) and waits --settle; then, on a new connection, each command (SELECT,
FETCH 1:* (FLAGS), SEARCH UNSEEN, SORT (ARRIVAL), SORT (REVERSE ARRIVAL),
SEARCH SUBJECT, TEXT, FROM, BODY) runs --warmup times, then --repeat times
timed. The report gives each command's mean, median and slowest time and how
many messages its answer named beside how many it should, and with
--server-pid the CPU the server and the rest of the machine used meanwhile. It speaks plain
IMAP to any server: give --imap, --user and --password-file (or --password).

--smtp, --pop3 and --imap each take one address or a comma-separated list
(the nodes of a cluster); every session then connects to one of them at random,
as Porcupine's generator did, and if that connection is refused it tries the
others in turn, as a mail client tries a name's several addresses (the report
counts the refusals). The JSON report has the run's per-second series
(what was delivered, retrieved and failed in each second, with wall-clock
times), from which a timeline through a node's failure is drawn.

Progress goes to stderr once a second, the report to stdout (--json for JSON).`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, cancel := signal.NotifyContext(cmd.Context(), os.Interrupt, syscall.SIGTERM)
			defer cancel()
			stderr := cmd.ErrOrStderr()
			if workload == "search" {
				search.Addr, search.Password, search.ServerPIDs = imapAddr, password, serverPIDs
				if passwordFile != "" {
					b, err := os.ReadFile(passwordFile)
					if err != nil {
						return err
					}
					search.Password = strings.TrimRight(string(b), "\r\n")
				}
				if !quiet {
					search.Progress = stderr
				}
				if useTLS {
					search.TLS = &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
				}
				rep, err := bench.RunSearch(ctx, search)
				if err != nil {
					return err
				}
				return writeReport(cmd.OutOrStdout(), rep, jsonOut, jsonFile)
			}

			var users []bench.User
			if usersFile != "" {
				f, err := os.Open(usersFile)
				if err != nil {
					return err
				}
				users, err = bench.ParseUsers(f, password)
				f.Close()
				if err != nil {
					return fmt.Errorf("%s: %w", usersFile, err)
				}
			} else {
				if nUsers < 1 {
					return fmt.Errorf("--users must be at least 1")
				}
				users = bench.GenerateUsers(nUsers, domain, password)
				if !noCreate {
					c := &bench.Creator{BaseURL: adminURL, Token: adminToken, Parallel: createPar}
					if !quiet {
						c.Progress = stderr
					}
					if _, err := c.Create(ctx, users); err != nil {
						return fmt.Errorf("creating users through %s: %w (use --no-create if they exist)", adminURL, err)
					}
				}
			}

			var submit *bench.Submit
			switch workload {
			case "submission":
				mix, imapMix = 1, 0
				submit = &bench.Submit{RemoteDomain: remoteDomain, Rcpts: rcpts, NoAuth: noAuth}
			case "porcupine":
			case "imap":
				if !cmd.Flags().Changed("mix-imap") {
					imapMix = 0.5
				}
				if !cmd.Flags().Changed("mix") {
					mix = 1
				}
			default:
				return fmt.Errorf("--workload: want porcupine, imap, submission or search, not %q", workload)
			}
			if imapMix < 0 || imapMix > 1 {
				return fmt.Errorf("--mix-imap must be within [0, 1]")
			}
			var sizes *bench.SizeRange
			if sizeRange != "" {
				r, err := bench.ParseSizeRange(sizeRange)
				if err != nil {
					return fmt.Errorf("--sizes: %w", err)
				}
				sizes = &r
			}
			cfg := bench.Config{
				SMTPAddr:    smtpAddr,
				POP3Addr:    pop3Addr,
				IMAPAddr:    imapAddr,
				IMAPMix:     imapMix,
				Users:       users,
				Domain:      domain,
				Duration:    duration,
				Deadline:    deadline,
				Concurrency: concurrency,
				Rate:        paceRate,
				Mix:         mix,
				Seed:        seed,
				Step:        step,
				ServerPIDs:  serverPIDs,
				Submit:      submit,
				Range:       sizes,
				Count:       count,
			}
			if bodyText != "" {
				b, err := os.ReadFile(bodyText)
				if err != nil {
					return fmt.Errorf("--body-text: %w", err)
				}
				if len(bytes.TrimSpace(b)) == 0 {
					return fmt.Errorf("--body-text %s: no text", bodyText)
				}
				cfg.BodyText = b
			}
			if useTLS {
				// A bench measures the cost of TLS, not trust in the
				// server's certificate (often self-signed on a test rig).
				cfg.TLS = &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}
				if tlsResume {
					cfg.TLS.ClientSessionCache = tls.NewLRUClientSessionCache(4 * len(users))
				}
			}
			if probe {
				p := bench.NewProbe()
				p.Start, p.Max = probeStart, probeMax
				cfg.Probe = p
				if !cmd.Flags().Changed("duration") {
					cfg.Duration = defaultProbeDuration
				}
			}
			if !quiet {
				cfg.Progress = stderr
				mode := fmt.Sprintf("concurrency %d", concurrency)
				if probe {
					mode = fmt.Sprintf("probe from %d workers, %v steps", probeStart, step)
				}
				if imapMix > 0 {
					mode += fmt.Sprintf(", %.0f%% IMAP sessions", imapMix*100)
				}
				fmt.Fprintf(stderr, "bench: %d users, %s, for at most %v\n", len(users), mode, cfg.Duration)
			}
			rep, err := bench.Run(ctx, cfg)
			if err != nil {
				return err
			}
			return writeReport(cmd.OutOrStdout(), rep, jsonOut, jsonFile)
		},
	}
	f := cmd.Flags()
	f.StringVar(&smtpAddr, "smtp", "127.0.0.1:2525", "SMTP server address, or a comma-separated list (a cluster's nodes: each session connects to one at random)")
	f.StringVar(&pop3Addr, "pop3", "127.0.0.1:1110", "POP3 server address, or a comma-separated list as for --smtp")
	f.StringVar(&imapAddr, "imap", "127.0.0.1:1143", "IMAP server address, or a comma-separated list as for --smtp (used with --mix-imap or --workload imap)")
	f.DurationVar(&duration, "duration", bench.DefaultDuration,
		"length of the run (3m when --probe is given without --duration)")
	f.Float64Var(&paceRate, "rate", 0, "cap the requests started per second across all workers (0: none); runs of two servers at the same rate compare latencies under the same load")
	f.IntVar(&concurrency, "concurrency", bench.DefaultConcurrency, "number of concurrent workers (without --probe)")
	f.BoolVar(&probe, "probe", false, "raise concurrency step by step until 10% of requests miss the deadline")
	f.DurationVar(&step, "step", bench.DefaultStep, "length of one probe step")
	f.IntVar(&probeStart, "probe-start", bench.DefaultProbeStart, "concurrency of the first probe step")
	f.IntVar(&probeMax, "probe-max", bench.DefaultProbeMax, "highest concurrency the probe tries")
	f.DurationVar(&deadline, "deadline", bench.DefaultDeadline, "latency above which a request counts as missed")
	f.Float64Var(&mix, "mix", bench.SMTPShare,
		"fraction of the non-IMAP requests that are SMTP deliveries (the rest are POP3 sessions)")
	f.Float64Var(&imapMix, "mix-imap", 0, "fraction of requests that are IMAP sessions (0: the Porcupine workload)")
	f.StringVar(&workload, "workload", "porcupine",
		"porcupine; imap: 50% SMTP deliveries and 50% IMAP sessions (--mix 1 --mix-imap 0.5); submission: every session a user logs in (AUTH PLAIN) and sends to --rcpts addresses of --remote-domain (give --smtp the submission address, --tls for implicit TLS); search: SEARCH and SORT on one large INBOX (--user, --messages, --fill)")
	f.StringVar(&search.User, "user", "", "search workload: the user whose INBOX is searched")
	f.StringVar(&passwordFile, "password-file", "", "search workload: read the user's password from FILE (its first line) instead of --password")
	f.IntVar(&search.Messages, "messages", 100000, "search workload: messages in the INBOX")
	f.BoolVar(&search.Fill, "fill", false, "search workload: first append the messages the INBOX lacks")
	f.BoolVar(&search.FillOnly, "fill-only", false, "search workload: append the messages the INBOX lacks and time nothing")
	f.DurationVar(&search.Settle, "settle", bench.DefaultSettle, "search workload: pause between a fill and the timing")
	f.IntVar(&search.Warmup, "warmup", bench.DefaultSearchWarmup, "search workload: untimed runs of each command")
	f.IntVar(&search.Repeat, "repeat", bench.DefaultSearchRepeat, "search workload: timed runs of each command")
	f.StringVar(&remoteDomain, "remote-domain", "remote.test", "domain the submission workload sends to (the server must relay it)")
	f.Int64Var(&count, "count", 0, "end the run once this many SMTP deliveries have started (0: run for --duration)")
	f.StringVar(&bodyText, "body-text", "", "cut message bodies from the lines of this text file instead of random symbols (prose compresses as mail does)")
	f.StringVar(&sizeRange, "sizes", "", `draw message sizes uniformly from MIN-MAX (K = 1024 bytes), such as 2K-20K or 200K-2M (CassMail's ranges); default: Porcupine's log-normal, mean 4.7 KB`)
	f.IntVar(&rcpts, "rcpts", 1, "recipients per submitted message")
	f.BoolVar(&noAuth, "no-auth", false, "submission workload without AUTH (a peer that relays for its network)")
	f.IntVar(&nUsers, "users", 1000, "number of bench users")
	f.StringVar(&domain, "domain", "bench.example", "domain of the bench users")
	f.StringVar(&password, "password", "benchpass", "password of every bench user")
	f.Uint64Var(&seed, "seed", 1, "random seed")
	f.StringVar(&adminURL, "admin", "http://127.0.0.1:8025", "Quill admin API base URL, for creating the users")
	f.StringVar(&adminToken, "admin-token", os.Getenv("QUILL_ADMIN_TOKEN"), "token of the admin API, for creating the users (default $QUILL_ADMIN_TOKEN; DATA/admin.token of the node)")
	f.IntVar(&createPar, "create-parallel", 4, "user creation requests in flight")
	f.StringVar(&usersFile, "users-file", "", `read users from FILE ("address [password]" lines) and create none`)
	f.BoolVar(&noCreate, "no-create", false, "do not create the users")
	f.BoolVar(&jsonOut, "json", false, "print the report as JSON")
	f.IntSliceVar(&serverPIDs, "server-pid", nil,
		"process ids of the server (their process trees' CPU use goes in the report)")
	f.StringVar(&jsonFile, "json-file", "", "also write the JSON report to FILE")
	f.BoolVar(&quiet, "quiet", false, "no progress output")
	f.BoolVar(&useTLS, "tls", false, "speak implicit TLS on every session (give the SMTPS, POP3S and IMAPS ports as --smtp, --pop3, --imap); the server's certificate is not checked")
	f.BoolVar(&tlsResume, "tls-resume", true, "with --tls, let returning clients resume their TLS session (session tickets), as real clients do")
	return cmd
}

// report is what a bench run prints.
type report interface {
	WriteJSON(io.Writer) error
	WriteText(io.Writer) error
}

// writeReport writes rep to out (as JSON with jsonOut) and, with jsonFile,
// as JSON to that file too.
func writeReport(out io.Writer, rep report, jsonOut bool, jsonFile string) error {
	if jsonFile != "" {
		f, err := os.Create(jsonFile)
		if err != nil {
			return err
		}
		if err := rep.WriteJSON(f); err != nil {
			f.Close()
			return err
		}
		if err := f.Close(); err != nil {
			return err
		}
	}
	if jsonOut {
		return rep.WriteJSON(out)
	}
	return rep.WriteText(out)
}

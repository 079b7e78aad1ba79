package main

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quillmail/quill/internal/admin"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/retry"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/spf13/cobra"
	"golang.org/x/term"
)

// adminTimeout bounds one admin API call; adding a user hashes a password,
// which takes tens of milliseconds.
const adminTimeout = 30 * time.Second

// adminBusyRetry paces a read the admin API answered 503: a node's answer
// waits at most cluster.FanOutWait for another node, and a user's writer
// that must load the user first (on Cassandra, a lightweight transaction
// per mailbox for its fence) answers a moment later; the load goes on
// after the 503, so a second read finds it done. Reads only: a write
// answered 503 may still have been made.
var adminBusyRetry = retry.Policy{Attempts: 4, Base: 500 * time.Millisecond, Max: 2 * time.Second, Factor: 2}

// isBusy reports an admin API answer of 503 (try again later).
func isBusy(err error) bool {
	var ae *apiError
	return errors.As(err, &ae) && ae.code == http.StatusServiceUnavailable
}

// adminClient talks to a node's admin API.
type adminClient struct {
	server, token, dataDir string
}

func (c *adminClient) flags(cmd *cobra.Command) {
	cmd.PersistentFlags().StringVar(&c.server, "server", "http://127.0.0.1:8025", "admin API URL of a running node")
	cmd.PersistentFlags().StringVar(&c.token, "token", os.Getenv("QUILL_ADMIN_TOKEN"), "admin token (default $QUILL_ADMIN_TOKEN, or read from --data)")
	cmd.PersistentFlags().StringVar(&c.dataDir, "data", "quill-data", "data directory to read the admin token from when --token is not given")
}

// tokenValue is --token, $QUILL_ADMIN_TOKEN, or the token file of --data.
func (c *adminClient) tokenValue() (string, error) {
	if c.token != "" {
		return c.token, nil
	}
	path := filepath.Join(c.dataDir, admin.TokenFile)
	b, err := os.ReadFile(path)
	if err != nil {
		return "", fmt.Errorf("admin token: %w (give --token, set QUILL_ADMIN_TOKEN, or --data of the node)", err)
	}
	return strings.TrimSpace(string(b)), nil
}

func (c *adminClient) do(method, path string, body any, out any) error {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	ctx, cancel := context.WithTimeout(context.Background(), adminTimeout)
	defer cancel()
	var resp *http.Response
	err := retry.Do(ctx, adminBusyRetry, func(err error) bool { return method == "GET" && isBusy(err) }, func(ctx context.Context) (err error) {
		resp, err = c.send(ctx, method, path, "application/json", rd)
		return err
	})
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	data, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return fmt.Errorf("admin API %s %s: %w", method, path, err)
	}
	if out != nil {
		return json.Unmarshal(data, out)
	}
	return nil
}

// readPassword takes --password, else prompts on a terminal, else reads the
// first line of stdin.
func readPassword(flag string, confirm bool) (string, error) {
	if flag != "" {
		return flag, nil
	}
	if term.IsTerminal(int(os.Stdin.Fd())) {
		fmt.Fprint(os.Stderr, "Password: ")
		p, err := term.ReadPassword(int(os.Stdin.Fd()))
		fmt.Fprintln(os.Stderr)
		if err != nil {
			return "", err
		}
		if confirm {
			fmt.Fprint(os.Stderr, "Again: ")
			q, err := term.ReadPassword(int(os.Stdin.Fd()))
			fmt.Fprintln(os.Stderr)
			if err != nil {
				return "", err
			}
			if string(p) != string(q) {
				return "", fmt.Errorf("passwords do not match")
			}
		}
		return string(p), nil
	}
	line, err := bufio.NewReader(os.Stdin).ReadString('\n')
	if err != nil && err != io.EOF {
		return "", fmt.Errorf("read password from stdin: %w", err)
	}
	line = strings.TrimRight(line, "\r\n")
	if line == "" {
		return "", fmt.Errorf("no password given (use --password or pipe it on stdin)")
	}
	return line, nil
}

func init() {
	var c adminClient
	var password, policy string
	var replicas, spread int
	var isAdmin bool
	cmd := &cobra.Command{Use: "user", Short: "Manage users on a running node"}
	c.flags(cmd)

	add := &cobra.Command{
		Use: "add ADDRESS", Short: "Add a user (password from --password or stdin)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pw, err := readPassword(password, true)
			if err != nil {
				return err
			}
			body := map[string]any{"address": args[0], "password": pw, "replicas": replicas, "write_policy": policy, "spread": spread, "admin": isAdmin}
			if err := c.do("POST", "/api/users", body, nil); err != nil {
				return err
			}
			fmt.Printf("added %s\n", args[0])
			return nil
		},
	}
	add.Flags().StringVar(&password, "password", "", "the password (default: read from stdin or prompt)")
	add.Flags().BoolVar(&isAdmin, "admin", false, "the user may sign in to the admin console")
	replFlags := func(cmd *cobra.Command) {
		cmd.Flags().IntVar(&replicas, "replicas", 0, "copies of each of the user's messages (0: the cluster's --replicas)")
		cmd.Flags().StringVar(&policy, "write-policy", "", "replicas durable before delivery is acknowledged: one, quorum or all (empty: the cluster's --write-policy)")
		cmd.Flags().IntVar(&spread, "spread", 0, "nodes the user's mail may spread over (0: the cluster's --spread)")
	}
	replFlags(add)

	set := &cobra.Command{
		Use:   "set ADDRESS",
		Short: "Change a user's placement settings (--replicas and --write-policy together, --spread)",
		Long: "Change a user's placement settings. --replicas and --write-policy are set together (one not given\n" +
			"goes back to the cluster's default); --spread alone leaves them as they are.",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			path := "/api/users/" + url.PathEscape(args[0])
			onlySpread := cmd.Flags().Changed("spread") && !cmd.Flags().Changed("replicas") && !cmd.Flags().Changed("write-policy")
			if !onlySpread {
				body := map[string]any{"replicas": replicas, "write_policy": policy}
				if err := c.do("PUT", path+"/replication", body, nil); err != nil {
					return err
				}
				fmt.Printf("%s: replicas %s, write policy %s\n", args[0], orDefault(replicas), policyOrDefault(policy))
			}
			if cmd.Flags().Changed("spread") {
				if err := c.do("PUT", path+"/spread", map[string]int{"spread": spread}, nil); err != nil {
					return err
				}
				fmt.Printf("%s: spread %s\n", args[0], orDefault(spread))
			}
			return nil
		},
	}
	replFlags(set)

	show := &cobra.Command{
		Use:   "show ADDRESS",
		Short: "Show a user's settings, mail map and the nodes holding its mail",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var u struct {
				shownSettings
				MailMap []cluster.NodeID `json:"mail_map"`
				Holders []cluster.NodeID `json:"holders"`
			}
			if err := c.do("GET", "/api/users/"+url.PathEscape(args[0]), nil, &u); err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintf(w, "address\t%s\n", u.Address)
			fmt.Fprintf(w, "created\t%s\n", u.Created.Local().Format(time.DateTime))
			fmt.Fprintf(w, "replicas\t%s\n", orDefault(u.Replicas))
			fmt.Fprintf(w, "write policy\t%s\n", policyOrDefault(u.WritePolicy))
			fmt.Fprintf(w, "spread\t%s\n", orDefault(u.Spread))
			fmt.Fprintf(w, "console\t%v\n", u.Admin)
			fmt.Fprintf(w, "mail map\t%s\n", nodeList(u.MailMap))
			fmt.Fprintf(w, "holding mail\t%s\n", nodeList(u.Holders))
			return w.Flush()
		},
	}

	passwd := &cobra.Command{
		Use: "passwd ADDRESS", Short: "Change a user's password", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			pw, err := readPassword(password, true)
			if err != nil {
				return err
			}
			if err := c.do("PUT", "/api/users/"+url.PathEscape(args[0])+"/password", map[string]string{"password": pw}, nil); err != nil {
				return err
			}
			fmt.Printf("password of %s changed\n", args[0])
			return nil
		},
	}
	passwd.Flags().StringVar(&password, "password", "", "the new password (default: read from stdin or prompt)")

	var on, off bool
	adm := &cobra.Command{
		Use: "admin ADDRESS --on|--off", Short: "Let a user sign in to the admin console (--on) or stop them (--off)", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if on == off {
				return fmt.Errorf("give --on or --off")
			}
			if err := c.do("PUT", "/api/users/"+url.PathEscape(args[0])+"/admin", map[string]bool{"admin": on}, nil); err != nil {
				return err
			}
			if on {
				fmt.Printf("%s may sign in to the admin console\n", args[0])
			} else {
				fmt.Printf("%s may no longer sign in to the admin console\n", args[0])
			}
			return nil
		},
	}
	adm.Flags().BoolVar(&on, "on", false, "allow")
	adm.Flags().BoolVar(&off, "off", false, "forbid")

	var hashPW string
	hash := &cobra.Command{
		Use:   "hash",
		Short: "Print a password's hash as Quill stores it (argon2id, PHC string), for a users file or another server's passdb",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			pw, err := readPassword(hashPW, false)
			if err != nil {
				return err
			}
			h, err := userdb.HashPassword(pw)
			if err != nil {
				return err
			}
			fmt.Println(h)
			return nil
		},
	}
	hash.Flags().StringVar(&hashPW, "password", "", "the password (default: read from stdin or prompt)")

	del := &cobra.Command{
		Use: "del ADDRESS", Short: "Delete a user and all their mail", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := c.do("DELETE", "/api/users/"+url.PathEscape(args[0]), nil, nil); err != nil {
				return err
			}
			fmt.Printf("deleted %s\n", args[0])
			return nil
		},
	}

	list := &cobra.Command{
		Use: "list", Short: "List users", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var users []struct {
				shownSettings
				Stale *cluster.Stale `json:"stale"`
			}
			if err := c.do("GET", "/api/users", nil, &users); err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ADDRESS\tCREATED\tREPLICAS\tWRITE POLICY\tSPREAD\tCONSOLE\t")
			stale := 0
			for _, u := range users {
				console, mark := "", ""
				if u.Admin {
					console = "admin"
				}
				if u.Stale != nil {
					mark, stale = fmt.Sprintf("(as of %.1fs ago)", u.Stale.Age), stale+1
				}
				fmt.Fprintf(w, "%s\t%s\t%s\t%s\t%s\t%s\t%s\n", u.Address, u.Created.Local().Format(time.DateTime), orDefault(u.Replicas),
					policyOrDefault(u.WritePolicy), orDefault(u.Spread), console, mark)
			}
			if err := w.Flush(); err != nil {
				return err
			}
			if stale > 0 {
				fmt.Printf("%d user(s) from the last answer of a node that did not answer in time\n", stale)
			}
			return nil
		},
	}
	cmd.AddCommand(add, passwd, set, show, adm, del, list, hash, quotaCommand(&c))
	rootCmd.AddCommand(cmd)
}

func orDefault(n int) string {
	if n == 0 {
		return "default"
	}
	return fmt.Sprint(n)
}

func policyOrDefault(p string) string {
	if p == "" {
		return "default"
	}
	return p
}

// shownSettings is a user as the admin API lists and shows it.
type shownSettings struct {
	Address     string    `json:"address"`
	Created     time.Time `json:"created"`
	Replicas    int       `json:"replicas"`
	WritePolicy string    `json:"write_policy"`
	Spread      int       `json:"spread"`
	Admin       bool      `json:"admin"`
}

// nodeList prints node ids separated by spaces, "none" for none.
func nodeList(ns []cluster.NodeID) string {
	if len(ns) == 0 {
		return "none"
	}
	out := make([]string, len(ns))
	for i, n := range ns {
		out[i] = string(n)
	}
	return strings.Join(out, " ")
}

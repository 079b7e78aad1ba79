package main

import (
	"encoding/json"
	"fmt"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/quillmail/quill/internal/queue"
	"github.com/spf13/cobra"
)

func init() {
	var c adminClient
	cmd := &cobra.Command{Use: "queue", Short: "Show and act on the outbound queue of the whole cluster"}
	c.flags(cmd)

	list := &cobra.Command{
		Use: "list", Short: "List the messages waiting to go to other domains, on every node", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			var l queue.Listing
			if err := c.do("GET", "/api/queue", nil, &l); err != nil {
				return err
			}
			w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
			fmt.Fprintln(w, "ID\tAGE\tSIZE\tFROM\tWAITING\tNEXT TRY\tLAST REPLY")
			now := time.Now()
			for _, e := range l.Entries {
				var waiting []string
				next, last := time.Time{}, ""
				for _, r := range e.Recipients {
					if r.State != queue.Queued && r.State != queue.Failed {
						continue
					}
					waiting = append(waiting, r.Address)
					if next.IsZero() || r.NextTry.Before(next) {
						next = r.NextTry
					}
					if r.LastReply != "" {
						last = r.LastReply
					}
				}
				from := e.From
				if from == "" {
					from = "<> (report)"
				}
				fmt.Fprintf(w, "%s\t%s\t%d\t%s\t%s\t%s\t%s\n", e.ID, now.Sub(e.Created).Round(time.Second), e.Size, from,
					strings.Join(waiting, ","), until(now, next), trim(last, 60))
			}
			if err := w.Flush(); err != nil {
				return err
			}
			fmt.Printf("%d message(s)\n", len(l.Entries))
			for n, why := range l.Unreachable {
				if st := l.Stale[n]; st != nil {
					fmt.Printf("node %s did not answer (%s): messages held only there are as it listed them %.1fs ago\n", n, why, st.Age)
					continue
				}
				fmt.Printf("node %s did not answer (%s): messages held only there are not listed\n", n, why)
			}
			return nil
		},
	}
	show := &cobra.Command{
		Use: "show ID", Short: "Show one queued message: envelope, replicas and each recipient's state", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var e queue.Entry
			if err := c.do("GET", "/api/queue/"+args[0], nil, &e); err != nil {
				return err
			}
			b, _ := json.MarshalIndent(e, "", "  ")
			fmt.Println(string(b))
			return nil
		},
	}
	retry := &cobra.Command{
		Use: "retry ID", Short: "Try a queued message's waiting recipients now", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := c.do("POST", "/api/queue/"+args[0]+"/retry", nil, nil); err != nil {
				return err
			}
			fmt.Printf("%s: waiting recipients are tried now\n", args[0])
			return nil
		},
	}
	del := &cobra.Command{
		Use: "delete ID", Short: "Remove a queued message without telling its sender", Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if err := c.do("DELETE", "/api/queue/"+args[0], nil, nil); err != nil {
				return err
			}
			fmt.Printf("%s: deleted\n", args[0])
			return nil
		},
	}
	cmd.AddCommand(list, show, retry, del)
	rootCmd.AddCommand(cmd)
}

func until(now, t time.Time) string {
	if t.IsZero() {
		return "-"
	}
	if !t.After(now) {
		return "now"
	}
	return "in " + t.Sub(now).Round(time.Second).String()
}

func trim(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n-1] + "…"
}

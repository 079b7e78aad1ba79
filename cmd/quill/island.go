package main

import (
	"fmt"
	"net/url"
	"os"
	"strings"
	"text/tabwriter"

	"github.com/quillmail/quill/internal/admin"
	"github.com/spf13/cobra"
)

func init() {
	var c adminClient
	var asJSON bool
	cmd := &cobra.Command{Use: "island", Short: "Look at and change the cluster's islands (Archipelago: each user's state in one island)"}
	c.flags(cmd)
	status := &cobra.Command{
		Use: "status", Short: "The bucket→island table, each island's buckets and live nodes, and the table change under way", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return showStatus(&c, "/api/islands", asJSON, printIslands)
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	remove := &cobra.Command{
		Use:   "remove NAME",
		Short: "Move every bucket of an island to the others (keep its nodes up until `quill island status` shows it gone)",
		Args:  cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			var out map[string]string
			if err := c.do("POST", "/api/islands/"+url.PathEscape(args[0])+"/remove", nil, &out); err != nil {
				return err
			}
			fmt.Printf("island %s: %s\n", args[0], out["state"])
			return nil
		},
	}
	cmd.AddCommand(status, remove)
	rootCmd.AddCommand(cmd)
}

func printIslands(st admin.IslandStatus) {
	if !st.Table {
		fmt.Println("one island: no node was started with --island, so any node may hold any user's state")
	} else {
		fmt.Printf("island table epoch %d\n\n", st.Epoch)
	}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "ISLAND\tBUCKETS\t\tLIVE NODES")
	for _, isl := range st.Islands {
		name := isl.Name
		if !isl.InTable {
			name += " (not in the table yet)"
		}
		bar := strings.Repeat("#", (isl.Buckets+7)/8)
		fmt.Fprintf(w, "%s\t%d\t%s\t%s\n", name, isl.Buckets, bar, strings.Join(isl.Nodes, " "))
	}
	w.Flush()
	if m := st.Manager; m != nil {
		fmt.Println()
		role := "follows the coordinator"
		if m.Coordinator {
			role = "plans table changes (lowest live node id)"
		}
		fmt.Printf("this node %s", role)
		if m.Change != "" {
			fmt.Printf("; change under way: %s", m.Change)
		}
		if m.Waiting != "" && m.Coordinator {
			fmt.Printf("; waiting: %s", m.Waiting)
		}
		fmt.Println()
		if len(m.Removing) > 0 {
			fmt.Printf("being removed: %s\n", strings.Join(m.Removing, ", "))
		}
		if m.Last != "" {
			fmt.Printf("last change: %s (%d committed, %d aborted, %d buckets moved)\n", m.Last, m.Commits, m.Aborts, m.Moved)
		}
		if m.Prepared != "" {
			fmt.Println("participant " + m.Prepared)
		}
	}
}

package main

import (
	"encoding/json"
	"fmt"
	"maps"
	"os"
	"slices"
	"strings"
	"text/tabwriter"

	"github.com/quillmail/quill/internal/admin"
	"github.com/spf13/cobra"
)

func init() {
	var c adminClient
	var asJSON bool
	cmd := &cobra.Command{Use: "cluster", Short: "Look at the cluster through a running node"}
	c.flags(cmd)
	status := &cobra.Command{
		Use: "status", Short: "Members, the user map and per-node load", Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			return showStatus(&c, "/cluster", asJSON, printStatus)
		},
	}
	status.Flags().BoolVar(&asJSON, "json", false, "print JSON")
	cmd.AddCommand(status)
	rootCmd.AddCommand(cmd)

	var d adminClient
	dash := &cobra.Command{
		Use:   "dashboard",
		Short: "Print the address that opens the admin console in a browser, signed in (it carries the admin token once)",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, args []string) error {
			tok, err := d.tokenValue()
			if err != nil {
				return err
			}
			fmt.Printf("%s/?token=%s\n", strings.TrimRight(d.server, "/"), tok)
			return nil
		},
	}
	d.flags(dash)
	rootCmd.AddCommand(dash)
}

// printStatus draws the cluster for a terminal: one line per node with a
// bar of its buckets and its load, then the user map as a 16x16 grid of
// node letters.
func printStatus(st admin.ClusterStatus) {
	fmt.Printf("user map epoch %d, %d users; this node manages %d buckets, %d with soft state rebuilt\n",
		st.Epoch, st.Users, st.Managed, st.Ready)
	if st.IslandEpoch > 0 {
		owned := map[string]int{}
		for _, b := range st.Buckets {
			owned[b.Island]++
		}
		names := slices.Sorted(maps.Keys(owned))
		var parts []string
		for _, n := range names {
			parts = append(parts, fmt.Sprintf("%s %d", n, owned[n]))
		}
		fmt.Printf("island table epoch %d: buckets per island: %s\n", st.IslandEpoch, strings.Join(parts, ", "))
	}
	fmt.Println()
	if r := st.Replication; r != nil {
		fmt.Printf("replication on this node: %d copies per message by default, write policy %s; holds %d messages, %d under-replicated;\n"+
			"  update log: %d pending, %d waiting for absent nodes, %d done (retiring)\n\n",
			r.Replicas, r.WritePolicy, r.Objects, r.UnderReplicated, r.Pending, r.Waiting, r.Done)
		if b := r.Rebalance; b != nil {
			state := "within the band"
			switch {
			case b.Rate == 0:
				state = "off (--rebalance-rate 0)"
			case b.Waiting != "":
				state = "waiting: " + b.Waiting
			case b.Active:
				state = fmt.Sprintf("moving at up to %.0f messages/s", b.Rate)
			}
			fmt.Printf("rebalance on this node: %s; holds %d bytes, mean %d, %d above it; %d messages (%d bytes) moved\n\n",
				state, b.HeldBytes, b.MeanBytes, b.SurplusBytes, b.Moved, b.MovedBytes)
		}
	}
	letter := map[string]byte{}
	w := tabwriter.NewWriter(os.Stdout, 0, 4, 2, ' ', 0)
	fmt.Fprintln(w, "\tNODE\tISLAND\tSTATE\tBOOT\tBUCKETS\t\tLOAD\tUSERS\tMESSAGES\tBYTES\tGOSSIP")
	for i, m := range st.Members {
		l := byte('A' + i%26)
		letter[string(m.ID)] = l
		self := ""
		if m.Self {
			self = " (this node)"
		}
		load, users := fmt.Sprint(m.Load), fmt.Sprint(m.Users)
		if m.Stale != nil {
			load += fmt.Sprintf(" (%.0fs old)", m.Stale.Age)
		}
		if m.UsersStale != nil {
			users += fmt.Sprintf(" (%.1fs old)", m.UsersStale.Age)
		}
		fmt.Fprintf(w, "%c\t%s%s\t%s\t%s\t%d\t%d\t%s\t%s\t%s\t%d\t%d\t%s\n", l, m.ID, self, m.Island, m.State, m.Boot, m.Buckets,
			strings.Repeat("#", m.Buckets/8), load, users, m.HeldMessages, m.HeldBytes, m.Gossip)
	}
	w.Flush()
	for n, why := range st.Unreachable {
		fmt.Printf("node %s did not answer in time (%s): its users are counted from its last answer\n", n, why)
	}
	fmt.Println("\nbuckets (row = bucket/16):")
	for r := 0; r < 16; r++ {
		var sb strings.Builder
		fmt.Fprintf(&sb, "%3d  ", r*16)
		for c := 0; c < 16; c++ {
			b := st.Buckets[r*16+c]
			l, ok := letter[string(b.Node)]
			if !ok {
				l = '-' // no manager: the bucket's island has no live member
			}
			sb.WriteByte(l)
			sb.WriteByte(' ')
		}
		fmt.Println(sb.String())
	}
}

// showStatus reads a status document from the admin API and prints it as
// indented JSON or through print.
func showStatus[T any](c *adminClient, path string, asJSON bool, print func(T)) error {
	var st T
	if err := c.do("GET", path, nil, &st); err != nil {
		return err
	}
	if asJSON {
		enc := json.NewEncoder(os.Stdout)
		enc.SetIndent("", "  ")
		return enc.Encode(st)
	}
	print(st)
	return nil
}

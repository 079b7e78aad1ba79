package main

import (
	"context"
	"fmt"
	"io"
	"math"
	"os"
	"time"

	"github.com/quillmail/quill/internal/clustersim"
	"github.com/spf13/cobra"
)

func init() { rootCmd.AddCommand(newSimulateCmd()) }

func newSimulateCmd() *cobra.Command {
	var (
		sizes                        []int
		deliveries, users, replicas  int
		gossipWindow, settle, detect time.Duration
		scale                        float64
	)
	cmd := &cobra.Command{
		Use:   "simulate",
		Short: "Simulate clusters of 64-256 nodes in this process (real membership and placement, in-memory network)",
		Long: `simulate starts, for each --nodes size, a cluster of that many simulated nodes in
this process: each runs Quill's real membership manager (memberlist's SWIM and
the user map) and placement (the load balancer's replica sets), over an
in-memory network (internal/clustersim). Once every node sees every other and
they hold one user map, it measures the gossip each node sends over
--gossip-window (then as long again with every node's load changing at each
of its 2-second refreshes, so every node gossips new metadata), simulates --deliveries deliveries to --users users with
--replicas copies (the node-to-node calls the real delivery would make), then
crashes one node and times the survivors' agreement on the new user map, with
the buckets that moved and the soft-state scans that follow.

--time-scale K runs memberlist's timers K times slower (the in-memory network
has no latency, so the protocol behaves the same) and reports times and rates
in simulated time: for a machine too busy to run hundreds of nodes in real time.
Without it a starved process sees its nodes suspect each other.

Progress goes to stderr, the table to stdout.`,
		Args: cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			out := cmd.OutOrStdout()
			fmt.Fprintf(out, "%5s %8s %8s %7s %7s %7s %7s %7s %8s %9s %12s %12s %10s %11s %10s %10s %10s %6s %8s %6s\n",
				"nodes", "settle", "RPC/msg", "lookup", "alloc", "write", "push", "confirm", "copies", "B/node/s", "max B/node/s", "msgs/node/s",
				"busy B/n/s", "busy msgs/s",
				"map first", "map median", "map all", "moved", "gainers", "scans")
			for _, n := range sizes {
				fmt.Fprintf(os.Stderr, "simulate: starting %d nodes\n", n)
				c, err := clustersim.Start(n, scale)
				if err != nil {
					return err
				}
				err = simulateOne(cmd.Context(), out, c, n, deliveries, users, replicas, gossipWindow, settle, detect)
				fmt.Fprintf(os.Stderr, "simulate: stopping %d nodes\n", n)
				c.Stop()
				if err != nil {
					return err
				}
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.IntSliceVar(&sizes, "nodes", []int{64, 128, 256}, "cluster sizes to simulate, one after the other")
	f.IntVar(&deliveries, "deliveries", 20000, "deliveries to simulate on each cluster")
	f.IntVar(&users, "users", 10000, "users the deliveries go to (uniformly)")
	f.IntVar(&replicas, "replicas", 2, "copies of each message")
	f.DurationVar(&gossipWindow, "gossip-window", 20*time.Second, "how long the gossip of a settled cluster is counted")
	f.Float64Var(&scale, "time-scale", 1, "run memberlist's timers this many times slower, for a machine that cannot give the nodes their CPU in real time; times and rates are reported in simulated time")
	f.DurationVar(&settle, "settle-timeout", 5*time.Minute, "how long a new cluster may take to see itself whole")
	f.DurationVar(&detect, "failure-timeout", 5*time.Minute, "how long the survivors of a crash may take to agree")
	return cmd
}

// simProgressEvery is how often a wait for the simulated nodes says what
// it still waits for.
const simProgressEvery = 10 * time.Second

// simulateOne measures one simulated cluster and prints its table row.
func simulateOne(ctx context.Context, out io.Writer, c *clustersim.Cluster, n, deliveries, users, replicas int, window, settle, detect time.Duration) error {
	// Settle in steps, saying what is still missing after each.
	start := time.Now()
	for {
		sctx, cancel := context.WithTimeout(ctx, simProgressEvery)
		_, err := c.Settle(sctx)
		cancel()
		if err == nil {
			break
		}
		if time.Since(start) > settle {
			return err
		}
		fmt.Fprintf(os.Stderr, "simulate: %s\n", err)
	}
	took := time.Since(start)
	fmt.Fprintf(os.Stderr, "simulate: %d nodes settled in %s; counting gossip for %s\n", n, took.Round(100*time.Millisecond), window)
	g := c.MeasureGossip(window)
	// Quill's own metadata refresh (every 2 s) is not slowed down, so
	// the busy figure is only right in real time.
	busy := clustersim.Gossip{Bytes: math.NaN(), Messages: math.NaN()}
	if c.Scale == 1 {
		fmt.Fprintf(os.Stderr, "simulate: counting gossip for %s more with every node's load changing\n", window)
		c.Busy(true)
		busy = c.MeasureGossip(window)
		c.Busy(false)
	}
	k, err := c.Deliver(deliveries, users, replicas, 1)
	if err != nil {
		return err
	}
	victim := c.Nodes[len(c.Nodes)-1]
	fmt.Fprintf(os.Stderr, "simulate: %d deliveries simulated; crashing %s\n", k.Deliveries, victim.ID)
	fctx, cancel := context.WithTimeout(ctx, detect)
	fl, err := c.Kill(fctx, victim)
	cancel()
	if err != nil {
		return err
	}
	d := float64(k.Deliveries)
	per := func(x int) float64 { return float64(x) / d }
	sec := func(t time.Duration) string { return fmt.Sprintf("%.1f s", t.Seconds()) }
	fmt.Fprintf(out, "%5d %8s %8.2f %7.2f %7.2f %7.2f %7.2f %7.2f %8.2f %9.0f %12.0f %12.1f %10.0f %11.1f %10s %10s %10s %6d %8d %6d\n",
		n, sec(took), per(k.Total()), per(k.Lookup), per(k.Alloc), per(k.Write), per(k.Push), per(k.Confirm), per(k.BodyCopies),
		g.Bytes, g.MaxBytes, g.Messages, busy.Bytes, busy.Messages, sec(fl.First), sec(fl.Median), sec(fl.Converged), fl.Moved, fl.Gainers, fl.Scans)
	return nil
}

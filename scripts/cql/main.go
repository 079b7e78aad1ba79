// Command cql runs CQL statements against a Cassandra cluster, for the
// benchmark scripts: scripts/bench-cassandra.sh empties a keyspace's tables
// between runs with it. Cassandra's own cqlsh is Python and is not among
// the Maven jars scripts/cassandra.sh runs the nodes from.
//
//	go run ./scripts/cql -hosts 127.0.0.2:9042 'DROP KEYSPACE IF EXISTS x'
//	go run ./scripts/cql -hosts 127.0.0.2:9042 -truncate mail -keep schema_version
//
// -truncate KS truncates every table of keyspace KS but those named by
// -keep (comma-separated); a missing keyspace is nothing to truncate.
package main

import (
	"flag"
	"fmt"
	"os"
	"slices"
	"strings"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"
)

// requestTimeout bounds one statement: a TRUNCATE flushes and snapshots
// the table on every node first, seconds on busy shared cores.
const requestTimeout = 2 * time.Minute

func main() {
	hosts := flag.String("hosts", "127.0.0.1:9042", "comma-separated host:port of the cluster's nodes")
	truncate := flag.String("truncate", "", "truncate every table of this keyspace")
	keep := flag.String("keep", "", "with -truncate: comma-separated tables left alone")
	flag.Parse()
	if err := run(strings.Split(*hosts, ","), *truncate, strings.Split(*keep, ","), flag.Args()); err != nil {
		fmt.Fprintln(os.Stderr, "cql:", err)
		os.Exit(1)
	}
}

func run(hosts []string, truncate string, keep, stmts []string) error {
	cl := gocql.NewCluster(hosts...)
	cl.Timeout = requestTimeout
	cl.ConnectTimeout = requestTimeout
	cl.Consistency = gocql.All
	s, err := cl.CreateSession()
	if err != nil {
		return fmt.Errorf("connecting to %s: %w", strings.Join(hosts, ","), err)
	}
	defer s.Close()
	if truncate != "" {
		iter := s.Query("SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?", truncate).Iter()
		var name string
		for iter.Scan(&name) {
			if !slices.Contains(keep, name) {
				stmts = append(stmts, "TRUNCATE "+truncate+"."+name)
			}
		}
		if err := iter.Close(); err != nil {
			return fmt.Errorf("listing the tables of %s: %w", truncate, err)
		}
	}
	for _, q := range stmts {
		if err := s.Query(q).Exec(); err != nil {
			return fmt.Errorf("%s: %w", q, err)
		}
	}
	return nil
}

// Command keyspacepool hands clean Cassandra keyspaces to the end-to-end
// tests run on the Cassandra store (tests/e2e/conftest.py, QUILL_STORE=
// cassandra): one keyspace per test, never one another test has used
// without emptying it first.
//
// Making a keyspace and its tables is a dozen schema changes, 3-5 s on one
// node of two busy cores; the suite has about 150 tests. So the pool makes
// keyspaces ahead (cassandra.Open, the schema every quill node makes) and
// takes back each one a test is done with: every table but schema_version
// is truncated (a TRUNCATE drops every row whatever its write timestamp,
// HLC stamps included; about 0.5 s for all of them), and only then is the
// keyspace handed out again. A test therefore starts on tables as empty as
// a new keyspace's, with the schema already made.
//
// Protocol, one line each way on stdin/stdout (the conftest fixture is the
// only client):
//
//	take        -> NAME      a clean keyspace (waits for one if none is ready)
//	give NAME   -> ok        emptied in the background, then ready again
//
// What it does goes to stderr, with timings. At the end of stdin the pool exits; with --drop it first drops every
// keyspace it made (for a cluster that outlives the run).
package main

import (
	"bufio"
	"context"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"time"

	gocql "github.com/apache/cassandra-gocql-driver/v2"

	"github.com/quillmail/quill/internal/cassandra"
)

const (
	// requestTimeout bounds one TRUNCATE or DROP: Cassandra flushes and
	// snapshots the table first, seconds on a busy node.
	requestTimeout = 60 * time.Second
	// openTimeout bounds making one keyspace (as core.New's
	// cassandraOpenTimeout does for a quill node).
	openTimeout = 3 * time.Minute
	// makeAttempts: on two cores other tests keep busy, a schema change
	// can outlast the driver's request timeout; the statements are
	// idempotent, so making the keyspace is simply tried again.
	makeAttempts = 3
)

// pool is the keyspaces made so far and which are ready.
type pool struct {
	hosts  []string
	prefix string
	spare  int // keyspaces kept ready ahead of the takes
	most   int // keyspaces made at most

	mu       sync.Mutex
	cond     *sync.Cond
	ready    []string
	made     []string // named so far, made or being made
	making   int      // being made
	emptying int      // given back, being emptied
	taken    map[string]bool
	failure  error // making or emptying a keyspace failed: every take fails
	s        *gocql.Session
}

func main() {
	hosts := flag.String("cassandra", "", "host:port,... of the cluster")
	prefix := flag.String("prefix", "e2e", "keyspace names are PREFIX_1, PREFIX_2, ...")
	spare := flag.Int("spare", 1, "keyspaces kept ready ahead")
	most := flag.Int("most", 8, "keyspaces made at most; takes then wait for one given back")
	drop := flag.Bool("drop", false, "drop every keyspace made at the end")
	flag.Parse()
	log.SetFlags(0)
	log.SetPrefix("keyspacepool: ")
	if *hosts == "" {
		log.Fatal("--cassandra is required")
	}
	c := gocql.NewCluster(strings.Split(*hosts, ",")...)
	c.Timeout = requestTimeout
	s, err := c.CreateSession()
	if err != nil {
		log.Fatalf("cassandra %s: connect: %v", *hosts, err)
	}
	defer s.Close()
	p := &pool{hosts: strings.Split(*hosts, ","), prefix: *prefix, spare: *spare, most: *most, s: s, taken: map[string]bool{}}
	p.cond = sync.NewCond(&p.mu)
	p.mu.Lock()
	p.fill()
	p.mu.Unlock()

	in := bufio.NewScanner(os.Stdin)
	out := bufio.NewWriter(os.Stdout)
	for in.Scan() {
		cmd, arg, _ := strings.Cut(strings.TrimSpace(in.Text()), " ")
		switch cmd {
		case "take":
			name, err := p.take()
			if err != nil {
				fmt.Fprintf(out, "error %v\n", err)
			} else {
				fmt.Fprintln(out, name)
			}
		case "give":
			if err := p.give(arg); err != nil {
				fmt.Fprintf(out, "error %v\n", err)
			} else {
				fmt.Fprintln(out, "ok")
			}
		default:
			fmt.Fprintf(out, "error unknown command %q\n", cmd)
		}
		out.Flush()
	}
	if *drop {
		p.mu.Lock()
		for p.making+p.emptying > 0 {
			p.cond.Wait()
		}
		made := p.made
		p.mu.Unlock()
		for _, ks := range made {
			if err := s.Query("DROP KEYSPACE IF EXISTS " + ks).Exec(); err != nil {
				log.Printf("drop %s: %v", ks, err)
			}
		}
	}
}

// fill starts making keyspaces until spare ones are ready or on the way.
// Called with p.mu held.
func (p *pool) fill() {
	for len(p.ready)+p.making+p.emptying < p.spare && len(p.made) < p.most {
		p.making++
		name := fmt.Sprintf("%s_%d", p.prefix, len(p.made)+1)
		p.made = append(p.made, name)
		go p.make(name)
	}
}

func (p *pool) make(name string) {
	began := time.Now()
	var err error
	for try := 1; try <= makeAttempts; try++ {
		ctx, cancel := context.WithTimeout(context.Background(), openTimeout)
		var st *cassandra.Store
		st, err = cassandra.Open(ctx, cassandra.Config{Hosts: p.hosts, Keyspace: name})
		cancel()
		if err == nil {
			st.Close()
			log.Printf("made %s in %.1fs", name, time.Since(began).Seconds())
			break
		}
		log.Printf("make %s, try %d of %d: %v", name, try, makeAttempts, err)
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.making--
	if err != nil {
		p.failure = fmt.Errorf("make keyspace %s: %w", name, err)
	} else {
		p.ready = append(p.ready, name)
	}
	p.cond.Broadcast()
}

// take hands out a ready keyspace, making more ahead.
func (p *pool) take() (string, error) {
	began := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for len(p.ready) == 0 && p.failure == nil {
		p.fill()
		p.cond.Wait()
	}
	if p.failure != nil {
		return "", p.failure
	}
	name := p.ready[0]
	p.ready = p.ready[1:]
	p.taken[name] = true
	p.fill()
	log.Printf("took %s after %.1fs", name, time.Since(began).Seconds())
	return name, nil
}

// give empties a keyspace a test is done with, in the background, and
// makes it ready again.
func (p *pool) give(name string) error {
	p.mu.Lock()
	if !p.taken[name] {
		p.mu.Unlock()
		return fmt.Errorf("keyspace %q was not taken from this pool", name)
	}
	delete(p.taken, name)
	p.emptying++
	p.mu.Unlock()
	go func() {
		began := time.Now()
		err := p.empty(name)
		log.Printf("emptied %s in %.1fs", name, time.Since(began).Seconds())
		p.mu.Lock()
		defer p.mu.Unlock()
		p.emptying--
		if err != nil {
			p.failure = fmt.Errorf("empty keyspace %s: %w", name, err)
		} else {
			p.ready = append(p.ready, name)
		}
		p.cond.Broadcast()
	}()
	return nil
}

// empty truncates every table of the keyspace except schema_version (the
// migrations stay done). The tables are listed from the schema, so tables
// added by later migrations are emptied too.
func (p *pool) empty(ks string) error {
	it := p.s.Query(`SELECT table_name FROM system_schema.tables WHERE keyspace_name = ?`, ks).Iter()
	var tables []string
	var t string
	for it.Scan(&t) {
		if t != "schema_version" {
			tables = append(tables, t)
		}
	}
	if err := it.Close(); err != nil {
		return fmt.Errorf("list tables: %w", err)
	}
	for _, t := range tables {
		if err := p.s.Query(`TRUNCATE ` + ks + `.` + t).Exec(); err != nil {
			return fmt.Errorf("truncate %s: %w", t, err)
		}
	}
	return nil
}

# Quill: one binary, its unit tests, and end-to-end tests that drive real
# clients (Python smtplib/poplib/imaplib, curl, mbsync, fetchmail) against a
# real quill process.

GO ?= go
# bash for PIPESTATUS in faults-long
SHELL := /bin/bash
BIN := bin/quill

.PHONY: build run test deps unit e2e e2e-cassandra e2e-large fuzz faults faults-long rebalance availability island-move repair-bench testssl vet proto clean cassandra-3 cassandra-3-stop cassandra-3-test cassandra-large migrate-large cassandra-faults cassandra-serve-faults cassandra-bench bench-cassmail bench-memory bench-porcupine bench-disk bench-scale bench-sim bench-placement bench-failover

build:
	$(GO) build -o $(BIN) ./cmd/quill

run: build
	./$(BIN) serve

# vet also checks that the generated RPC code is what proto/ generates.
vet:
	gofmt -l . | tee /dev/stderr | (! read)
	$(GO) vet ./...
	cd third_party/imapserver && $(GO) vet ./...
	scripts/proto.sh check

# Regenerates internal/nodepb from proto/quill/v1 (pinned protoc plugins).
proto:
	scripts/proto.sh

# Unit tests, then the cluster tests alone: they run several quill processes
# each and measure failure detection, so they get the machine to themselves.
unit:
	$(GO) test -count=1 ./cmd/... ./internal/...
	cd third_party/imapserver && $(GO) test -count=1 ./...
	# The cluster tests that mostly wait (t.Parallel: the island tests,
	# ACME, two replace-after tests) run together once the others are done.
	$(GO) test -count=1 -p 1 -parallel 8 -timeout 40m ./tests/cluster/

# The end-to-end suite runs in three pytest-xdist workers (the tests wait on
# clients and deadlines more than they compute; each has its own ports and
# directories), whole modules to one worker.
E2E_WORKERS ?= 3
E2E_ARGS := -q -n $(E2E_WORKERS) --dist loadscope --durations=15

# The tests that need a Cassandra node (marked `cassandra`) run in
# e2e-cassandra, where one is up for the run.
e2e: build
	QUILL_BIN=$(CURDIR)/$(BIN) python3 -m pytest tests/e2e $(E2E_ARGS) -m 'not cassandra'

# The same suite with every node on the Cassandra store (issue 15): one
# Cassandra node for the run, a clean keyspace per test (tests/e2e/
# keyspacepool); tests of the native store's own files are skipped, each
# with its reason (docs/cassandra.md, "The end-to-end suite on Cassandra").
e2e-cassandra: build
	QUILL_E2E_STORE=cassandra QUILL_BIN=$(CURDIR)/$(BIN) python3 -m pytest tests/e2e $(E2E_ARGS) -rs

# A 50,000-message INBOX through imaplib (tests/e2e/test_large_mailbox.py,
# about 2 minutes): the answers are checked, each command's time printed.
e2e-large: build
	QUILL_LARGE_E2E=1 QUILL_BIN=$(CURDIR)/$(BIN) python3 -m pytest tests/e2e/test_large_mailbox.py -q -s

deps:
	scripts/test-deps.sh

test: deps vet unit e2e e2e-cassandra

# Short fuzzing of every parser; `make fuzz FUZZTIME=10m` for longer.
FUZZTIME ?= 30s
fuzz:
	$(GO) test -run='^$$' -fuzz=FuzzParseCommand -fuzztime=$(FUZZTIME) ./internal/pop3/
	$(GO) test -run='^$$' -fuzz=FuzzSession -fuzztime=$(FUZZTIME) ./internal/pop3/
	$(GO) test -run='^$$' -fuzz=FuzzSTLS -fuzztime=$(FUZZTIME) ./internal/pop3/
	for f in FuzzCommands FuzzStartTLS FuzzMessage FuzzAddressList FuzzMatchMailbox FuzzResolveSets; do \
		$(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) ./internal/imap/ || exit 1; done
	$(GO) test -run='^$$' -fuzz=FuzzPush -fuzztime=$(FUZZTIME) ./internal/replica/
	$(GO) test -run='^$$' -fuzz=FuzzMessageRecord -fuzztime=$(FUZZTIME) ./internal/mailbox/
	$(GO) test -run='^$$' -fuzz=FuzzExchange -fuzztime=$(FUZZTIME) ./internal/saslsrv/
	$(GO) test -run='^$$' -fuzz=FuzzParseSTSPolicy -fuzztime=$(FUZZTIME) ./internal/queue/
	$(GO) test -run='^$$' -fuzz=FuzzHeaderHandling -fuzztime=$(FUZZTIME) ./internal/mailauth/
	for f in FuzzParseMaildirName FuzzMaildirFolderName FuzzMbox; do \
		$(GO) test -run='^$$' -fuzz="^$$f$$" -fuzztime=$(FUZZTIME) ./internal/migrate/ || exit 1; done

# The long fault runs under a delivery stream: SIGKILL and SIGSTOP of random
# nodes on loopback; then (as root, else skipped) kill -9, SIGSTOP, network
# partitions, full disks and wiped nodes of nodes in network namespaces. Each
# ends with a check that no acknowledged message is missing. Then 50 clean
# restarts under load (CI runs 20: docs/reliability.md).
FAULTS ?= 40
TERM_RESTARTS ?= 50
faults:
	QUILL_FAULTS=$(FAULTS) $(GO) test -count=1 -timeout 60m -run 'TestFaults(LoseNoAcknowledgedMail|Netns)$$' -v ./tests/cluster/
	QUILL_TERM_RESTARTS=$(TERM_RESTARTS) $(GO) test -count=1 -timeout 30m -run 'TestCleanRestartsUnderLoad$$' -v ./tests/cluster/

# The rebalancer's figure (issue 17 item 6, docs/reliability.md): three
# nodes hold 30,000 messages, a fourth joins, and every node must hold
# 20-30% of the copies within the rebalance time, every message read once.
REBALANCE_MESSAGES ?= 30000
rebalance:
	QUILL_REBALANCE_MESSAGES=$(REBALANCE_MESSAGES) QUILL_REBALANCE_FIGURE=1 $(GO) test -count=1 -timeout 30m -run 'TestRebalanceGivesAJoiningNodeItsShare$$' -v ./tests/cluster/

# Archipelago's availability figure (issue 17 item 2, docs/reliability.md):
# n = 2, 3, 4 islands of two nodes, one island killed during a stream of
# deliveries and reads, beside the same nodes without islands and two
# nodes of different islands killed (~15 min).
availability:
	QUILL_AVAILABILITY=1 QUILL_AVAILABILITY_OUT=$(CURDIR)/availability.md $(GO) test -count=1 -timeout 60m -run 'TestIslandAvailability$$' -v ./tests/cluster/

# Islands: a node that changes island has its users' copies moved home by
# repair, the path an island table change takes (TestIslandChangeMovesMailHome).
island-move:
	QUILL_ISLAND_MOVE=1 $(GO) test -count=1 -timeout 10m -run 'TestIslandChangeMovesMailHome$$' -v ./tests/cluster/

# The long run (about two hours, root): 1,000 faults of every kind (kill -9,
# SIGSTOP, clean restarts, bursts of them, partitions, full disks, wipes) on
# nodes in network namespaces; the checker reads every mailbox through every
# node 60 s after the last fault: 0 lost, 0 hidden. The log is kept in
# faults-long.log, and the nodes' logs in faults-long-logs/ if it fails;
# docs/reliability.md records the figures and seeds.
faults-long:
	QUILL_TEST_LOGS=$(CURDIR)/faults-long-logs QUILL_FAULTS=1000 $(GO) test -count=1 -timeout 240m -run 'TestFaultsNetns$$' -v ./tests/cluster/ 2>&1 | tee faults-long.log; test $${PIPESTATUS[0]} -eq 0

# How fast repair gives a wiped node's objects their second copy again
# (a few minutes): REPAIR_OBJECTS messages on 3 nodes, one wiped;
# docs/benchmarks.md records the figures.
REPAIR_OBJECTS ?= 60000
repair-bench:
	QUILL_REPAIR_OBJECTS=$(REPAIR_OBJECTS) $(GO) test -count=1 -timeout 40m -run 'TestRepairThroughput$$' -v ./tests/cluster/

# Flat costs from 1 to 16 nodes (issue 16): 1, 2, 4, 8 and 16 real nodes
# under the same SMTP load, per-message RPC calls, bytes and fsyncs and
# per-node gossip (about 6 minutes), then the 64-256-node simulation
# (bench-sim, about 6 minutes); docs/benchmarks.md records the figures.
bench-scale: build
	scripts/bench-scale.sh $(CURDIR)/$(BIN) /tmp/quill-bench-scale
	$(BIN) simulate --nodes 64,128,256

bench-sim: build
	$(BIN) simulate --nodes 64,128,256

# testssl.sh against every TLS listener of a fresh node (about 9 minutes);
# docs/security.md records the result.
testssl: build
	bash scripts/testssl.sh $(CURDIR)/$(BIN) /tmp/quill-testssl

# Apache Cassandra for the Cassandra store (issue 15, docs/cassandra.md):
# three nodes on 127.0.0.2-4 (CQL port 9042) as one cluster, from Maven
# Central's jars on Java 17 (scripts/cassandra.sh); started one after the
# other, about 30 s each. cassandra-3-stop stops them; their data stays in
# CASSANDRA3_DIR until removed.
CASSANDRA3_DIR ?= /tmp/quill-cassandra-3
CASSANDRA3_HOSTS := 127.0.0.2:9042,127.0.0.3:9042,127.0.0.4:9042
cassandra-3:
	scripts/cassandra.sh cluster-start --dir $(CASSANDRA3_DIR) --nodes 3

cassandra-3-stop:
	scripts/cassandra.sh cluster-stop --dir $(CASSANDRA3_DIR)

# The store's tests on a fresh three-node cluster, replication factor 3 at
# QUORUM, the 100,000-message mailbox included (about 6 minutes).
cassandra-3-test:
	rm -rf $(CASSANDRA3_DIR)
	$(MAKE) cassandra-3
	QUILL_CASSANDRA_HOSTS=$(CASSANDRA3_HOSTS) QUILL_CASSANDRA_RF=3 QUILL_CASSANDRA_LARGE=1 \
		$(GO) test -count=1 -timeout 30m -v ./internal/cassandra/; status=$$?; \
		$(MAKE) cassandra-3-stop; exit $$status

# A 100,000-message mailbox on one node the test starts (about 1 minute).
cassandra-large:
	QUILL_CASSANDRA_LARGE=1 $(GO) test -count=1 -timeout 20m -run 'TestLargeMailbox$$' -v ./internal/cassandra/

# quill migrate of 10,000 messages into a Cassandra node the test starts,
# again, and back (docs/benchmarks.md, "quill migrate"; about 3 minutes).
MIGRATE_LARGE ?= 10000
migrate-large:
	QUILL_MIGRATE_LARGE=$(MIGRATE_LARGE) $(GO) test -count=1 -timeout 30m -run 'TestMigrateLarge$$' -v ./internal/cassandra/

# kill -9 of one Cassandra node of three (RF 3) under a stream of
# deliveries to the store, at QUORUM/QUORUM, ONE/ONE and ONE/QUORUM; every
# acknowledged message is read back with the node down, after its return
# and after nodetool repair (tests/cassandra, about 9 minutes; the nodes
# are started and stopped by the test). docs/cassandra.md, "Faults".
cassandra-faults:
	QUILL_CASSANDRA_FAULTS=1 $(GO) test -count=1 -timeout 40m -run 'TestCassandraFaults$$' -v ./tests/cassandra/

# The same faults under quill serve --store cassandra: three Cassandra
# nodes (RF 3) under three quill nodes of one cluster, a delivery stream
# and an IMAP session's changes through them; kill -9 of a Cassandra node
# at QUORUM/QUORUM and at ONE/ONE (checks as above, through the quill
# nodes over IMAP), then kill -9 of a quill node, its directory wiped
# (tests/cluster, 15-25 minutes; not in CI: the cluster tests of make
# test skip it). SERVE_FAULTS_SEED=N replays another run,
# SERVE_FAULTS_RUN=QUORUM (or ONE, quill-kill) runs one part.
# docs/cassandra.md, "Faults under quill serve".
SERVE_FAULTS_SEED ?= 15
SERVE_FAULTS_RUN ?= .
cassandra-serve-faults:
	QUILL_CASSANDRA_SERVE_FAULTS=1 QUILL_CASSANDRA_SERVE_FAULTS_SEED=$(SERVE_FAULTS_SEED) $(GO) test -count=1 -timeout 90m -run 'TestCassandraServeFaults$$/$(SERVE_FAULTS_RUN)' -v ./tests/cluster/

# The CassMail experiments at the store level: messages of 2-20 KB and
# 200 KB-2 MB written through the store by concurrent writers on one node
# (RF 1) and on three (RF 1/2/3, ONE/QUORUM/ALL), 10 s a row, three rounds,
# medians reported (about 27 minutes; tests/cassandra). docs/benchmarks.md,
# "Cassandra store".
cassandra-bench:
	QUILL_CASSANDRA_BENCH=1 $(GO) test -count=1 -timeout 60m -run 'TestStoreThroughput$$' -v ./tests/cassandra/

# The CassMail experiments through quill serve (issue 15): SMTP delivery
# measured with Postal and quill bench, messages of 2-20 KB and 200 KB-2 MB,
# native Quill, Postfix into Maildir, and Quill on one and on three
# Cassandra nodes at RF 1/2/3 and ONE/QUORUM/ALL, in interleaved rounds
# (scripts/bench-cassandra.sh; about 40 minutes, as root for Postfix).
# docs/benchmarks.md, "CassMail experiments".
bench-cassmail:
	scripts/bench-cassandra.sh

# Single-node SMTP against Postfix's smtp-sink (issue 16, goal 1):
# smtp-source's 4.8 KB messages at 20 and 100 sessions, interleaved rounds;
# msg/s, the ratio to the sink and server CPU per message
# (scripts/bench-smtp-sink.sh; about 5 minutes). docs/benchmarks.md, "Issue
# 16: SMTP against smtp-sink".
.PHONY: bench-smtp
bench-smtp: build
	scripts/bench-smtp-sink.sh $(BIN)

# One node's memory with 1,000 users and 100,000 messages (issue 16, goal
# 7): RSS, Go heap and Pebble's memory after each phase, and a heap
# profile (scripts/bench-memory.sh; about 10 minutes on an idle machine).
# docs/benchmarks.md, "Issue 16: memory and the Porcupine workload".
bench-memory: build
	scripts/bench-memory.sh $(CURDIR)/$(BIN)

# The Porcupine workload against Quill and Postfix + Dovecot (static and
# argon2id passdb, default and login performance mode), interleaved
# (scripts/bench-porcupine.sh; as root, about 8 minutes a round;
# ROUNDS=3 for more). Same section of docs/benchmarks.md.
bench-porcupine: build
	scripts/bench-porcupine.sh $(CURDIR)/$(BIN)

# Issue 16, goal 3: Quill's disk footprint beside Postfix's Maildir for
# 10,000 and 100,000 messages, then Pebble's write amplification over a
# 1-hour delivery run with deletes (scripts/bench-disk.sh; as root for
# Postfix; WAMP_DURATION=10m for a shorter run). docs/benchmarks.md,
# "Issue 16: disk footprint and the store path".
WAMP_DURATION ?= 1h
bench-disk: build
	QUILL=$(BIN) scripts/bench-disk.sh footprint 10000 100000
	QUILL=$(BIN) scripts/bench-disk.sh wamp $(WAMP_DURATION)

# Porcupine Fig. 10/11 redone (issue 17): a 4-node cluster under Zipf
# users with the static, random and dynamic placement policies of quill
# serve --placement, every node alike and then node 4 slowed (--disk-delay);
# fresh nodes per run, the variants interleaved round by round
# (scripts/bench-placement.sh, about 75 s a run, 12 runs at ROUNDS=2).
# docs/benchmarks.md, "Issue 17: Porcupine's placement and failure
# experiments"; PLOT redraws the figure.
bench-placement: build
	ROUNDS=$${ROUNDS:-2} PLOT=$${PLOT:-docs/img/porcupine-fig10-11.svg} scripts/bench-placement.sh $(CURDIR)/$(BIN)

# Porcupine Fig. 12-14 redone (issue 17): throughput second by second
# through a kill -9 of one node of four and its restart, with the instants
# of the membership change and the new user maps (scripts/bench-failover.sh,
# about 3 minutes). Same section of docs/benchmarks.md.
bench-failover: build
	PLOT=$${PLOT:-docs/img/porcupine-fig12-14.svg} scripts/bench-failover.sh $(CURDIR)/$(BIN)

clean:
	rm -rf bin

// Package core assembles the part of a Quill node below the protocol
// servers, the managers of Porcupine Fig. 2: the store, the user database,
// the mailbox manager, the user manager (with the mailbox writers), the
// membership manager, the load balancer, the RPC manager and the proxies'
// shared half. internal/node adds the SMTP, POP3, IMAP and admin listeners;
// tests of a protocol server use a Core alone.
package core

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	"github.com/quillmail/quill/internal/backup"
	"github.com/quillmail/quill/internal/balance"
	"github.com/quillmail/quill/internal/cassandra"
	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/clusterwide"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/islandmgr"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/metrics"
	"github.com/quillmail/quill/internal/proxy"
	"github.com/quillmail/quill/internal/queue"
	"github.com/quillmail/quill/internal/rebalance"
	"github.com/quillmail/quill/internal/replica"
	"github.com/quillmail/quill/internal/rpc"
	"github.com/quillmail/quill/internal/store"
	"github.com/quillmail/quill/internal/tlscert"
	"github.com/quillmail/quill/internal/userdb"
	"github.com/quillmail/quill/internal/usermgr"
	"github.com/quillmail/quill/internal/writer"
	"google.golang.org/grpc"
)

// LoadNodeID returns the node id kept in the data directory, generating it
// the first time.
func LoadNodeID(dataDir string) (cluster.NodeID, error) {
	path := filepath.Join(dataDir, "node.id")
	b, err := os.ReadFile(path)
	if err == nil {
		return cluster.NodeID(strings.TrimSpace(string(b))), nil
	}
	if !errors.Is(err, os.ErrNotExist) {
		return "", fmt.Errorf("node id %s: %w", path, err)
	}
	var r [6]byte
	rand.Read(r[:])
	id := "n-" + hex.EncodeToString(r[:])
	if err := writeFileSync(path, []byte(id+"\n")); err != nil {
		return "", fmt.Errorf("node id %s: %w", path, err)
	}
	return cluster.NodeID(id), nil
}

// writeFileSync writes a small file and fsyncs it, so an identity made once
// survives a crash right after.
func writeFileSync(path string, data []byte) error {
	f, err := os.OpenFile(path, os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return err
	}
	if _, err := f.Write(data); err != nil {
		f.Close()
		return err
	}
	if err := f.Sync(); err != nil {
		f.Close()
		return err
	}
	return f.Close()
}

// Disk-full detection for the load balancer (Porcupine §5: load is pending
// disk operations plus a disk-full flag).
const (
	// diskFullBelow is the free space under which a node takes no new
	// mail: room left for the store's compactions and for the mail it
	// already accepted.
	diskFullBelow = 256 << 20
	// diskCheckInterval is how often free space is read.
	diskCheckInterval = 2 * time.Second
	// The store refuses every write that would leave less than
	// MinFree/floorShare free, and holds a ballast of MinFree/ballastShare
	// it frees when that floor is reached (store.Reserve): room for what
	// is already under way, since Pebble exits on a failed log write. The
	// ballast is under half of MinFree less the floor, so freeing it never
	// lifts the node out of its critical state.
	floorShare   = 8
	ballastShare = 4
	ballastFile  = "ballast"
)

// aliveInterval is how often the node notes in its data directory that it
// is alive, so a node that was away longer than the update log keeps
// entries for (a week) knows at its next start that it must rejoin as a new
// node (Porcupine §4.4).
const aliveInterval = time.Minute

// A node notices that its process stood still — SIGSTOP, a paused VM, a
// machine swapping — by a clock that ticks every stallTick: a gap longer
// than stallAfter (well under the ~5 s the others take to declare a node
// dead) means others may have managed its buckets meanwhile while its own
// view of the membership never changed, so its soft state is rebuilt.
const (
	stallTick  = 250 * time.Millisecond
	stallAfter = 2 * time.Second
)

// Core is the part of a node below the protocol servers: store, managers,
// membership, RPC and the proxies' shared half. Tests use it alone; Start
// adds the listeners.
type Core struct {
	Opts    Options
	ID      cluster.NodeID
	Boot    uint64
	DB      *store.DB
	Boxes   *mailbox.Manager
	Users   *usermgr.Manager
	Writers *writer.Manager
	Placer  *balance.Placer
	Proxy   *proxy.Proxy
	Members *cluster.Membership
	Peers   *cluster.Peers
	RPC     *rpc.Server
	Loads   *balance.Tracker
	Repl    *replica.Manager
	// Islands changes the bucket→island table (Archipelago §4.1; native
	// store only, nil on Cassandra).
	Islands *islandmgr.Manager
	// Rebal moves mail from over-full nodes to under-full ones (native
	// store only; nil on Cassandra).
	Rebal *rebalance.Rebalancer
	// notice handles the short messages other nodes broadcast
	// (SetNoticeHandler).
	notice atomic.Pointer[func([]byte)]
	// Wide holds the objects every node keeps (TLS certificates, DKIM
	// keys, inbound policies, domains, aliases): replicas in the data
	// directory, or on Cassandra the keyspace's table (clusterwide.Shared).
	Wide clusterwide.Objects
	// Queue is the outbound queue: its entries held here, and the runner
	// the node starts (queue.Queue.Start).
	Queue *queue.Queue
	// Cass is the Cassandra store holding mail and profiles (Options.
	// Cassandra), nil on the native store.
	Cass *cassandra.Store
	// Backup takes this node's backups (a Pebble checkpoint and the data
	// directory's files) for the admin API and for other nodes' (RPC).
	Backup *backup.Server
	log    *slog.Logger
	rpcLn  net.Listener
	stop   chan struct{}
	full   atomic.Bool
	// critical: under half of MinFree is free; the node then refuses new
	// message content even as a replica (replica.Manager.SetRoom).
	critical atomic.Bool
	dataDir  string
}

// DiskFull reports whether the data directory's file system has less than
// diskFullBelow free.
func (c *Core) DiskFull() bool { return c.full.Load() }

func (c *Core) checkDisk() {
	free, err := store.FreeBytes(c.dataDir)
	if err != nil {
		return
	}
	if free >= c.Opts.MinFree {
		c.DB.RestoreBallast(c.Opts.MinFree)
	}
	full := free < c.Opts.MinFree
	critical := free < c.Opts.MinFree/2
	fullChanged := full != c.full.Swap(full)
	criticalChanged := critical != c.critical.Swap(critical)
	if fullChanged || criticalChanged {
		c.log.Warn("disk space", "data", c.dataDir, "full", full, "critical", critical, "free_bytes", free)
	}
}

// Options configure a node's managers.
type Options struct {
	DataDir string
	// ClusterAddr empty makes a cluster of one, with no gossip and no RPC
	// listener.
	ClusterAddr string
	Join        []string
	Log         *slog.Logger
	// SubaddressSeparator splits user+tag@ (RFC 5233); empty: none.
	SubaddressSeparator string
	// MinFree is the free space under which the node declares its disk
	// full (0: diskFullBelow).
	MinFree int64
	// Replicas and WritePolicy are the defaults for users who set none
	// (0 and "": 2 and one, as Porcupine).
	Replicas    int
	WritePolicy replica.Policy
	// Spread is over how many nodes a user's mail may spread, for users
	// who set none (0: balance.DefaultSpread), Porcupine §5.
	Spread int
	// ReplaceAfter is how long a node may be away before its replicas are
	// made elsewhere; LogMaxAge how long update log entries wait for an
	// absent node (0: the replica package's defaults).
	ReplaceAfter time.Duration
	LogMaxAge    time.Duration
	// RebalanceRate is how many messages per second the node moves to
	// under-full nodes when it holds more than its share (0: none; it
	// still gossips what it holds, so the others can send it mail).
	RebalanceRate int
	// ClockSkew shifts this node's clock, to test that skew loses no
	// update (BLUEPRINT invariant 6).
	ClockSkew time.Duration
	// Register adds the node's own services (the SNS pools) to the RPC
	// server before it serves.
	Register func(grpc.ServiceRegistrar)
	// Cassandra, when set, keeps mail and profiles in Apache Cassandra
	// (issue 15, docs/cassandra.md) instead of the native store: the
	// writers store through cassandra.WriterStorage, the user manager
	// reads and writes profiles there, the proxies deliver to it and read
	// bodies from it, the clusterwide objects are its table
	// (clusterwide.Shared) and the outbound queue is kept there
	// (queue.Shared): nothing hard stays in the data directory.
	Cassandra *cassandra.Config
	// AuditInterval is how often the writers' anti-entropy audit runs
	// (usermgr/audit.go); 0 is usermgr.DefaultAuditInterval, negative
	// turns it off (tests of what it would hide).
	AuditInterval time.Duration
	// TextIndexDelay is how long a stored message waits before the text
	// index reads it (0: at once; quill serve: mailbox.DefaultTextIndexDelay).
	TextIndexDelay time.Duration
	// Island is the node's island (internal/island; "": island.Default).
	Island string
	// Placement and DiskDelay are experiments' settings (Porcupine §6.3,
	// docs/benchmarks.md): how new mail is placed ("": balance.Dynamic)
	// and a delay on every sync of the store's log (a slow disk).
	Placement balance.Policy
	DiskDelay time.Duration
}

// DefaultReplicas is how many copies of each message a cluster keeps unless
// told otherwise (Porcupine's two-way replication).
const DefaultReplicas = 2

// cassandraOpenTimeout bounds opening the Cassandra store at start: its
// connection and the keyspace's migrations, which wait up to a minute for
// the schema to reach every node (cassandra.schemaAgreementWait), and
// reading the clusterwide objects.
const cassandraOpenTimeout = 3 * time.Minute

// New opens the data directory and starts the managers.
func New(o Options) (*Core, error) {
	if o.MinFree <= 0 {
		o.MinFree = diskFullBelow
	}
	if o.Replicas <= 0 {
		o.Replicas = DefaultReplicas
	}
	if o.WritePolicy == "" {
		o.WritePolicy = replica.One
	}
	if o.LogMaxAge <= 0 {
		o.LogMaxAge = replica.DefaultMaxAge
	}
	if o.ReplaceAfter <= 0 {
		o.ReplaceAfter = replica.DefaultReplaceAfter
	}
	dataDir, clusterAddr, join, log := o.DataDir, o.ClusterAddr, o.Join, o.Log
	if err := os.MkdirAll(dataDir, 0o700); err != nil {
		return nil, fmt.Errorf("data directory %s: %w", dataDir, err)
	}
	if err := renewIfAway(dataDir, o.LogMaxAge, hasPeers(dataDir, clusterAddr, join), log); err != nil {
		return nil, err
	}
	id, err := LoadNodeID(dataDir)
	if err != nil {
		return nil, err
	}
	boot, err := nextBoot(dataDir)
	if err != nil {
		return nil, err
	}
	db, err := store.OpenWith(dataDir, store.Options{SyncDelay: o.DiskDelay})
	if err != nil {
		return nil, err
	}
	db.SetReserve(store.Reserve{Floor: o.MinFree / floorShare, Ballast: o.MinFree / ballastShare,
		BallastPath: filepath.Join(dataDir, ballastFile)}, o.MinFree)
	c := &Core{Opts: o, ID: id, Boot: boot, DB: db, log: log, Loads: balance.NewTracker(), dataDir: dataDir}
	c.checkDisk()
	clock := hlc.NewSkewed(o.ClockSkew)
	c.Boxes = mailbox.New(db)
	c.Boxes.Self, c.Boxes.Log, c.Boxes.TextIndexDelay = id, log, o.TextIndexDelay
	client := rpc.NewClient()
	c.Peers = &cluster.Peers{RPC: client}
	// Below half of MinFree the node refuses message content even as a
	// replica.
	c.Repl, err = replica.New(id, db, clock, log, replica.Options{Peers: c.Peers,
		Room: func() bool { return !c.critical.Load() }, MaxAge: o.LogMaxAge, ReplaceAfter: o.ReplaceAfter})
	if err != nil {
		db.Close()
		return nil, err
	}
	c.Repl.Handle(mailbox.ObjectKind, c.Boxes)
	profiles := userdb.New(db)
	c.Repl.Handle(userdb.ProfileKind, profiles)
	if o.Cassandra == nil {
		wide, err := clusterwide.Open(db, log)
		if err != nil {
			db.Close()
			return nil, err
		}
		c.Wide = wide
		c.Repl.Handle(clusterwide.Kind, wide)
	}
	c.Queue = &queue.Queue{Self: id, Peers: c.Peers, Log: log, Alive: c.AliveIDs,
		Cfg: queue.Config{Replicas: o.Replicas, Policy: o.WritePolicy, TombstoneAge: o.LogMaxAge}}
	var nativeQueue *queue.Replicated
	if o.Cassandra == nil {
		nativeQueue = &queue.Replicated{Self: id, Repl: c.Repl, Peers: c.Peers, Alive: c.AliveIDs, Log: log}
		if nativeQueue.Store, err = queue.Open(id, db, log); err != nil {
			db.Close()
			return nil, err
		}
		c.Repl.Handle(queue.Kind, nativeQueue.Store)
		c.Queue.Storage = nativeQueue
	}
	ucfg := usermgr.Config{Self: id, Users: profiles, Boxes: c.Boxes, Clock: clock, Log: log, Repl: c.Repl, Peers: c.Peers}
	if o.Cassandra != nil {
		ctx, cancel := context.WithTimeout(context.Background(), cassandraOpenTimeout)
		c.Cass, err = cassandra.Open(ctx, *o.Cassandra)
		if err == nil {
			// Every object is loaded before the node serves.
			if c.Wide, err = clusterwide.OpenShared(ctx, c.Cass, log); err != nil {
				c.Cass.Close()
			}
		}
		cancel()
		if err != nil {
			db.Close()
			return nil, err
		}
		ucfg.Shared, ucfg.Storage = c.Cass, cassandra.NewWriterStorage(c.Cass, id, clock, log)
		// The outbound queue is in the keyspace too, each entry run by
		// its bucket's manager (queue.Shared).
		c.Queue.Storage = queue.NewShared(c.Cass, id, c.Repl, c.userMap, log)
	}
	c.Users = usermgr.New(ucfg)
	c.Writers = c.Users.Writers()
	if c.Cass == nil {
		// The native store writes a change to one replica before the
		// client hears OK: the writers' REDO log keeps it until every
		// replica has it. Cassandra's writer storage writes each change
		// at its consistency level before answering, and needs none.
		c.Writers.EnableRedo(db, c.Repl)
	}
	c.Placer = balance.NewPlacer(c.Peers, c.Loads, o.Spread)
	if o.Placement != "" {
		c.Placer.SetPolicy(o.Placement)
	}
	if (o.Placement != "" && o.Placement != balance.Dynamic) || o.DiskDelay > 0 {
		log.Warn("experimental settings in force, for benchmarks only", "placement", o.Placement, "disk_delay", o.DiskDelay)
	}
	if o.Cassandra == nil {
		c.Rebal = rebalance.New(id, c.Boxes, c.Peers, c.Writers, float64(o.RebalanceRate), log)
	}
	if nativeQueue != nil {
		nativeQueue.Placer = c.Placer
	}
	c.Proxy = &proxy.Proxy{Self: id, Users: c.Users, Writers: c.Writers, Boxes: c.Boxes, Peers: c.Peers, Loads: c.Loads,
		Placer: c.Placer, Repl: c.Repl, Replicas: o.Replicas, Policy: o.WritePolicy,
		Domains: wideTables{c}, Separator: o.SubaddressSeparator, Log: log}
	if c.Cass != nil {
		c.Proxy.Shared = c.Cass
	}
	c.RPC = rpc.NewServer(func() rpc.Load { return rpc.Load{Pending: c.Boxes.Pending(), DiskFull: c.DiskFull()} })
	c.Users.Register(c.RPC.Registrar())
	c.Boxes.Register(c.RPC.Registrar())
	c.Repl.Register(c.RPC.Registrar())
	c.Queue.Register(c.RPC.Registrar())
	c.Backup = &backup.Server{Dir: dataDir, DB: db, Node: id, Hold: c.Boxes.HoldFileSweep}
	c.Backup.Register(c.RPC.Registrar())
	if c.Rebal != nil {
		c.Islands = c.newIslandManager(id, o.Island, db, log)
		c.Islands.Register(c.RPC.Registrar())
	}
	if o.Register != nil {
		o.Register(c.RPC.Registrar())
	}

	rpcAddr := ""
	if clusterAddr != "" {
		host, _, err := net.SplitHostPort(clusterAddr)
		if err != nil {
			c.closeStores()
			return nil, fmt.Errorf("cluster address %q: %w", clusterAddr, err)
		}
		l, err := listenRPC(dataDir, host)
		if err != nil {
			c.closeStores()
			return nil, err
		}
		c.rpcLn = l
		rpcAddr = l.Addr().String()
		go c.RPC.Serve(l)
	}
	// The RPC client learns every callee's load from its replies; the
	// balancer reads it (Porcupine §5).
	client.OnLoad = func(addr string, l rpc.Load) {
		if m := c.Members; m != nil {
			for _, mi := range m.Alive() {
				if mi.RPC == addr {
					c.Loads.Observe(mi.ID, balance.Load{Pending: l.Pending, DiskFull: l.DiskFull})
				}
			}
		}
	}
	t0 := time.Now()
	m, err := cluster.StartMembership(cluster.MembershipConfig{
		Self: id, Boot: boot, Island: o.Island, Bind: clusterAddr, RPC: rpcAddr, Seeds: join,
		KnownFile: filepath.Join(dataDir, knownFile),
		Load:      func() (int, bool) { return c.Boxes.Pending(), c.DiskFull() },
		Holds: func() (int64, int, bool) {
			if c.Rebal == nil {
				return 0, 0, false
			}
			return c.Rebal.Holds()
		},
		Domains: c.Users.LocalDomains,
		Wide:    c.Wide.Digest,
		OnNotice: func(b []byte) {
			if h := c.notice.Load(); h != nil {
				(*h)(b)
			}
		},
		Logger: log,
		OnChange: func(old, new *cluster.UserMap) {
			metrics.UserMapChanges.Inc()
			if old != nil {
				metrics.BucketsMoved.Add(float64(len(new.ChangedSince(old))))
			}
			c.Peers.SetMembership(c.Members)
			for _, mi := range c.Members.Alive() {
				c.Loads.Observe(mi.ID, balance.Load{Pending: mi.Load, DiskFull: mi.DiskFull})
			}
			c.Users.Reconcile(*new, c.Members.Alive())
			c.Repl.Kick() // a node may be back: catch it up (§4.4)
		},
		Deferred: true,
	})
	if err != nil {
		c.Close()
		return nil, err
	}
	c.Members = m
	c.Peers.SetMembership(m)
	// The table the node holds is in force before its first user map.
	c.watchIslandTable()
	m.Start()
	c.Repl.Start(ownWriters{c.Writers, c.Queue}, c.Placer)
	if c.Rebal != nil {
		c.Rebal.Start()
	}
	if c.Islands != nil {
		if err := c.Islands.Start(); err != nil {
			c.Close()
			return nil, err
		}
	}
	c.stop = make(chan struct{})
	c.noteAlive()
	go func() {
		t := time.NewTicker(usermgr.RefreshInterval)
		defer t.Stop()
		disk := time.NewTicker(diskCheckInterval)
		defer disk.Stop()
		alive := time.NewTicker(min(aliveInterval, o.LogMaxAge/4))
		defer alive.Stop()

		for {
			select {
			case <-c.stop:
				return
			case <-alive.C:
				c.noteAlive()
			case <-t.C:
				c.Users.Refresh(c.Members.Alive())
			case <-disk.C:
				c.checkDisk()
				c.Loads.Observe(c.ID, balance.Load{Pending: c.Boxes.Pending(), DiskFull: c.DiskFull()})
			}
		}
	}()
	go c.watchStalls()
	go c.syncWide()
	go c.makeInitialIslandTable()
	store := "native"
	if c.Cass == nil {
		// The native store's own upkeep of mail: expunged bodies, the
		// text index beside each fragment, the audit of the writers'
		// views against the fragments. Cassandra holds no fragments.
		go c.sweepExpunged()
		go c.Boxes.RunTextIndex(c.stop)
		if o.AuditInterval == 0 {
			o.AuditInterval = writer.DefaultAuditInterval
		}
		c.Writers.StartAudit(o.AuditInterval)
	} else {
		store = "cassandra keyspace " + c.Cass.Keyspace()
	}
	log.Info("node started", "node", id, "boot", boot, "store", store, "took", time.Since(t0).Round(time.Millisecond))
	return c, nil
}

// expungedSweepInterval is how often the bodies of expunged messages whose
// grace ended (mailbox.ExpungedBodyGrace) are removed.
const expungedSweepInterval = 30 * time.Second

// sweepExpunged removes expunged messages' bodies once their grace ends,
// apart from the main loop (a large Trash emptied takes a while).
func (c *Core) sweepExpunged() {
	t := time.NewTicker(expungedSweepInterval)
	defer t.Stop()
	for {
		// Body files nothing names any more (mailbox/bodyfile.go), first
		// at start: what a crash left behind goes too.
		if _, err := c.Boxes.SweepFiles(time.Now()); err != nil {
			c.log.Warn("body files not all swept; the next sweep tries again", "err", err)
		}
		select {
		case <-c.stop:
			return
		case <-t.C:
			if _, err := c.Boxes.SweepExpunged(time.Now()); err != nil {
				c.log.Warn("expunged bodies not all swept; the next sweep tries again", "err", err)
			}
		}
	}
}

// wideSyncInterval is how often the node compares its clusterwide objects
// with the digests its peers gossip, and catches up those that differ (on
// Cassandra: reads the table again).
const wideSyncInterval = 3 * time.Second

// syncWide runs the clusterwide objects' anti-entropy until the node stops.
func (c *Core) syncWide() {
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go func() {
		<-c.stop
		cancel()
	}()
	t := time.NewTicker(wideSyncInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		var peers []clusterwide.Peer
		for _, mi := range c.Members.Alive() {
			peers = append(peers, clusterwide.Peer{ID: mi.ID, Digest: mi.Wide})
		}
		c.Wide.Tend(ctx, c.Repl, c.ID, peers, time.Now().Add(-c.Opts.LogMaxAge))
	}
}

// ownWriters routes the repair's requests for new replica sets to the
// objects' own writers: queue entries to the queue, messages to the
// users' mailbox writers.
type ownWriters struct {
	*writer.Manager
	q *queue.Queue
}

func (w ownWriters) Rehome(ctx context.Context, user string, moves []replica.Move) error {
	var mail, queued []replica.Move
	for _, mv := range moves {
		if _, ok := queue.IDOf(mv.Object); ok {
			queued = append(queued, mv)
		} else {
			mail = append(mail, mv)
		}
	}
	if len(queued) > 0 {
		if err := w.q.Rehome(ctx, queued); err != nil {
			return err
		}
	}
	if len(mail) > 0 {
		return w.Manager.Rehome(ctx, user, mail)
	}
	return nil
}

// userMap returns the current user map (none before membership starts).
func (c *Core) userMap() cluster.UserMap {
	if c.Members == nil {
		return cluster.UserMap{}
	}
	return c.Members.UserMap()
}

// SetNoticeHandler sets what hears the messages other nodes broadcast
// (cluster.Membership.Broadcast). It must not block.
func (c *Core) SetNoticeHandler(h func([]byte)) { c.notice.Store(&h) }

// AliveIDs returns the nodes alive now, this one included.
func (c *Core) AliveIDs() []cluster.NodeID {
	var out []cluster.NodeID
	for _, mi := range c.Members.Alive() {
		out = append(out, mi.ID)
	}
	if !slices.Contains(out, c.ID) {
		out = append(out, c.ID)
	}
	return out
}

// watchStalls rebuilds the soft state after the process stood still.
func (c *Core) watchStalls() {
	t := time.NewTicker(stallTick)
	defer t.Stop()
	last := time.Now()
	for {
		select {
		case <-c.stop:
			return
		case <-t.C:
		}
		// Monotonic time: it goes on while the process is stopped.
		if gap := time.Since(last); gap > stallAfter {
			c.log.Warn("the node stood still: rebuilding the soft state of its buckets", "for", gap.Round(time.Millisecond))
			metrics.Stalls.Inc()
			// Allocations made before now are from before the stall
			// (none can be made during it, and this tick is the first
			// after it): their deliveries went to whoever stood in.
			c.Users.Rebuild(c.Members.UserMap(), c.Members.Alive(), time.Now())
		}
		last = time.Now()
	}
}

// Timeouts of the orderly shutdown (Close).
const (
	// handoffTimeout bounds handing the node's buckets to their new
	// managers: each waits for the operations in progress on its writers.
	handoffTimeout = 10 * time.Second
	// rpcDrainTimeout bounds the calls other nodes have in progress here
	// (a store, a fragment read): past it they are cancelled, and their
	// callers retry elsewhere.
	rpcDrainTimeout = 5 * time.Second
)

// Close is the orderly shutdown of the managers (the protocol servers are
// stopped before it, internal/node): drop every bucket and fence its
// writers, wait for their operations in progress, tell the cluster the node
// leaves, and hand each bucket to its new manager, with the writers'
// counters, allocations in flight and reservations (a cluster of one gives
// its unused reservations back instead); then let the calls of other nodes
// in progress here finish (cancelling them past rpcDrainTimeout), stop the
// replication manager and the user manager, and only then close the store.
// Anything that still reaches the store after that gets store.ErrClosed,
// never a closed Pebble.
func (c *Core) Close() error {
	if c.stop != nil {
		close(c.stop)
	}
	if c.Islands != nil {
		c.Islands.Close() // a change under way resumes from its record
	}
	if c.Rebal != nil {
		c.Rebal.Close() // no moves while the buckets are handed over
	}
	announce := func() {
		if c.Members != nil {
			c.Members.Leave()
		}
	}
	ctx, cancel := context.WithTimeout(context.Background(), handoffTimeout)
	handed, err := c.Users.Leave(ctx, announce)
	if err != nil {
		c.log.Warn("shutdown: buckets not all handed over", "err", err)
	}
	if !handed {
		c.Writers.Release(ctx)
	}
	cancel()
	announce()
	ctx, cancel = context.WithTimeout(context.Background(), rpcDrainTimeout)
	if left := c.RPC.Drain(ctx); left > 0 {
		c.log.Warn("shutdown: calls of other nodes still running after they were cancelled", "calls", left)
	}
	cancel()
	if c.Queue != nil {
		c.Queue.Close()
	}
	if c.Repl != nil {
		c.Repl.Close()
	}
	c.Users.Close()
	if c.Members != nil {
		c.Members.Shutdown()
	}
	c.Peers.RPC.Close()
	return c.closeStores()
}

// closeStores closes the Cassandra store, if any, and the data directory's.
func (c *Core) closeStores() error {
	if c.Cass != nil {
		c.Cass.Close()
	}
	return c.DB.Close()
}

// aliveFile is where the node notes when it was last alive.
const aliveFile = "node.alive"

// knownFile keeps the gossip addresses of the cluster's other members, so a
// restarted node finds its cluster at once, seeds or not. It is not hard
// state: a node renewed after a long absence keeps it.
const knownFile = "cluster.known"

// noteAlive records that the node is alive now (not forced to disk: a
// minute's error does not matter against a week).
func (c *Core) noteAlive() {
	path := filepath.Join(c.dataDir, aliveFile)
	if err := os.WriteFile(path, []byte(time.Now().UTC().Format(time.RFC3339)+"\n"), 0o600); err != nil {
		c.log.Warn("could not note that the node is alive", "path", path, "err", err)
	}
}

// keepOnRenewal are the files of a data directory that are not hard state
// of the cluster and outlive a renewal: the addresses of other members (to
// rejoin), the admin token the operator's tools hold (admin.TokenFile) and
// the self-signed TLS certificate clients may have accepted.
var keepOnRenewal = map[string]bool{knownFile: true, "admin.token": true, tlscert.SelfSignedDir: true}

// renewIfAway renews a node that was last alive longer ago than its peers
// keep update log entries: it missed updates it can no longer get (a
// delete, a flag change), so it rejoins as a new node with no hard state
// (Porcupine §4.4); its messages have replicas elsewhere, which repair
// re-homes. Two guards keep this from losing mail:
//   - a node with no peers (a cluster of one, or one that never saw
//     another member) is never renewed: nobody else holds its mail, and
//     nobody made updates it missed;
//   - the old hard state is moved aside into DATA/away-<time>/, not
//     deleted, so a cluster stopped as a whole for longer than the log's
//     age can still be brought back by hand (quill restore, or moving the
//     files back) rather than lose everything. The operator deletes it.
func renewIfAway(dataDir string, maxAge time.Duration, hasPeers bool, log *slog.Logger) error {
	b, err := os.ReadFile(filepath.Join(dataDir, aliveFile))
	if err != nil {
		return nil // a new node, or one from before this note existed
	}
	last, err := time.Parse(time.RFC3339, strings.TrimSpace(string(b)))
	if err != nil || time.Since(last) <= maxAge {
		return nil
	}
	if !hasPeers {
		log.Warn("node was away longer than the update log keeps entries, but it has no peers: its hard state is kept",
			"data", dataDir, "last_alive", last, "max_age", maxAge)
		return nil
	}
	aside := filepath.Join(dataDir, awayPrefix+time.Now().UTC().Format("20060102T150405"))
	log.Warn("node was away longer than the update log keeps entries: rejoining as a new node; its old hard state is moved aside (delete it once the cluster has re-made its copies)",
		"data", dataDir, "last_alive", last, "max_age", maxAge, "moved_to", aside)
	entries, err := os.ReadDir(dataDir)
	if err != nil {
		return fmt.Errorf("data directory %s: %w", dataDir, err)
	}
	if err := os.Mkdir(aside, 0o700); err != nil {
		return fmt.Errorf("renew %s: %w", dataDir, err)
	}
	for _, e := range entries {
		if keepOnRenewal[e.Name()] || strings.HasPrefix(e.Name(), awayPrefix) {
			continue
		}
		if err := os.Rename(filepath.Join(dataDir, e.Name()), filepath.Join(aside, e.Name())); err != nil {
			return fmt.Errorf("renew %s: %w", dataDir, err)
		}
	}
	return nil
}

// awayPrefix names the directories a renewal moves old hard state into.
const awayPrefix = "away-"

// peerProbe bounds the wait for a peer's gossip port to take a
// connection when a node away too long decides whether to renew.
const peerProbe = 3 * time.Second

// hasPeers says whether a node starting in dataDir has peers that kept the
// cluster going: it gossips, and one of its seeds or remembered members
// (knownFile), other than itself, takes a connection now. A cluster that
// shrank to this node, or one whose nodes all start again together, finds
// none, and the node keeps its state (the first of such a restart; the
// others find it and renew, their old state kept aside).
func hasPeers(dataDir, clusterAddr string, join []string) bool {
	if clusterAddr == "" {
		return false
	}
	addrs := slices.Clone(join)
	if b, err := os.ReadFile(filepath.Join(dataDir, knownFile)); err == nil {
		addrs = append(addrs, strings.Fields(string(b))...)
	}
	for _, a := range addrs {
		if a == clusterAddr {
			continue
		}
		if c, err := net.DialTimeout("tcp", a, peerProbe); err == nil {
			c.Close()
			return true
		}
	}
	return false
}

// listenRPC opens the RPC listener on the port this node used last time
// (DATA/rpc.port), so peers that still hold the old address reach it again
// after a restart; a new port is taken, and remembered, if that one is busy.
func listenRPC(dataDir, host string) (net.Listener, error) {
	path := filepath.Join(dataDir, "rpc.port")
	if b, err := os.ReadFile(path); err == nil {
		if l, err := net.Listen("tcp", net.JoinHostPort(host, strings.TrimSpace(string(b)))); err == nil {
			return l, nil
		}
	}
	l, err := net.Listen("tcp", net.JoinHostPort(host, "0"))
	if err != nil {
		return nil, fmt.Errorf("rpc listener on %s: %w", host, err)
	}
	_, port, _ := net.SplitHostPort(l.Addr().String())
	if err := os.WriteFile(path, []byte(port+"\n"), 0o600); err != nil {
		l.Close()
		return nil, fmt.Errorf("rpc port %s: %w", path, err)
	}
	return l, nil
}

// nextBoot increments and returns the node's boot incarnation, kept in the
// data directory: it tells the other nodes that this process is a new life
// of the node even if they never saw it die (Porcupine Fig. 6).
func nextBoot(dataDir string) (uint64, error) {
	path := filepath.Join(dataDir, "node.boot")
	var boot uint64
	if b, err := os.ReadFile(path); err == nil {
		fmt.Sscanf(strings.TrimSpace(string(b)), "%d", &boot)
	} else if !errors.Is(err, os.ErrNotExist) {
		return 0, fmt.Errorf("boot counter %s: %w", path, err)
	}
	boot++
	tmp := path + ".tmp"
	os.Remove(tmp)
	if err := writeFileSync(tmp, []byte(fmt.Sprintf("%d\n", boot))); err != nil {
		return 0, fmt.Errorf("boot counter %s: %w", path, err)
	}
	if err := os.Rename(tmp, path); err != nil {
		return 0, fmt.Errorf("boot counter %s: %w", path, err)
	}
	return boot, nil
}

// RPCAddr returns the address node-to-node RPC listens on ("" without
// --cluster).
func (c *Core) RPCAddr() string {
	if c.rpcLn == nil {
		return ""
	}
	return c.rpcLn.Addr().String()
}

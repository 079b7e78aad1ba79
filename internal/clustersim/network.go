// Package clustersim runs a simulated Quill cluster in one process, to
// measure at 64 to 256 nodes what one machine cannot run as real nodes
// (docs/cluster.md, "Simulation"; docs/benchmarks.md, issue 16). Each
// simulated node runs the real membership manager (internal/cluster:
// memberlist's SWIM, the user map) and the real placement (internal/balance);
// only the network is simulated, in memory. It reports the gossip each
// node pays, the node-to-node calls a delivery makes under the real user
// map and placement, and how long the survivors take to agree on a new user
// map after a node fails, with the soft-state scans that follow.
//
// Written here because nothing else simulates Quill's own placement; the
// network too: memberlist's MockNetwork has no failures (a packet to a
// node that stopped blocks its sender for good), and a crash is what the
// simulation is for.
package clustersim

import (
	"fmt"
	"net"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
)

// packetQueue is how many packets a node's inbox holds before new ones are
// dropped, as a UDP socket's buffer drops them: memberlist reads its inbox
// at once, so only a stalled simulation fills it.
const packetQueue = 1024

// Network is an in-memory network of endpoints, one per simulated node:
// packets are delivered or dropped (never block), streams are net.Pipe
// pairs. A node cut off (Cut) neither sends nor receives anything, as a
// crashed machine.
type Network struct {
	mu   sync.RWMutex
	ends map[string]*Endpoint
}

// NewNetwork returns an empty network.
func NewNetwork() *Network { return &Network{ends: map[string]*Endpoint{}} }

// Endpoint returns a new endpoint at addr ("10.0.0.1:7946").
func (n *Network) Endpoint(addr string) (*Endpoint, error) {
	host, p, err := net.SplitHostPort(addr)
	if err != nil {
		return nil, fmt.Errorf("simulated address %q: %w", addr, err)
	}
	port, err := strconv.Atoi(p)
	ip := net.ParseIP(host)
	if err != nil || ip == nil {
		return nil, fmt.Errorf("simulated address %q: not an IP and port", addr)
	}
	e := &Endpoint{net: n, addr: addr, ip: ip, port: port,
		packets: make(chan *memberlist.Packet, packetQueue), streams: make(chan net.Conn)}
	n.mu.Lock()
	defer n.mu.Unlock()
	if n.ends[addr] != nil {
		return nil, fmt.Errorf("simulated address %s: already taken", addr)
	}
	n.ends[addr] = e
	return e, nil
}

func (n *Network) lookup(addr string) *Endpoint {
	n.mu.RLock()
	defer n.mu.RUnlock()
	return n.ends[addr]
}

// Endpoint is one node's attachment to the network: a
// memberlist.NodeAwareTransport.
type Endpoint struct {
	net     *Network
	addr    string
	ip      net.IP
	port    int
	packets chan *memberlist.Packet
	streams chan net.Conn
	cut     atomic.Bool
	dropped atomic.Int64
}

var _ memberlist.NodeAwareTransport = (*Endpoint)(nil)

// Cut takes the node off the network for good (a crash).
func (e *Endpoint) Cut() { e.cut.Store(true) }

// Dropped is how many packets sent to this endpoint were lost (it was cut,
// or its inbox was full).
func (e *Endpoint) Dropped() int64 { return e.dropped.Load() }

func (e *Endpoint) FinalAdvertiseAddr(string, int) (net.IP, int, error) { return e.ip, e.port, nil }

func (e *Endpoint) WriteTo(b []byte, addr string) (time.Time, error) {
	return e.WriteToAddress(b, memberlist.Address{Addr: addr})
}

// WriteToAddress delivers a copy of b, or drops it as UDP would: a packet
// to or from a node that is cut, or to an unknown address, is lost without
// an error.
func (e *Endpoint) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	now := time.Now()
	dest := e.net.lookup(a.Addr)
	if dest == nil || e.cut.Load() || dest.cut.Load() {
		if dest != nil {
			dest.dropped.Add(1)
		}
		return now, nil
	}
	p := &memberlist.Packet{Buf: append([]byte(nil), b...), From: &net.UDPAddr{IP: e.ip, Port: e.port}, Timestamp: now}
	select {
	case dest.packets <- p:
	default:
		dest.dropped.Add(1)
	}
	return now, nil
}

func (e *Endpoint) PacketCh() <-chan *memberlist.Packet { return e.packets }

func (e *Endpoint) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return e.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

// DialAddressTimeout opens a stream: refused at once by a node that is cut
// (as a crashed machine's kernel would, or a dead host after its timeout:
// memberlist handles both alike).
func (e *Endpoint) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	dest := e.net.lookup(a.Addr)
	if dest == nil || e.cut.Load() || dest.cut.Load() {
		return nil, fmt.Errorf("simulated dial %s: connection refused", a.Addr)
	}
	mine, theirs := net.Pipe()
	select {
	case dest.streams <- theirs:
		return mine, nil
	case <-time.After(timeout):
		mine.Close()
		theirs.Close()
		return nil, fmt.Errorf("simulated dial %s: timed out after %s", a.Addr, timeout)
	}
}

func (e *Endpoint) StreamCh() <-chan net.Conn { return e.streams }

// Shutdown cuts the endpoint: memberlist has stopped reading it.
func (e *Endpoint) Shutdown() error {
	e.Cut()
	return nil
}

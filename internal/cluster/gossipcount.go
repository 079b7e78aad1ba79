package cluster

import (
	"net"
	"sync/atomic"
	"time"

	"github.com/hashicorp/memberlist"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/quillmail/quill/internal/metrics"
)

// The membership's own traffic, counted at memberlist's Transport: what a
// node pays for gossip and failure detection, which SWIM keeps constant
// per node as the cluster grows (docs/benchmarks.md measures it from 1 to
// 16 nodes, and the simulation to 256). Packets are memberlist's UDP
// messages (probes, acks, gossip, each maybe a compound of several);
// streams are its TCP exchanges (joins, push-pull of the whole state,
// fallback probes).
var (
	gossipBytes = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_gossip_bytes_total", Help: "Bytes of membership traffic (memberlist), by direction (sent, received) and kind (packet, stream)."},
		[]string{"direction", "kind"})
	gossipMessages = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "quill_gossip_messages_total", Help: "Membership packets and streams (memberlist), by direction (sent, received) and kind (packet, stream)."},
		[]string{"direction", "kind"})
)

func init() {
	for _, d := range []string{"sent", "received"} {
		for _, k := range []string{"packet", "stream"} {
			gossipBytes.WithLabelValues(d, k)
			gossipMessages.WithLabelValues(d, k)
		}
	}
	metrics.Registry.MustRegister(gossipBytes, gossipMessages)
}

// GossipStats is one node's membership traffic since it started (the
// process-wide counters above add every node of the process; the
// simulation reads each node's own).
type GossipStats struct {
	SentBytes, ReceivedBytes       int64
	SentMessages, ReceivedMessages int64 // packets plus streams
}

// counting is a memberlist Transport that counts what passes through it
// into both the node's GossipStats and the process' counters. memberlist
// offers only go-metrics sinks (global, by message type, not bytes of
// streams) for this, so the transport is wrapped instead.
type counting struct {
	memberlist.NodeAwareTransport
	packets chan *memberlist.Packet
	streams chan net.Conn
	stop    chan struct{}

	sentBytes, recvBytes, sentMsgs, recvMsgs atomic.Int64
}

// nodeAware gives a plain Transport (memberlist's NetTransport) the
// node-aware methods, as memberlist's own (unexported) shim does.
type nodeAware struct{ memberlist.Transport }

func (t nodeAware) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	return t.WriteTo(b, a.Addr)
}

func (t nodeAware) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	return t.DialTimeout(a.Addr, timeout)
}

// countTraffic wraps t; its packets and streams are relayed (and counted)
// by two goroutines that end with Shutdown.
func countTraffic(t memberlist.NodeAwareTransport) *counting {
	c := &counting{NodeAwareTransport: t, packets: make(chan *memberlist.Packet), streams: make(chan net.Conn), stop: make(chan struct{})}
	go func() {
		for {
			select {
			case p := <-t.PacketCh():
				c.received("packet", len(p.Buf))
				select {
				case c.packets <- p:
				case <-c.stop:
					return
				}
			case <-c.stop:
				return
			}
		}
	}()
	go func() {
		for {
			select {
			case conn := <-t.StreamCh():
				c.message("received", "stream")
				select {
				case c.streams <- &countedConn{Conn: conn, c: c}:
				case <-c.stop:
					conn.Close()
					return
				}
			case <-c.stop:
				return
			}
		}
	}()
	return c
}

// Stats returns the traffic counted so far.
func (c *counting) Stats() GossipStats {
	return GossipStats{SentBytes: c.sentBytes.Load(), ReceivedBytes: c.recvBytes.Load(),
		SentMessages: c.sentMsgs.Load(), ReceivedMessages: c.recvMsgs.Load()}
}

func (c *counting) message(direction, kind string) {
	if direction == "sent" {
		c.sentMsgs.Add(1)
	} else {
		c.recvMsgs.Add(1)
	}
	gossipMessages.WithLabelValues(direction, kind).Inc()
}

func (c *counting) bytes(direction, kind string, n int) {
	if n <= 0 {
		return
	}
	if direction == "sent" {
		c.sentBytes.Add(int64(n))
	} else {
		c.recvBytes.Add(int64(n))
	}
	gossipBytes.WithLabelValues(direction, kind).Add(float64(n))
}

func (c *counting) received(kind string, n int) {
	c.message("received", kind)
	c.bytes("received", kind, n)
}

func (c *counting) WriteTo(b []byte, addr string) (time.Time, error) {
	return c.WriteToAddress(b, memberlist.Address{Addr: addr})
}

func (c *counting) WriteToAddress(b []byte, a memberlist.Address) (time.Time, error) {
	t, err := c.NodeAwareTransport.WriteToAddress(b, a)
	if err == nil {
		c.message("sent", "packet")
		c.bytes("sent", "packet", len(b))
	}
	return t, err
}

func (c *counting) PacketCh() <-chan *memberlist.Packet { return c.packets }
func (c *counting) StreamCh() <-chan net.Conn           { return c.streams }

func (c *counting) DialTimeout(addr string, timeout time.Duration) (net.Conn, error) {
	return c.DialAddressTimeout(memberlist.Address{Addr: addr}, timeout)
}

func (c *counting) DialAddressTimeout(a memberlist.Address, timeout time.Duration) (net.Conn, error) {
	conn, err := c.NodeAwareTransport.DialAddressTimeout(a, timeout)
	if err != nil {
		return nil, err
	}
	c.message("sent", "stream")
	return &countedConn{Conn: conn, c: c}, nil
}

// Shutdown stops the inner transport first, while the relays still take
// what its listeners hand over (NetTransport's Shutdown waits for them,
// and one blocked on a packet nobody reads would keep it waiting for
// good), then the relays.
func (c *counting) Shutdown() error {
	err := c.NodeAwareTransport.Shutdown()
	close(c.stop)
	return err
}

// countedConn counts a stream's bytes both ways.
type countedConn struct {
	net.Conn
	c *counting
}

func (cc *countedConn) Read(b []byte) (int, error) {
	n, err := cc.Conn.Read(b)
	cc.c.bytes("received", "stream", n)
	return n, err
}

func (cc *countedConn) Write(b []byte) (int, error) {
	n, err := cc.Conn.Write(b)
	cc.c.bytes("sent", "stream", n)
	return n, err
}

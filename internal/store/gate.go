package store

import (
	"errors"
	"fmt"
	"io"
	"sync"
	"time"
)

// ErrClosed is returned by every operation that starts after Close began:
// the node is shutting down.
var ErrClosed = errors.New("store closed: the node is shutting down")

// closeWait bounds how long Close waits for operations in progress. They
// are local disk operations (milliseconds); one still inside after this is
// stuck, and the database is left open rather than closed under it: the
// process is exiting, and every acknowledged write is already in the
// fsync'd WAL.
const closeWait = 10 * time.Second

// gate counts the operations inside the database and keeps new ones out
// once closing. A counter, not an RWMutex: an operation may nest another
// (an iterator open while it reads a key), and a waiting RWMutex writer
// would block the nested read and deadlock.
type gate struct {
	name    string
	mu      sync.Mutex
	idle    *sync.Cond
	inside  int
	closing bool
	once    sync.Once
	err     error
}

func (g *gate) init(name string) {
	g.name = name
	g.idle = sync.NewCond(&g.mu)
}

func (g *gate) enter() error {
	g.mu.Lock()
	defer g.mu.Unlock()
	if g.closing {
		return ErrClosed
	}
	g.inside++
	return nil
}

func (g *gate) exit() {
	g.mu.Lock()
	g.inside--
	if g.inside == 0 {
		g.idle.Broadcast()
	}
	g.mu.Unlock()
}

// close shuts the gate, waits for the operations inside and then runs fn.
func (g *gate) close(fn func() error) error {
	g.once.Do(func() {
		g.mu.Lock()
		g.closing = true
		deadline := time.Now().Add(closeWait)
		timer := time.AfterFunc(closeWait, func() {
			g.mu.Lock()
			g.idle.Broadcast()
			g.mu.Unlock()
		})
		for g.inside > 0 && time.Now().Before(deadline) {
			g.idle.Wait()
		}
		timer.Stop()
		left := g.inside
		g.mu.Unlock()
		if left > 0 {
			g.err = fmt.Errorf("store %s: %d operations still running after %v: left open", g.name, left, closeWait)
			return
		}
		g.err = fn()
	})
	return g.err
}

// exitCloser lets the gate go when a value read with Get is released.
type exitCloser struct {
	c    io.Closer
	g    *gate
	done bool
}

func (c *exitCloser) Close() error {
	if c.done {
		return nil
	}
	c.done = true
	err := c.c.Close()
	c.g.exit()
	return err
}

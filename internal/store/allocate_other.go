//go:build !linux

package store

import "os"

// allocate reserves size bytes of blocks for f by writing zeros.
func allocate(f *os.File, size int64) error { return writeZeros(f, size) }

package store

import (
	"errors"
	"os"
	"syscall"
)

// allocate reserves size bytes of blocks for f: fallocate where the file
// system has it, zero writes where it does not.
func allocate(f *os.File, size int64) error {
	err := syscall.Fallocate(int(f.Fd()), 0, 0, size)
	if errors.Is(err, syscall.EOPNOTSUPP) || errors.Is(err, syscall.ENOSYS) {
		return writeZeros(f, size)
	}
	return err
}

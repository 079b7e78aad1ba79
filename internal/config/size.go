package config

import (
	"fmt"
	"math"
	"strconv"
	"strings"
)

// sizeUnits are the suffixes ParseSize takes, in powers of 1024 (as
// RFC 9208 counts STORAGE in units of 1024 octets).
var sizeUnits = []struct {
	suffix string
	mult   int64
}{{"T", 1 << 40}, {"G", 1 << 30}, {"M", 1 << 20}, {"K", 1 << 10}, {"B", 1}}

// ParseSize reads a size such as 500M, 2G, 1.5G or 1048576 (bytes).
func ParseSize(s string) (int64, error) {
	t := strings.ToUpper(strings.TrimSpace(s))
	t = strings.TrimSuffix(strings.TrimSuffix(t, "IB"), "B")
	mult := int64(1)
	for _, u := range sizeUnits {
		if u.suffix != "B" && strings.HasSuffix(t, u.suffix) {
			t, mult = strings.TrimSuffix(t, u.suffix), u.mult
			break
		}
	}
	f, err := strconv.ParseFloat(t, 64)
	if err != nil || math.IsNaN(f) || f < 0 || f*float64(mult) > 1<<62 {
		return 0, fmt.Errorf("size %q: want a number of bytes with an optional K, M, G or T", s)
	}
	return int64(f * float64(mult)), nil
}

// FormatSize writes a byte count the way ParseSize reads it.
func FormatSize(n int64) string {
	for _, u := range sizeUnits[:4] {
		if n >= u.mult {
			return strconv.FormatFloat(float64(n)/float64(u.mult), 'f', 1, 64) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10) + "B"
}

// FormatSizeExact writes a byte count the way ParseSize reads it back to
// the same number: in the largest unit that divides it, else in bytes (a
// form's value must not round a limit when it is saved again).
func FormatSizeExact(n int64) string {
	for _, u := range sizeUnits[:4] {
		if n >= u.mult && n%u.mult == 0 {
			return strconv.FormatInt(n/u.mult, 10) + u.suffix
		}
	}
	return strconv.FormatInt(n, 10)
}

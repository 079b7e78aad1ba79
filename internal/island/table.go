package island

import (
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"slices"
	"strings"
)

// Buckets is the number of table entries: one per user-map bucket. It must
// equal cluster.Buckets (checked by TestBucketsMatchUserMap); the constant
// is repeated rather than imported so that the cluster package, which will
// consult the table, can import this one.
const Buckets = 256

// MaxIslands is the most islands a table holds: an island owning no bucket
// serves no user, and the encoding names an island by one byte.
const MaxIslands = Buckets

// maxNameLen bounds an island name: it travels in every node's memberlist
// meta, which is small (memberlist.MetaMaxSize, 512 bytes, for all of it).
const maxNameLen = 63

// Default is the island of a node started without --island: with every node
// in it, the table sends every bucket to it, which is Quill before islands.
const Default = "default"

// ValidName reports whether name can name an island: 1 to 63 characters of
// lower-case letters, digits, '.', '-' and '_'. The set is narrow because
// the name appears in flags, node meta, metric labels and log lines.
func ValidName(name string) error {
	if name == "" {
		return errors.New("island name is empty")
	}
	if len(name) > maxNameLen {
		return fmt.Errorf("island name %.20q...: longer than %d characters", name, maxNameLen)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= '0' && c <= '9' || c == '.' || c == '-' || c == '_') {
			return fmt.Errorf("island name %q: character %q not allowed (use a-z, 0-9, '.', '-', '_')", name, c)
		}
	}
	return nil
}

// Table is the bucket→island table of Archipelago §3.1: entry b names the
// island that owns every user hashing to bucket b. It is a value: methods
// never change it, and Rebalance returns a new one. The zero Table is not
// valid (it has no islands); make one with Initial, New or Decode.
type Table struct {
	epoch   uint64
	islands []string       // sorted, unique, valid names; never modified once set
	owner   [Buckets]uint8 // index into islands
}

// New returns the table with the given epoch in which bucket b belongs to
// owners[b]. islands lists every island of the table, including any that
// own no bucket; nil means exactly the islands named in owners.
func New(epoch uint64, owners [Buckets]string, islands []string) (Table, error) {
	if islands == nil {
		islands = owners[:]
	}
	names := slices.Clone(islands)
	slices.Sort(names)
	names = slices.Compact(names)
	if err := checkNames(names); err != nil {
		return Table{}, err
	}
	t := Table{epoch: epoch, islands: names}
	for b, o := range owners {
		i, ok := slices.BinarySearch(names, o)
		if !ok {
			return Table{}, fmt.Errorf("bucket %d: island %q is not one of the table's islands", b, o)
		}
		t.owner[b] = uint8(i)
	}
	return t, nil
}

// checkNames checks a sorted, de-duplicated island list.
func checkNames(names []string) error {
	if len(names) == 0 {
		return errors.New("island table: no islands")
	}
	if len(names) > MaxIslands {
		return fmt.Errorf("island table: %d islands, at most %d", len(names), MaxIslands)
	}
	for _, n := range names {
		if err := ValidName(n); err != nil {
			return err
		}
	}
	return nil
}

// Initial returns the first table over the given islands, at epoch 1: the
// buckets are dealt out in turn over the islands sorted by name, so every
// island gets 256/n buckets, give or take one, and every node computes the
// same table from the same set whatever order it learnt the names in.
func Initial(islands []string) (Table, error) {
	names := slices.Clone(islands)
	slices.Sort(names)
	if i := duplicate(names); i >= 0 {
		return Table{}, fmt.Errorf("island %q named twice", names[i])
	}
	if err := checkNames(names); err != nil {
		return Table{}, err
	}
	t := Table{epoch: 1, islands: names}
	for b := range t.owner {
		t.owner[b] = uint8(b % len(names))
	}
	return t, nil
}

// duplicate returns the index of a name repeated in a sorted list, or -1.
func duplicate(sorted []string) int {
	for i := 1; i < len(sorted); i++ {
		if sorted[i] == sorted[i-1] {
			return i
		}
	}
	return -1
}

// Epoch is the table's version: every change installs a higher one, and a
// node keeps the table with the highest epoch it has seen.
func (t Table) Epoch() uint64 { return t.epoch }

// Island returns the island owning a bucket.
func (t Table) Island(bucket uint8) string { return t.islands[t.owner[bucket]] }

// Islands returns the table's islands, sorted by name.
func (t Table) Islands() []string { return slices.Clone(t.islands) }

// Has reports whether an island is one of the table's.
func (t Table) Has(island string) bool {
	_, ok := slices.BinarySearch(t.islands, island)
	return ok
}

// Owned returns the buckets an island owns, in increasing order.
func (t Table) Owned(island string) []uint8 {
	var out []uint8
	for b := range Buckets {
		if t.Island(uint8(b)) == island {
			out = append(out, uint8(b))
		}
	}
	return out
}

// Owners returns the island of every bucket.
func (t Table) Owners() [Buckets]string {
	var out [Buckets]string
	for b := range out {
		out[b] = t.Island(uint8(b))
	}
	return out
}

// Equal reports whether two tables have the same epoch, islands and
// assignment.
func (t Table) Equal(u Table) bool {
	return t.epoch == u.epoch && slices.Equal(t.islands, u.islands) && t.owner == u.owner
}

// Validate checks the table against the islands that exist (those the
// membership knows of): every bucket must belong to one of them. A bucket
// whose island is unknown would have no node to hold its users; the caller
// reports the error and keeps its previous table.
func (t Table) Validate(known []string) error {
	if len(t.islands) == 0 {
		return errors.New("island table: no islands")
	}
	var missing []string
	var buckets []int
	for b := range Buckets {
		isl := t.Island(uint8(b))
		if !slices.Contains(known, isl) {
			if !slices.Contains(missing, isl) {
				missing = append(missing, isl)
			}
			buckets = append(buckets, b)
		}
	}
	if len(missing) > 0 {
		return fmt.Errorf("island table epoch %d: %d buckets (first %d) belong to unknown islands %s",
			t.epoch, len(buckets), buckets[0], strings.Join(missing, ", "))
	}
	return nil
}

// String summarises the table for logs: its epoch and each island's bucket
// count.
func (t Table) String() string {
	var counts [MaxIslands]int
	for _, o := range t.owner {
		counts[o]++
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, "epoch %d:", t.epoch)
	for i, n := range t.islands {
		fmt.Fprintf(&sb, " %s=%d", n, counts[i])
	}
	return sb.String()
}

// The encoding, version 1, little enough to gossip (about 300 bytes for a
// few islands):
//
//	byte      format version (1)
//	uvarint   epoch
//	uvarint   number of islands n (1..256)
//	n times   uvarint length, then the name's bytes (sorted, unique)
//	256 bytes the owner of bucket 0..255, as an index into the names
//	4 bytes   CRC-32C of all the above, big-endian
//
// Decode accepts only what Encode produces (the canonical form), so two
// nodes holding the same table hold the same bytes.
const formatV1 = 1

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// Encode returns the table's binary form.
func (t Table) Encode() []byte {
	out := make([]byte, 0, 1+2*binary.MaxVarintLen64+len(t.islands)*(maxNameLen+1)+Buckets+4)
	out = append(out, formatV1)
	out = binary.AppendUvarint(out, t.epoch)
	out = binary.AppendUvarint(out, uint64(len(t.islands)))
	for _, n := range t.islands {
		out = binary.AppendUvarint(out, uint64(len(n)))
		out = append(out, n...)
	}
	out = append(out, t.owner[:]...)
	return binary.BigEndian.AppendUint32(out, crc32.Checksum(out, castagnoli))
}

// Decode parses Encode's output. Any other input (truncated, corrupted, of
// a later format, naming a bucket's island out of range) is an error that
// says what is wrong.
func Decode(data []byte) (Table, error) {
	fail := func(format string, a ...any) (Table, error) {
		return Table{}, fmt.Errorf("island table: "+format, a...)
	}
	if len(data) < 1+Buckets+4 {
		return fail("%d bytes, too short", len(data))
	}
	body, sum := data[:len(data)-4], binary.BigEndian.Uint32(data[len(data)-4:])
	if crc32.Checksum(body, castagnoli) != sum {
		return fail("checksum mismatch (corrupted or truncated)")
	}
	if body[0] != formatV1 {
		return fail("format version %d, this node reads %d", body[0], formatV1)
	}
	p := body[1:]
	uvarint := func(what string) (uint64, error) {
		v, n := binary.Uvarint(p)
		if n <= 0 {
			return 0, fmt.Errorf("island table: bad %s", what)
		}
		p = p[n:]
		return v, nil
	}
	epoch, err := uvarint("epoch")
	if err != nil {
		return Table{}, err
	}
	n, err := uvarint("island count")
	if err != nil {
		return Table{}, err
	}
	if n == 0 || n > MaxIslands {
		return fail("%d islands, want 1 to %d", n, MaxIslands)
	}
	names := make([]string, 0, n)
	for i := range n {
		l, err := uvarint("name length")
		if err != nil {
			return Table{}, err
		}
		if l > uint64(len(p)) {
			return fail("island %d: name runs past the end", i)
		}
		names = append(names, string(p[:l]))
		p = p[l:]
	}
	if !slices.IsSorted(names) || duplicate(names) >= 0 {
		return fail("island names not sorted and unique")
	}
	if err := checkNames(names); err != nil {
		return Table{}, err
	}
	if len(p) != Buckets {
		return fail("%d bucket entries, want %d", len(p), Buckets)
	}
	t := Table{epoch: epoch, islands: names}
	for b, o := range p {
		if int(o) >= len(names) {
			return fail("bucket %d: island index %d of %d", b, o, len(names))
		}
		t.owner[b] = o
	}
	// Reject other spellings of the same table (overlong varints), so that
	// equal tables are equal bytes.
	if enc := t.Encode(); string(enc) != string(data) {
		return fail("not in canonical form")
	}
	return t, nil
}

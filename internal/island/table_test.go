package island

import (
	"encoding/binary"
	"fmt"
	"hash/crc32"
	"math/rand/v2"
	"slices"
	"strings"
	"testing"
)

func names(n int) []string {
	out := make([]string, n)
	for i := range out {
		out[i] = fmt.Sprintf("isl-%03d", i)
	}
	return out
}

func counts(t Table) map[string]int {
	c := map[string]int{}
	for _, o := range t.Owners() {
		c[o]++
	}
	return c
}

func TestInitialBalanced(t *testing.T) {
	for n := 1; n <= MaxIslands; n++ {
		isl := names(n)
		tab, err := Initial(isl)
		if err != nil {
			t.Fatalf("%d islands: %v", n, err)
		}
		if tab.Epoch() != 1 {
			t.Fatalf("%d islands: epoch %d, want 1", n, tab.Epoch())
		}
		lo, hi := Buckets/n, (Buckets+n-1)/n
		c := counts(tab)
		for _, name := range isl {
			if c[name] < lo || c[name] > hi {
				t.Fatalf("%d islands: %s owns %d buckets, want %d..%d", n, name, c[name], lo, hi)
			}
		}
		// The same set in another order gives the same table.
		shuffled := slices.Clone(isl)
		rand.New(rand.NewPCG(uint64(n), 1)).Shuffle(n, func(i, j int) { shuffled[i], shuffled[j] = shuffled[j], shuffled[i] })
		again, err := Initial(shuffled)
		if err != nil || !again.Equal(tab) {
			t.Fatalf("%d islands: Initial depends on the order of its input (%v)", n, err)
		}
	}
}

func TestInitialRejects(t *testing.T) {
	for _, c := range []struct {
		islands []string
		want    string
	}{
		{nil, "no islands"},
		{[]string{"a", "b", "a"}, `"a" named twice`},
		{[]string{"a", ""}, "empty"},
		{[]string{"Upper"}, "not allowed"},
		{[]string{"a b"}, "not allowed"},
		{[]string{strings.Repeat("x", 64)}, "longer than 63"},
		{names(MaxIslands + 1), "at most 256"},
	} {
		_, err := Initial(c.islands)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("Initial(%.40q): %v, want an error containing %q", c.islands, err, c.want)
		}
	}
}

func TestValidName(t *testing.T) {
	for _, ok := range []string{"a", "eu-west.1", "rack_07", Default, strings.Repeat("z", 63)} {
		if err := ValidName(ok); err != nil {
			t.Errorf("ValidName(%q): %v", ok, err)
		}
	}
	for _, bad := range []string{"", "A", "é", "a/b", "a:b", "a\x00", strings.Repeat("z", 64)} {
		if ValidName(bad) == nil {
			t.Errorf("ValidName(%q) accepted", bad)
		}
	}
}

func TestNewAndAccessors(t *testing.T) {
	var owners [Buckets]string
	for b := range owners {
		owners[b] = []string{"north", "south"}[b%3/2]
	}
	tab, err := New(7, owners, []string{"south", "north", "spare"})
	if err != nil {
		t.Fatal(err)
	}
	if got := tab.Islands(); !slices.Equal(got, []string{"north", "south", "spare"}) {
		t.Fatalf("Islands() = %v", got)
	}
	if tab.Owners() != owners || tab.Epoch() != 7 || !tab.Has("spare") || tab.Has("east") {
		t.Fatalf("table does not keep what it was made of: %v", tab)
	}
	if got := tab.Owned("spare"); got != nil {
		t.Fatalf("spare owns %v, want none", got)
	}
	if got := tab.Owned("south"); len(got) != 85 || got[0] != 2 {
		t.Fatalf("south owns %d buckets starting %v, want 85 starting at 2", len(got), got[:1])
	}
	if s := tab.String(); s != "epoch 7: north=171 south=85 spare=0" {
		t.Fatalf("String() = %q", s)
	}
	if _, err := New(7, owners, []string{"north"}); err == nil || !strings.Contains(err.Error(), `island "south" is not one`) {
		t.Fatalf("New with an owner missing from the islands: %v", err)
	}
	owners[9] = "Bad"
	if _, err := New(7, owners, nil); err == nil {
		t.Fatal("New accepted an invalid island name")
	}
}

func TestValidate(t *testing.T) {
	tab, _ := Initial([]string{"a", "b", "c"})
	if err := tab.Validate([]string{"c", "b", "a", "d"}); err != nil {
		t.Fatalf("Validate with every island known: %v", err)
	}
	err := tab.Validate([]string{"a", "c"})
	if err == nil || !strings.Contains(err.Error(), "85 buckets (first 1) belong to unknown islands b") {
		t.Fatalf("Validate without b: %v", err)
	}
	if err := (Table{}).Validate([]string{"a"}); err == nil {
		t.Fatal("the zero table validated")
	}
}

// randomTable is a table of up to 12 islands with random owners.
func randomTable(r *rand.Rand) Table {
	isl := names(1 + r.IntN(12))
	var owners [Buckets]string
	for b := range owners {
		owners[b] = isl[r.IntN(len(isl))]
	}
	tab, err := New(r.Uint64N(1<<40), owners, isl)
	if err != nil {
		panic(err)
	}
	return tab
}

func TestEncodeRoundTrip(t *testing.T) {
	r := rand.New(rand.NewPCG(17, 1))
	for range 500 {
		tab := randomTable(r)
		enc := tab.Encode()
		got, err := Decode(enc)
		if err != nil {
			t.Fatalf("Decode(Encode(%v)): %v", tab, err)
		}
		if !got.Equal(tab) {
			t.Fatalf("round trip changed the table: %v became %v", tab, got)
		}
		if len(enc) > 1+6+1+12*9+Buckets+4 {
			t.Fatalf("%v encodes in %d bytes", tab, len(enc))
		}
	}
	// The largest table still fits a gossip message easily.
	big, _ := Initial(names(MaxIslands))
	if got, err := Decode(big.Encode()); err != nil || !got.Equal(big) {
		t.Fatalf("256 islands: %v", err)
	}
}

// withSum replaces the checksum of an encoding after tampering with it.
func withSum(body []byte) []byte {
	return binary.BigEndian.AppendUint32(slices.Clone(body), crc32.Checksum(body, castagnoli))
}

func TestDecodeRejects(t *testing.T) {
	tab, _ := Initial([]string{"a", "b"})
	good := tab.Encode()
	body := good[:len(good)-4]
	// body: [1][epoch 1][2][1 'a'][1 'b'][256 owners]
	mutate := func(f func([]byte) []byte) []byte { return withSum(f(slices.Clone(body))) }
	for _, c := range []struct {
		name string
		data []byte
		want string
	}{
		{"empty", nil, "too short"},
		{"truncated", good[:len(good)-1], "checksum"},
		{"flipped bit", append(slices.Clone(good[:20]), append([]byte{good[20] ^ 4}, good[21:]...)...), "checksum"},
		{"later format", mutate(func(b []byte) []byte { b[0] = 2; return b }), "format version 2"},
		{"no islands", mutate(func(b []byte) []byte { b[2] = 0; return b }), "0 islands"},
		{"unsorted", mutate(func(b []byte) []byte { b[4], b[6] = 'b', 'a'; return b }), "not sorted"},
		{"duplicate", mutate(func(b []byte) []byte { b[6] = 'a'; return b }), "not sorted and unique"},
		{"bad name", mutate(func(b []byte) []byte { b[4] = 'A'; return b }), "not allowed"},
		{"owner out of range", mutate(func(b []byte) []byte { b[len(b)-1] = 2; return b }), "bucket 255: island index 2 of 2"},
		{"missing owner", mutate(func(b []byte) []byte { return b[:len(b)-1] }), "255 bucket entries"},
		{"name past end", mutate(func(b []byte) []byte { b[5] = 0xff; return b }), "past the end"},
		{"overlong epoch", mutate(func(b []byte) []byte {
			return append([]byte{1, 0x81, 0x00}, b[2:]...) // epoch 1 as two bytes
		}), "canonical"},
	} {
		_, err := Decode(c.data)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%s: Decode gave %v, want an error containing %q", c.name, err, c.want)
		}
	}
}

// FuzzDecode: Decode never panics, and what it accepts is valid and
// encodes back to the very same bytes.
func FuzzDecode(f *testing.F) {
	r := rand.New(rand.NewPCG(3, 4))
	for range 8 {
		f.Add(randomTable(r).Encode())
	}
	f.Add([]byte{})
	f.Add(make([]byte, Buckets+5))
	f.Fuzz(func(t *testing.T, data []byte) {
		tab, err := Decode(data)
		if err != nil {
			return
		}
		if err := tab.Validate(tab.Islands()); err != nil {
			t.Fatalf("decoded table invalid: %v", err)
		}
		if enc := tab.Encode(); string(enc) != string(data) {
			t.Fatalf("accepted %x, which encodes back as %x", data, enc)
		}
	})
}

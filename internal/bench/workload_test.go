package bench

import (
	"bytes"
	"math"
	"math/rand/v2"
	"net/mail"
	"strings"
	"testing"
	"time"
)

func TestZipfChooserSkew(t *testing.T) {
	const n, draws = 1000, 200000
	c, err := NewZipfChooser(rand.New(rand.NewPCG(1, 2)), n)
	if err != nil {
		t.Fatal(err)
	}
	counts := make([]int, n)
	for range draws {
		k := c.Next()
		if k < 0 || k >= n {
			t.Fatalf("index %d out of [0, %d)", k, n)
		}
		counts[k]++
	}
	// P(k) = (k+1)^-1.3 / H, H = sum over the n ranks.
	var h float64
	for k := 1; k <= n; k++ {
		h += math.Pow(float64(k), -ZipfAlpha)
	}
	for _, k := range []int{0, 1, 9} {
		want := draws * math.Pow(float64(k+1), -ZipfAlpha) / h
		if got := float64(counts[k]); math.Abs(got-want) > 5*math.Sqrt(want) {
			t.Errorf("rank %d drawn %v times, want about %.0f", k+1, got, want)
		}
	}
	// Rank 1 over rank 2 should be about 2^1.3 = 2.46.
	if r := float64(counts[0]) / float64(counts[1]); r < 2.3 || r > 2.65 {
		t.Errorf("rank1/rank2 = %.2f, want about 2.46", r)
	}
}

func TestZipfChooserOneUser(t *testing.T) {
	c, err := NewZipfChooser(rand.New(rand.NewPCG(1, 2)), 1)
	if err != nil {
		t.Fatal(err)
	}
	for range 100 {
		if k := c.Next(); k != 0 {
			t.Fatalf("got %d", k)
		}
	}
	if _, err := NewZipfChooser(rand.New(rand.NewPCG(1, 2)), 0); err == nil {
		t.Fatal("zero users accepted")
	}
}

func TestSizeDistMean(t *testing.T) {
	d := DefaultSizeDist()
	if math.Abs(d.Mean()-DefaultMeanSize) > 0.5 {
		t.Fatalf("model mean %.1f, want %d", d.Mean(), DefaultMeanSize)
	}
	r := rand.New(rand.NewPCG(7, 7))
	const n = 1_000_000
	var sum float64
	var atMin, atMax, over100k int
	for range n {
		s := d.Sample(r)
		if s < MinMessageSize || s > MaxMessageSize {
			t.Fatalf("size %d outside the clip", s)
		}
		switch {
		case s == MinMessageSize:
			atMin++
		case s == MaxMessageSize:
			atMax++
		}
		if s > 100_000 {
			over100k++
		}
		sum += float64(s)
	}
	mean := sum / n
	// The standard error of the mean of 1e6 samples is about 12 B.
	if math.Abs(mean-DefaultMeanSize) > 100 {
		t.Errorf("sample mean %.0f, want about %d", mean, DefaultMeanSize)
	}
	if f := float64(atMin) / n; f < 0.05 || f > 0.07 {
		t.Errorf("%.3f at the floor, want about 0.06", f)
	}
	if f := float64(over100k) / n; f < 0.0015 || f > 0.0025 {
		t.Errorf("%.4f over 100 KB, want about 0.002", f)
	}
	if med := d.Median(); med < 1600 || med > 1900 {
		t.Errorf("median %d", med)
	}
	t.Logf("mean %.0f, median %d, at floor %d, at 1 MiB %d, over 100 KB %d of %d", mean, d.Median(), atMin, atMax, over100k, n)
}

func TestSizeDistSolvesOtherMeans(t *testing.T) {
	for _, mean := range []float64{1000, 50_000} {
		d, err := NewSizeDist(mean, 1, 200, 1<<20)
		if err != nil {
			t.Fatal(err)
		}
		if math.Abs(d.Mean()-mean) > 0.5 {
			t.Errorf("mean %v: model mean %v", mean, d.Mean())
		}
	}
	if _, err := NewSizeDist(100, 1, 200, 1<<20); err == nil {
		t.Error("mean below the clip accepted")
	}
}

func TestAppendMessage(t *testing.T) {
	r := rand.New(rand.NewPCG(3, 4))
	date := time.Date(2026, 11, 21, 5, 6, 7, 0, time.UTC)
	for _, size := range []int{0, 1, 150, 200, 201, 202, 279, 280, 281, 4700, 10007, 1 << 20} {
		spec := MessageSpec{From: "bench-sender@bench.example", To: "user00001@bench.example",
			Subject: "bench message 1", MessageID: "abc.1@bench.example", Date: date, Size: size}
		msg := AppendMessage([]byte("prefix"), r, spec)[len("prefix"):]
		header := bytes.Index(msg, []byte("\r\n\r\n")) + 4
		if want := max(size, header+2); len(msg) != want {
			t.Errorf("size %d: got %d bytes, want %d", size, len(msg), want)
		}
		if !bytes.HasSuffix(msg, []byte("\r\n")) {
			t.Errorf("size %d: no final CRLF", size)
		}
		for i, line := range strings.Split(strings.TrimSuffix(string(msg), "\r\n"), "\r\n") {
			if len(line) > 78 {
				t.Fatalf("size %d: line %d has %d chars", size, i, len(line))
			}
			if strings.ContainsAny(line, "\r\n") {
				t.Fatalf("size %d: bare CR or LF in line %d", size, i)
			}
			if strings.HasPrefix(line, ".") {
				t.Fatalf("size %d: line %d starts with a dot", size, i)
			}
			for _, c := range []byte(line) {
				if c < 0x20 || c > 0x7e {
					t.Fatalf("size %d: non-printable byte %#x", size, c)
				}
			}
		}
		m, err := mail.ReadMessage(bytes.NewReader(msg))
		if err != nil {
			t.Fatalf("size %d: %v", size, err)
		}
		for _, h := range []string{"From", "To", "Subject", "Date", "Message-Id"} {
			if m.Header.Get(h) == "" {
				t.Errorf("size %d: no %s", size, h)
			}
		}
		if d, err := m.Header.Date(); err != nil || !d.Equal(date) {
			t.Errorf("size %d: Date %v, %v", size, d, err)
		}
		if _, err := m.Header.AddressList("To"); err != nil {
			t.Errorf("size %d: To: %v", size, err)
		}
		if got := m.Header.Get("Message-Id"); got != "<abc.1@bench.example>" {
			t.Errorf("Message-ID %q", got)
		}
	}
}

func TestUserAddress(t *testing.T) {
	for i, want := range map[int]string{0: "user00001@d.example", 999: "user01000@d.example", 123455: "user123456@d.example"} {
		if got := UserAddress(i, "d.example"); got != want {
			t.Errorf("UserAddress(%d) = %q, want %q", i, got, want)
		}
	}
}

func TestParseSizeRange(t *testing.T) {
	for in, want := range map[string]SizeRange{
		"2K-20K":     {2 << 10, 20 << 10},
		"200K-2M":    {200 << 10, 2 << 20},
		"50kb-500kb": {50 << 10, 500 << 10},
		"4096-4096":  {4096, 4096},
	} {
		got, err := ParseSizeRange(in)
		if err != nil || got != want {
			t.Errorf("ParseSizeRange(%q) = %v, %v; want %v", in, got, err, want)
		}
	}
	for _, in := range []string{"", "2K", "20K-2K", "x-2K", "2K-y", "100-2K", "1K-1G"} {
		if r, err := ParseSizeRange(in); err == nil {
			t.Errorf("ParseSizeRange(%q) = %v, want an error", in, r)
		}
	}
}

func TestSizeRangeSample(t *testing.T) {
	sr := SizeRange{Min: 2 << 10, Max: 20 << 10}
	r := rand.New(rand.NewPCG(15, 15))
	const n = 200_000
	var sum float64
	var low, high int // the lowest and highest tenth of the range
	for range n {
		s := sr.Sample(r)
		if s < sr.Min || s > sr.Max {
			t.Fatalf("size %d outside [%d, %d]", s, sr.Min, sr.Max)
		}
		switch {
		case s < sr.Min+(sr.Max-sr.Min)/10:
			low++
		case s >= sr.Max-(sr.Max-sr.Min)/10:
			high++
		}
		sum += float64(s)
	}
	// The standard error of the mean of 2e5 uniform samples over 18 KiB
	// is about 12 B.
	if mean := sum / n; math.Abs(mean-sr.Mean()) > 60 {
		t.Errorf("sample mean %.0f, want about %.0f", mean, sr.Mean())
	}
	// Uniform: a tenth of the draws in each end tenth (sd about 0.0007).
	for name, k := range map[string]int{"lowest": low, "highest": high} {
		if f := float64(k) / n; f < 0.095 || f > 0.105 {
			t.Errorf("%.4f of the sizes in the %s tenth of the range, want 0.1", f, name)
		}
	}
	if one := (SizeRange{Min: 300, Max: 300}).Sample(r); one != 300 {
		t.Errorf("a one-size range gave %d", one)
	}
}

func TestAppendMessageText(t *testing.T) {
	r := rand.New(rand.NewPCG(5, 6))
	text := []byte("  The first line, indented.\n...dots lead this one\n\n" + strings.Repeat("long ", 40) + "\r\nlast line without end")
	for _, size := range []int{0, 150, 201, 279, 280, 281, 4700, 10007} {
		spec := MessageSpec{From: "a@bench.example", To: "b@bench.example", Subject: "s", MessageID: "m@bench.example",
			Date: time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC), Size: size}
		msg := AppendMessageText(nil, r, spec, text)
		header := bytes.Index(msg, []byte("\r\n\r\n")) + 4
		if want := max(size, header+2); len(msg) != want {
			t.Errorf("size %d: got %d bytes, want %d", size, len(msg), want)
		}
		body := strings.TrimSuffix(string(msg[header:]), "\r\n")
		for i, line := range strings.Split(body, "\r\n") {
			if len(line) > 78 || strings.HasPrefix(line, ".") || strings.HasPrefix(line, " ") || strings.ContainsAny(line, "\r\n") {
				t.Fatalf("size %d: body line %d %q", size, i, line)
			}
		}
		if size > 1000 && !strings.Contains(body, "long long") {
			t.Errorf("size %d: body not cut from the text: %q", size, body)
		}
	}
}

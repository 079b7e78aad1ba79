package bench

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"math/rand/v2"
	"strconv"
	"strings"
	"time"

	"github.com/quillmail/quill/internal/config"
)

// Workload parameters of Porcupine §6.1.
const (
	// ZipfAlpha is the skew of the user popularity distribution ("Each SMTP
	// session sends a message to a user chosen from a population according
	// to a Zipf distribution with alpha = 1.3").
	ZipfAlpha = 1.3
	// DefaultMeanSize is the mean message size in bytes ("a mean message
	// size of 4.7KB").
	DefaultMeanSize = 4700
	// DefaultSizeSigma is the shape of the log-normal message size
	// distribution: the standard deviation of ln(size). With 1.4 and the
	// clip below, the median message is about 1.8 KB, 6% of messages sit at
	// the 200 B floor, 0.2% exceed 100 KB and about one in 400,000 reaches
	// the 1 MiB ceiling: the paper's "fairly fat tail up to about 1MB".
	DefaultSizeSigma = 1.4
	// MinMessageSize and MaxMessageSize clip the size distribution.
	MinMessageSize = 200
	MaxMessageSize = 1 << 20
	// SMTPShare is the default fraction of requests that are SMTP
	// deliveries ("Mail delivery (SMTP) accounts for about 90% of the
	// transactions, with mail retrieval (POP) accounting for about 10%").
	SMTPShare = 0.9
)

// ZipfChooser picks user indexes in [0, n) with P(k) proportional to
// (k+1)^-ZipfAlpha: index 0 is the most popular user. It is not safe for
// concurrent use; give each worker its own.
type ZipfChooser struct {
	z *rand.Zipf
}

// NewZipfChooser returns a chooser over n users drawing from r.
func NewZipfChooser(r *rand.Rand, n int) (*ZipfChooser, error) {
	if n < 1 {
		return nil, errors.New("bench: need at least one user")
	}
	// math/rand's Zipf draws k in [0, imax] with P(k) ∝ (v+k)^-s and needs
	// s > 1, v >= 1; v = 1 gives the textbook rank distribution k^-s over
	// ranks 1..n.
	z := rand.NewZipf(r, ZipfAlpha, 1, uint64(n-1))
	if z == nil {
		return nil, errors.New("bench: bad Zipf parameters")
	}
	return &ZipfChooser{z: z}, nil
}

// Next returns the index of the next user.
func (c *ZipfChooser) Next() int { return int(c.z.Uint64()) }

// SizeDist is a log-normal distribution of message sizes clipped to
// [Min, Max]: a sample is clip(exp(Mu + Sigma·N(0,1))).
type SizeDist struct {
	Mu, Sigma float64
	Min, Max  int
}

// NewSizeDist returns the clipped log-normal with the given shape whose
// mean, after clipping, is mean bytes. It solves for Mu by bisection on
// the closed form of the clipped mean.
func NewSizeDist(mean, sigma float64, minSize, maxSize int) (SizeDist, error) {
	if sigma <= 0 || minSize < 1 || maxSize <= minSize ||
		mean <= float64(minSize) || mean >= float64(maxSize) {
		return SizeDist{}, fmt.Errorf("bench: bad size distribution (mean %v, sigma %v, clip [%d, %d])",
			mean, sigma, minSize, maxSize)
	}
	d := SizeDist{Sigma: sigma, Min: minSize, Max: maxSize}
	// The clipped mean grows monotonically with Mu from Min to Max.
	lo, hi := math.Log(float64(minSize))-10*sigma, math.Log(float64(maxSize))+10*sigma
	for range 200 {
		d.Mu = (lo + hi) / 2
		if d.Mean() < mean {
			lo = d.Mu
		} else {
			hi = d.Mu
		}
	}
	return d, nil
}

// DefaultSizeDist is the Porcupine size distribution: mean 4.7 KB, clipped
// to [200 B, 1 MiB].
func DefaultSizeDist() SizeDist {
	d, err := NewSizeDist(DefaultMeanSize, DefaultSizeSigma, MinMessageSize, MaxMessageSize)
	if err != nil {
		panic(err)
	}
	return d
}

// Mean is the exact mean of the clipped distribution:
// Min·P(X<Min) + Max·P(X>Max) + E[X; Min≤X≤Max], where the last term of a
// log-normal is exp(Mu+Sigma²/2)·[Φ((ln Max−Mu−Sigma²)/Sigma) − Φ((ln Min−Mu−Sigma²)/Sigma)].
func (d SizeDist) Mean() float64 {
	la, lb := math.Log(float64(d.Min)), math.Log(float64(d.Max))
	s2 := d.Sigma * d.Sigma
	return float64(d.Min)*phi((la-d.Mu)/d.Sigma) +
		float64(d.Max)*(1-phi((lb-d.Mu)/d.Sigma)) +
		math.Exp(d.Mu+s2/2)*(phi((lb-d.Mu-s2)/d.Sigma)-phi((la-d.Mu-s2)/d.Sigma))
}

// Median is exp(Mu), clipped.
func (d SizeDist) Median() int { return d.clip(math.Exp(d.Mu)) }

// Sample draws one message size in bytes.
func (d SizeDist) Sample(r *rand.Rand) int {
	return d.clip(math.Exp(d.Mu + d.Sigma*r.NormFloat64()))
}

func (d SizeDist) clip(x float64) int {
	switch {
	case x <= float64(d.Min):
		return d.Min
	case x >= float64(d.Max):
		return d.Max
	}
	return int(math.Round(x))
}

// SizeRange draws message sizes uniformly from [Min, Max] bytes: the
// ranges of CassMail §5 (2–20 KB, 200 KB–2 MB), which Postal draws its
// bodies from (its -M and -m), instead of Porcupine's log-normal.
type SizeRange struct {
	Min, Max int
}

// ParseSizeRange reads "MIN-MAX" with config.ParseSize's units (K = 1024
// bytes, as Postal counts): "2K-20K", "200K-2M".
func ParseSizeRange(s string) (SizeRange, error) {
	lo, hi, ok := strings.Cut(s, "-")
	if !ok {
		return SizeRange{}, fmt.Errorf("size range %q: want MIN-MAX, such as 2K-20K", s)
	}
	a, err := config.ParseSize(lo)
	if err != nil {
		return SizeRange{}, fmt.Errorf("size range %q: %w", s, err)
	}
	b, err := config.ParseSize(hi)
	if err != nil {
		return SizeRange{}, fmt.Errorf("size range %q: %w", s, err)
	}
	if a < MinMessageSize || b < a || b > MaxRangeSize {
		return SizeRange{}, fmt.Errorf("size range %q: want %d B <= MIN <= MAX <= %s", s, MinMessageSize, config.FormatSize(MaxRangeSize))
	}
	return SizeRange{Min: int(a), Max: int(b)}, nil
}

// MaxRangeSize bounds a SizeRange: a message that size is built in memory
// by each worker, and CassMail's largest is 2 MB.
const MaxRangeSize = 64 << 20

// Sample draws one message size in bytes.
func (r SizeRange) Sample(rng *rand.Rand) int { return r.Min + rng.IntN(r.Max-r.Min+1) }

// Mean is the mean size in bytes.
func (r SizeRange) Mean() float64 { return float64(r.Min+r.Max) / 2 }

// phi is the standard normal CDF.
func phi(x float64) float64 { return 0.5 * math.Erfc(-x/math.Sqrt2) }

// Line limits of the generated body: RFC 5322 §2.1.1 asks for at most 78
// characters per line before the CRLF.
const bodyLineLen = 76

// bodyAlphabet has 64 symbols so one random byte gives one symbol; the two
// spaces make word breaks.
const bodyAlphabet = "abcdefghijklmnopqrstuvwxyz ABCDEFGHIJKLMNOPQRSTUVWXYZ 0123456789"

// MessageSpec describes one generated message.
type MessageSpec struct {
	From, To  string
	Subject   string
	MessageID string // without angle brackets
	Date      time.Time
	// Size is the wanted size of the whole message, header included, in
	// bytes with CRLF line ends. A message is never smaller than its header
	// plus one empty body line.
	Size int
}

// AppendMessage appends an RFC 5322 message (§3.6 From, To, Subject, Date
// and Message-ID fields; CRLF line ends; a body of random printable text in
// lines of at most 78 characters) of spec.Size bytes to dst. No body line
// starts with a dot or a space.
func AppendMessage(dst []byte, r *rand.Rand, spec MessageSpec) []byte {
	start := len(dst)
	dst = append(dst, "From: "...)
	dst = append(dst, spec.From...)
	dst = append(dst, "\r\nTo: "...)
	dst = append(dst, spec.To...)
	dst = append(dst, "\r\nSubject: "...)
	dst = append(dst, spec.Subject...)
	dst = append(dst, "\r\nDate: "...)
	dst = spec.Date.AppendFormat(dst, time.RFC1123Z) // RFC 5322 §3.3 date-time
	dst = append(dst, "\r\nMessage-ID: <"...)
	dst = append(dst, spec.MessageID...)
	dst = append(dst, ">\r\n\r\n"...)

	rem := spec.Size - (len(dst) - start)
	if rem < 2 {
		rem = 2
	}
	for rem > 0 {
		n := bodyLineLen
		if rem <= bodyLineLen+2 {
			n = rem - 2
		} else if rem-(n+2) == 1 {
			n-- // never leave a single byte, which cannot hold a CRLF
		}
		dst = appendText(dst, r, n)
		dst = append(dst, '\r', '\n')
		rem -= n + 2
	}
	return dst
}

// AppendMessageText is AppendMessage with a body cut from text: whole
// lines from a random line on, wrapping at its end, each without leading
// blanks and dots, at most bodyLineLen long, the last one cut to size.
func AppendMessageText(dst []byte, r *rand.Rand, spec MessageSpec, text []byte) []byte {
	start := len(dst)
	dst = AppendMessage(dst, r, MessageSpec{From: spec.From, To: spec.To, Subject: spec.Subject,
		MessageID: spec.MessageID, Date: spec.Date, Size: 0})
	dst = dst[:len(dst)-2] // the empty body line AppendMessage ends with at size 0
	rem := spec.Size - (len(dst) - start)
	if rem < 2 {
		rem = 2
	}
	pos := r.IntN(max(len(text), 1))
	for rem > 0 {
		var line []byte
		for tries := 0; len(line) == 0 && tries <= len(text); tries++ { // a text of blanks gives empty lines
			if pos >= len(text) {
				pos = 0
			}
			end := bytes.IndexByte(text[pos:], '\n')
			if end < 0 {
				end = len(text) - pos
			}
			line = bytes.TrimLeft(bytes.TrimRight(text[pos:pos+end], "\r \t"), " \t.")
			pos += end + 1
		}
		n := min(len(line), bodyLineLen)
		if rem <= n+2 {
			n = rem - 2
		} else if rem-(n+2) == 1 {
			n-- // never leave a single byte, which cannot hold a CRLF
		}
		dst = append(dst, line[:max(n, 0)]...)
		dst = append(dst, '\r', '\n')
		rem -= max(n, 0) + 2
	}
	return dst
}

// appendText appends n random symbols of bodyAlphabet, the first a letter.
func appendText(dst []byte, r *rand.Rand, n int) []byte {
	for i := 0; i < n; {
		u := r.Uint64()
		for j := 0; j < 8 && i < n; j++ {
			c := bodyAlphabet[u&63]
			if i == 0 && (c == ' ' || c == '.') {
				c = 'q'
			}
			dst = append(dst, c)
			u >>= 8
			i++
		}
	}
	return dst
}

// UserAddress is the address of bench user index i (0-based) in domain:
// user00001@domain for index 0.
func UserAddress(i int, domain string) string {
	s := strconv.Itoa(i + 1)
	for len(s) < 5 {
		s = "0" + s
	}
	return "user" + s + "@" + domain
}

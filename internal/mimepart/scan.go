// Package mimepart finds where each part of a MIME message lies in its
// bytes: a part table, made by one sequential pass over the message with
// bounded memory, so that an IMAP FETCH of a section, a BINARY decode or a
// BODYSTRUCTURE of a large message reads the few ranges it needs instead
// of the whole message (issue 16 goal 6; RFC 9051 §6.4.5 section
// numbering, RFC 2046 multipart, RFC 3516 BINARY).
//
// Written here because no library gives offsets: go-message's multipart
// reader (which Quill's in-memory path uses) yields each part's bytes but
// not where they start, and net/mail and mime/multipart do neither. The
// table must place parts exactly where that library finds them, quirks
// included (a final boundary missing, bare-LF lines, a boundary line with
// trailing junk), so the scan runs a copy of the library's reader with a
// position counter (multipart.go) and parses each header with the library
// itself. The decisions of which parts are multiparts and which are
// encapsulated messages follow imap.bodyStructure, through MediaType,
// which both use.
package mimepart

import (
	"bufio"
	"bytes"
	"encoding/base64"
	"errors"
	"io"
	"mime/quotedprintable"
	"strings"

	gomessage "github.com/emersion/go-message"
	"github.com/emersion/go-message/textproto"
	"github.com/quillmail/quill/internal/fts"
)

// MaxDepth bounds how deep the table descends into nested multiparts and
// message/rfc822 parts, as BODYSTRUCTURE does; deeper parts are leaves.
const MaxDepth = fts.MaxMIMEDepth

// MaxParts bounds the parts of one multipart the table lists, as
// BODYSTRUCTURE does.
const MaxParts = 10000

// MaxTableParts bounds the parts of one table: a message of more (a
// crafted one, as real mail has a few) gets no table (ErrTooManyParts),
// so that its table costs at most a few hundred KiB of store and memory;
// it is then read whole, as a small message is.
const MaxTableParts = 20000

// ErrTooManyParts is Scan's error for a message of more than MaxTableParts
// parts.
var ErrTooManyParts = errors.New("mimepart: more parts than a table keeps")

// Kind is what a part holds.
type Kind uint8

const (
	Leaf      Kind = iota // bytes: text, an attachment, or anything not parsed further
	Multipart             // Children
	Message               // message/rfc822 or message/global: Inner
)

// Enc is a part's Content-Transfer-Encoding as BINARY undoes it (RFC 3516
// §4.2): the identity encodings, quoted-printable, base64, or one the
// server cannot decode.
type Enc uint8

const (
	Identity Enc = iota
	QuotedPrintable
	Base64
	Unknown
)

// Part is one entity of a message: the message itself, a part of a
// multipart, or the message a message/rfc822 part holds. Offsets are from
// the start of the message.
type Part struct {
	Hdr  int64 // where its header starts
	Body int64 // where its body starts (after the header, as far as it parsed)
	End  int64 // where its body ends
	// HdrErr: the header did not parse to its end (the library's
	// textproto.ReadHeader returned an error).
	HdrErr bool
	// Truncated: the body ran to the end of its parent without the
	// closing boundary; reading it as the library does fails.
	Truncated bool
	Kind      Kind
	// Cut: the multipart has more parts than MaxParts; Children lists the
	// first MaxParts.
	Cut      bool
	Children []Part
	Inner    *Part
	// Lines is the body's line count as BODYSTRUCTURE gives it (leaves and
	// messages).
	Lines int64
	Enc   Enc
	// Decoded is the body's size with Enc undone; DecodeErr says the
	// decoder failed on it (a BINARY of it is then empty, as in the
	// library).
	Decoded   int64
	DecodeErr bool
}

// Table is a message's part table.
type Table struct {
	Size int64
	// HeaderLen is fts.HeaderLen of the message: where ENVELOPE, HEADER
	// and TEXT cut it.
	HeaderLen int64
	Root      Part
}

// MediaType is a part's media type and parameters as BODYSTRUCTURE reads
// them: a missing or unreadable Content-Type is text/plain, or
// message/rfc822 in a multipart/digest (RFC 2045 §5.2, RFC 2046 §5.1.5).
func MediaType(rh textproto.Header, parent string) (string, map[string]string) {
	h := gomessage.Header{Header: rh}
	mediaType, params, err := h.ContentType()
	if !rh.Has("Content-Type") || err != nil || !strings.Contains(mediaType, "/") {
		params = nil
		mediaType = "text/plain"
		if parent == "multipart/digest" && !rh.Has("Content-Type") {
			mediaType = "message/rfc822"
		}
	}
	return strings.ToLower(mediaType), params
}

// IsMessage reports whether a media type (MediaType's) is an encapsulated
// message.
func IsMessage(mediaType string) bool {
	return mediaType == "message/rfc822" || mediaType == "message/global"
}

// Encoding is the transfer encoding BINARY undoes for a part with header
// rh, as the patched imapserver.transferDecoder decides it: a multipart's
// is ignored (RFC 2045 §6.4 allows only identity encodings there).
func Encoding(rh textproto.Header) Enc {
	h := gomessage.Header{Header: rh}
	if mediaType, _, _ := h.ContentType(); strings.HasPrefix(mediaType, "multipart/") {
		return Identity
	}
	switch strings.ToLower(strings.TrimSpace(rh.Get("Content-Transfer-Encoding"))) {
	case "quoted-printable":
		return QuotedPrintable
	case "base64":
		return Base64
	case "7bit", "8bit", "binary", "":
		return Identity
	}
	return Unknown
}

// Decoder undoes enc on r, as imapserver.transferDecoder does; nil for
// Unknown.
func Decoder(enc Enc, r io.Reader) io.Reader {
	switch enc {
	case QuotedPrintable:
		return quotedprintable.NewReader(r)
	case Base64:
		return base64.NewDecoder(base64.StdEncoding, blanksAsNewlines{r})
	case Identity:
		return r
	}
	return nil
}

// blanksAsNewlines turns spaces and tabs into newlines, which the base64
// decoder skips (imapserver's, for lines with trailing blanks).
type blanksAsNewlines struct{ r io.Reader }

func (b blanksAsNewlines) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	for i, c := range p[:n] {
		if c == ' ' || c == '\t' {
			p[i] = '\n'
		}
	}
	return n, err
}

// Scan reads the message of size bytes in r once, front to back, and
// returns its part table, then reads the bodies in quoted-printable or
// base64 once more to learn their decoded sizes. It holds a few buffers
// of 4 KiB per level of nesting and one header at a time, never a body.
func Scan(r io.ReaderAt, size int64) (*Table, error) {
	src := &errReader{r: io.NewSectionReader(r, 0, size)}
	t := &Table{Size: size}
	c := &countingReader{r: src}
	br := bufio.NewReader(c)
	h, err := textproto.ReadHeader(br)
	t.Root = Part{Hdr: 0, Body: c.n - int64(br.Buffered()), End: size, HdrErr: err != nil}
	var sc scanner
	sc.entity(&t.Root, h, br, "", 0)
	if t.Root.Inner != nil {
		setEnd(t.Root.Inner, size, false)
	}
	if src.err != nil {
		return nil, src.err
	}
	if sc.parts > MaxTableParts {
		return nil, ErrTooManyParts
	}
	hl, err := headerLen(r, size)
	if err != nil {
		return nil, err
	}
	t.HeaderLen = hl
	if err := decodeSizes(r, &t.Root); err != nil {
		return nil, err
	}
	return t, nil
}

// errReader keeps the first error other than io.EOF its reader returned:
// a read that failed is the scan's error, not a message cut short.
type errReader struct {
	r   io.Reader
	err error
}

func (e *errReader) Read(p []byte) (int, error) {
	n, err := e.r.Read(p)
	if err != nil && err != io.EOF && e.err == nil {
		e.err = err
	}
	return n, err
}

// scanner counts the parts a scan found.
type scanner struct{ parts int }

// entity fills p, whose header is h and whose body body yields from
// p.Body on, as imap.partStructure walks it; p.End is the caller's. Past
// MaxTableParts it stops: the table will not be kept.
func (s *scanner) entity(p *Part, h textproto.Header, body io.Reader, parent string, depth int) {
	if s.parts++; s.parts > MaxTableParts {
		return
	}
	p.Enc = Encoding(h)
	mediaType, params := MediaType(h, parent)
	typ, _, _ := strings.Cut(mediaType, "/")
	if typ == "multipart" && params["boundary"] != "" && depth < MaxDepth {
		p.Kind = Multipart
		mr := newMultipartReader(body, params["boundary"], p.Body)
		for len(p.Children) < MaxParts {
			prt, hdr, start, err := mr.nextPart()
			if err != nil {
				break
			}
			p.Children = append(p.Children, Part{Hdr: hdr, Body: start})
			c := &p.Children[len(p.Children)-1]
			s.entity(c, prt.header, prt, mediaType, depth+1)
			prt.close()
			c.End = c.Body + prt.total
			c.Truncated = prt.err != io.EOF
			if c.Inner != nil {
				setEnd(c.Inner, c.End, c.Truncated)
			}
		}
		p.Cut = len(p.Children) == MaxParts
		return
	}
	lc := &lineCounter{r: body}
	if IsMessage(mediaType) && depth < MaxDepth {
		p.Kind = Message
		br := bufio.NewReader(lc)
		ch, err := textproto.ReadHeader(br)
		p.Inner = &Part{Hdr: p.Body, Body: p.Body + lc.n - int64(br.Buffered()), HdrErr: err != nil}
		s.entity(p.Inner, ch, br, "", depth+1)
	}
	io.Copy(io.Discard, lc)
	p.Lines = lc.lines()
}

// setEnd gives an encapsulated message the end of the part holding it.
func setEnd(p *Part, end int64, truncated bool) {
	p.End, p.Truncated = end, truncated
	if p.Inner != nil {
		setEnd(p.Inner, end, truncated)
	}
}

// lineCounter counts the bytes and line ends its reader gives.
type lineCounter struct {
	r    io.Reader
	n    int64
	nl   int64
	last byte
}

func (l *lineCounter) Read(p []byte) (int, error) {
	n, err := l.r.Read(p)
	if n > 0 {
		l.n += int64(n)
		l.nl += int64(bytes.Count(p[:n], []byte("\n")))
		l.last = p[n-1]
	}
	return n, err
}

// lines is BODYSTRUCTURE's line count: the line ends, plus a last line
// without one.
func (l *lineCounter) lines() int64 {
	if l.n > 0 && l.last != '\n' {
		return l.nl + 1
	}
	return l.nl
}

// headerLen is fts.HeaderLen of the message, read from its start up to
// the first blank line.
func headerLen(r io.ReaderAt, size int64) (int64, error) {
	var first [2]byte
	n, err := r.ReadAt(first[:min(2, size)], 0)
	if err != nil && err != io.EOF {
		return 0, err
	}
	switch {
	case n >= 2 && first[0] == '\r' && first[1] == '\n':
		return 2, nil
	case n >= 1 && first[0] == '\n':
		return 1, nil
	}
	// The first "\r\n\r\n" or "\n\n" to end, read in chunks that overlap
	// by three bytes.
	buf := make([]byte, 4096+3)
	keep := 0
	for off := int64(0); off < size; {
		n, err := r.ReadAt(buf[keep:keep+int(min(4096, size-off))], off)
		if err != nil && err != io.EOF {
			return 0, err
		}
		if n == 0 {
			break
		}
		w := buf[:keep+n]
		base := off - int64(keep)
		end := int64(-1)
		if i := bytes.Index(w, []byte("\r\n\r\n")); i >= 0 {
			end = base + int64(i) + 4
		}
		if i := bytes.Index(w, []byte("\n\n")); i >= 0 && (end < 0 || base+int64(i)+2 < end) {
			end = base + int64(i) + 2
		}
		if end >= 0 {
			return end, nil
		}
		off += int64(n)
		keep = min(3, len(w))
		copy(buf, w[len(w)-keep:])
	}
	return size, nil
}

// decodeSizes fills Decoded and DecodeErr of p and the parts under it.
func decodeSizes(r io.ReaderAt, p *Part) error {
	switch p.Enc {
	case Identity:
		p.Decoded = p.End - p.Body
	case QuotedPrintable, Base64:
		src := &errReader{r: io.NewSectionReader(r, p.Body, p.End-p.Body)}
		n, err := io.Copy(io.Discard, Decoder(p.Enc, src))
		if src.err != nil {
			return src.err
		}
		p.Decoded, p.DecodeErr = n, err != nil
	}
	for i := range p.Children {
		if err := decodeSizes(r, &p.Children[i]); err != nil {
			return err
		}
	}
	if p.Inner != nil {
		return decodeSizes(r, p.Inner)
	}
	return nil
}

// ErrTable is the error of a part table's encoding that cannot be read.
var ErrTable = errors.New("mimepart: part table unreadable")

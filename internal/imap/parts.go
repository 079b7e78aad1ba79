package imap

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/emersion/go-imap/v2"
	gomessage "github.com/emersion/go-message"
	"github.com/emersion/go-message/textproto"
	"github.com/quillmail/quill/internal/mailbox"
	"github.com/quillmail/quill/internal/mimepart"
	"github.com/quillmail/quill/third_party/imapserver"
)

// Sections of a large message from its part table. A body kept as a file
// on this node comes with its part table (mimepart, made when the file was
// written), and a FETCH of a part, a part's header, a BINARY decode, the
// BODYSTRUCTURE or the ENVELOPE reads the headers on the way to the part
// and the part's range, never the whole message. What is answered is what
// the in-memory path (bodySection, imapserver.ExtractBinarySection,
// bodyStructure) answers for the same bytes, byte for byte
// (TestPartsMatchInMemory, FuzzPartScan): the walk below is
// imapserver.findMessagePart's over the table. Where the two could differ
// (a part the table did not go into, a part cut short by the end of the
// message, a header larger than maxPartHeader), the section says
// errWhole and the message is answered from its bytes as before.

// errWhole says a section is answered from the whole message, not from the
// part table.
var errWhole = errors.New("section needs the whole message")

// maxPartHeader bounds the header a section reads from the file; one
// larger (a message without a blank line is all header) is answered from
// the whole message.
const maxPartHeader = 1 << 20

// partsBody is a large message's bytes with its part table.
type partsBody struct {
	id      string // the message's, for errors
	r       io.ReaderAt
	t       *mimepart.Table
	headers map[*mimepart.Part]headerBytes
}

type headerBytes struct {
	h   textproto.Header
	raw []byte
}

func newPartsBody(id string, r io.ReaderAt, t *mimepart.Table) *partsBody {
	return &partsBody{id: id, r: r, t: t, headers: map[*mimepart.Part]headerBytes{}}
}

// read reads n bytes from off.
func (b *partsBody) read(off, n int64) ([]byte, error) {
	buf := make([]byte, n)
	if _, err := b.r.ReadAt(buf, off); err != nil && !(err == io.EOF && n == 0) {
		return nil, fmt.Errorf("message %s: reading %d bytes of its body at %d: %w", b.id, n, off, err)
	}
	return buf, nil
}

// header reads and parses a part's header, as far as it parses (as the
// library reads it: its error says only that it stopped, HdrErr).
func (b *partsBody) header(p *mimepart.Part) (textproto.Header, []byte, error) {
	if hb, ok := b.headers[p]; ok {
		return hb.h, hb.raw, nil
	}
	if p.Body-p.Hdr > maxPartHeader {
		return textproto.Header{}, nil, errWhole
	}
	raw, err := b.read(p.Hdr, p.Body-p.Hdr)
	if err != nil {
		return textproto.Header{}, nil, err
	}
	h, _ := textproto.ReadHeader(bufio.NewReader(bytes.NewReader(raw)))
	b.headers[p] = headerBytes{h, raw}
	return h, raw, nil
}

// topHeader is the message's header as fts.HeaderLen cuts it (ENVELOPE,
// HEADER.FIELDS).
func (b *partsBody) topHeader() ([]byte, error) {
	if b.t.HeaderLen > maxPartHeader {
		return nil, errWhole
	}
	return b.read(0, b.t.HeaderLen)
}

// contentType is a header's media type as the library's section walk
// reads it (go-message: the raw value when it does not parse).
func contentType(h textproto.Header) (string, map[string]string) {
	mh := gomessage.Header{Header: h}
	t, params, _ := mh.ContentType()
	return t, params
}

// open is imapserver.openMessagePart: an encapsulated message's part
// stands for the message it holds.
func (b *partsBody) open(p *mimepart.Part, h textproto.Header, parent string) (*mimepart.Part, textproto.Header, error) {
	mt, _ := contentType(h)
	if !h.Has("Content-Type") && parent == "multipart/digest" {
		mt = "message/rfc822"
	}
	if !mimepart.IsMessage(mt) {
		return p, h, nil
	}
	if p.Inner == nil {
		return nil, h, errWhole // the table did not read into it (too deep)
	}
	ih, _, err := b.header(p.Inner)
	return p.Inner, ih, err
}

// locate is imapserver.findMessagePart over the table: the part a section
// path names, its header and its parent's media type; a nil part when the
// library finds none (its answer is then empty).
func (b *partsBody) locate(path []int) (*mimepart.Part, textproto.Header, string, error) {
	p := &b.t.Root
	if p.HdrErr {
		return nil, textproto.Header{}, "", nil // the library gives up on such a message
	}
	h, _, err := b.header(p)
	if err != nil {
		return nil, h, "", err
	}
	if mt, _ := contentType(h); !strings.HasPrefix(mt, "multipart/") && len(path) > 0 && path[0] == 1 {
		path = path[1:] // part 1 of a message that is not multipart is its body
	}
	parent := ""
	for _, num := range path {
		if p, h, err = b.open(p, h, parent); err != nil {
			return nil, h, "", err
		}
		mt, params := contentType(h)
		if !strings.HasPrefix(mt, "multipart/") {
			if num != 1 {
				return nil, h, "", nil
			}
			continue
		}
		if params["boundary"] == "" || num < 1 {
			return nil, h, "", nil
		}
		if p.Kind != mimepart.Multipart || p.Truncated {
			return nil, h, "", errWhole
		}
		if num > len(p.Children) {
			if p.Cut {
				return nil, h, "", errWhole
			}
			return nil, h, "", nil
		}
		parent = mt
		p = &p.Children[num-1]
		if p.Truncated {
			// The library's read of it fails at the end of the message;
			// what it then answers is left to it.
			return nil, h, "", errWhole
		}
		if h, _, err = b.header(p); err != nil {
			return nil, h, "", err
		}
	}
	return p, h, parent, nil
}

// rangeSection is a section that is a range of the message's bytes.
func (b *partsBody) rangeSection(off, n int64, p *imap.SectionPartial) section {
	if p != nil {
		if p.Offset < 0 || p.Offset >= n || p.Size <= 0 {
			return section{io.NopCloser(strings.NewReader("")), 0}
		}
		off, n = off+p.Offset, min(p.Size, n-p.Offset)
	}
	return section{io.NopCloser(io.NewSectionReader(b.r, off, n)), n}
}

func bytesSection(b []byte) section {
	return section{io.NopCloser(bytes.NewReader(b)), int64(len(b))}
}

// bodySection answers BODY[section]<partial> as bodySection does.
func (b *partsBody) bodySection(sec *imap.FetchItemBodySection) (section, error) {
	fields := len(sec.HeaderFields) > 0 || len(sec.HeaderFieldsNot) > 0
	if len(sec.Part) == 0 && !fields {
		switch sec.Specifier {
		case imap.PartSpecifierNone:
			return b.rangeSection(0, b.t.Size, sec.Partial), nil
		case imap.PartSpecifierHeader:
			return b.rangeSection(0, b.t.HeaderLen, sec.Partial), nil
		case imap.PartSpecifierText:
			return b.rangeSection(b.t.HeaderLen, b.t.Size-b.t.HeaderLen, sec.Partial), nil
		}
		return bytesSection(nil), nil
	}
	if len(sec.Part) == 0 && sec.Specifier == imap.PartSpecifierHeader {
		top, err := b.topHeader()
		if err != nil {
			return section{}, err
		}
		if out, ok := filterHeader(top, sec.HeaderFields, sec.HeaderFieldsNot); ok {
			return bytesSection(partial(out, sec.Partial)), nil
		}
	}
	// imapserver.ExtractBodySection from here.
	p, h, parent, err := b.locate(sec.Part)
	if err != nil || p == nil {
		return bytesSection(nil), err
	}
	if len(sec.Part) > 0 && (sec.Specifier == imap.PartSpecifierHeader || sec.Specifier == imap.PartSpecifierText) {
		if p, h, err = b.open(p, h, parent); err != nil {
			return section{}, err
		}
	}
	writeHeader := sec.Specifier != imap.PartSpecifierText && (sec.Specifier != imap.PartSpecifierNone || len(sec.Part) == 0)
	writeBody := sec.Specifier == imap.PartSpecifierNone || sec.Specifier == imap.PartSpecifierText
	if writeHeader && writeBody {
		return section{}, errWhole // the whole message with a filtered header: not asked in practice
	}
	if writeBody {
		return b.rangeSection(p.Body, p.End-p.Body, sec.Partial), nil
	}
	h = h.Copy()
	if len(sec.HeaderFields) > 0 {
		keep := make(map[string]struct{})
		for _, k := range sec.HeaderFields {
			keep[strings.ToLower(k)] = struct{}{}
		}
		for f := h.Fields(); f.Next(); {
			if _, ok := keep[strings.ToLower(f.Key())]; !ok {
				f.Del()
			}
		}
	}
	for _, k := range sec.HeaderFieldsNot {
		h.Del(k)
	}
	var buf bytes.Buffer
	if err := textproto.WriteHeader(&buf, h); err != nil {
		return bytesSection(nil), nil
	}
	return bytesSection(partial(buf.Bytes(), sec.Partial)), nil
}

// binary answers BINARY[part]<partial> (size < 0) or gives the size of
// BINARY[part] as imapserver.ExtractBinarySection does: the part's body
// with its transfer encoding undone, decoded as it is sent from the part's
// range; ErrUnknownCTE for an encoding it cannot undo (RFC 3516 §4.2).
func (b *partsBody) binary(part []int, pp *imap.SectionPartial) (section, int64, error) {
	p, h, _, err := b.locate(part)
	if err != nil || p == nil {
		return bytesSection(nil), 0, err
	}
	enc := mimepart.Encoding(h)
	if enc == mimepart.Unknown {
		return section{}, 0, imapserver.ErrUnknownCTE
	}
	if enc != p.Enc {
		return section{}, 0, errWhole
	}
	if p.DecodeErr {
		return bytesSection(nil), 0, nil // the library's decode fails: nothing
	}
	var head []byte
	if len(part) == 0 {
		var buf bytes.Buffer
		if err := textproto.WriteHeader(&buf, h); err != nil {
			return bytesSection(nil), 0, nil
		}
		head = buf.Bytes()
	}
	total := int64(len(head)) + p.Decoded
	off, n := int64(0), total
	if pp != nil {
		if pp.Offset > total {
			return bytesSection(nil), total, nil
		}
		off, n = pp.Offset, min(pp.Size, total-pp.Offset)
	}
	body := mimepart.Decoder(p.Enc, io.NewSectionReader(b.r, p.Body, p.End-p.Body))
	r := io.MultiReader(bytes.NewReader(head), body)
	if _, err := io.CopyN(io.Discard, r, off); err != nil {
		return section{}, 0, fmt.Errorf("BINARY[%s]: decoding to offset %d: %w", partString(part), off, err)
	}
	return section{io.NopCloser(io.LimitReader(r, n)), n}, total, nil
}

// structure is bodyStructure over the table.
func (b *partsBody) structure(p *mimepart.Part, parent string, depth int) (imap.BodyStructure, error) {
	rh, _, err := b.header(p)
	if err != nil {
		return nil, err
	}
	mediaType, params := mimepart.MediaType(rh, parent)
	_, sub, _ := strings.Cut(mediaType, "/")
	if p.Kind == mimepart.Multipart {
		bs := multiStructure(rh, sub, params)
		for i := range p.Children {
			c, err := b.structure(&p.Children[i], mediaType, depth+1)
			if err != nil {
				return nil, err
			}
			bs.Children = append(bs.Children, c)
		}
		return withAChild(bs), nil
	}
	var msg *imap.BodyStructureMessageRFC822
	if p.Kind == mimepart.Message {
		ch, _, err := b.header(p.Inner)
		if err != nil {
			return nil, err
		}
		inner, err := b.structure(p.Inner, "", depth+1)
		if err != nil {
			return nil, err
		}
		msg = &imap.BodyStructureMessageRFC822{Envelope: envelopeOf(ch), BodyStructure: inner, NumLines: p.Lines}
	}
	return singleStructure(rh, mediaType, params, p.End-p.Body, p.Lines, msg), nil
}

// BodyParter is a Store that opens a large message's body with its part
// table (mailbox.Manager.OpenParts), so that a FETCH of its sections reads
// only their ranges.
type BodyParter interface {
	// OpenParts returns the body and its table when the message is a
	// large body held on this node, and a nil table (and body) when it
	// is not: it is then read whole (Store.Body).
	OpenParts(ctx context.Context, user, id string) (mailbox.BodyReader, *mimepart.Table, error)
}

// partsAnswer is what a FETCH of one message answers from the part table,
// made before the message's response starts (an unknown transfer encoding
// fails the FETCH without half a response).
type partsAnswer struct {
	header    []byte // the message's header, for ENVELOPE
	structure imap.BodyStructure
	body      []section // by options.BodySection
	bins      []section // by options.BinarySection
	binSizes  []uint32  // by options.BinarySectionSize
	file      io.Closer // the body file the sections read
}

// opened is the sections to close once the message's response is written,
// the file with them.
func (a *partsAnswer) opened() []section {
	out := append(append([]section(nil), a.body...), a.bins...)
	return append(out, section{r: struct {
		io.Reader
		io.Closer
	}{nil, a.file}})
}

// fromParts answers a message's FETCH items from its body file and part
// table, or returns the message's bytes when it has no table here (a small
// body, or one held on other nodes only: fetched whole from them) or an
// item needs them whole (errWhole).
func (s *session) fromParts(bp BodyParter, id string, options *imap.FetchOptions) (*partsAnswer, []byte, error) {
	r, t, err := bp.OpenParts(s.ctx(), s.user, id)
	if err != nil {
		return nil, nil, err
	}
	if t == nil {
		raw, err := s.srv.store.Body(s.ctx(), s.user, id)
		return nil, raw, err
	}
	defer func() {
		if r != nil {
			r.Close()
		}
	}()
	a, err := answerFromParts(newPartsBody(id, r, t), options)
	if a != nil {
		a.file = r
	}
	if errors.Is(err, errWhole) {
		raw := make([]byte, r.Size())
		if _, err := r.ReadAt(raw, 0); err != nil && !(err == io.EOF && len(raw) == 0) {
			return nil, nil, fmt.Errorf("message %s: reading its body: %w", id, err)
		}
		return nil, raw, nil
	}
	if err != nil {
		return nil, nil, err
	}
	// The sections read r as they are sent: it is closed with them.
	r = nil
	return a, nil, nil
}

func answerFromParts(b *partsBody, options *imap.FetchOptions) (a *partsAnswer, err error) {
	a = &partsAnswer{}
	defer func() {
		if err != nil {
			closeSections(a.body)
			closeSections(a.bins)
		}
	}()
	if options.Envelope {
		if a.header, err = b.topHeader(); err != nil {
			return a, err
		}
	}
	if options.BodyStructure != nil {
		if a.structure, err = b.structure(&b.t.Root, "", 0); err != nil {
			return a, err
		}
	}
	for _, bs := range options.BodySection {
		sec, err := b.bodySection(bs)
		if err != nil {
			return a, err
		}
		a.body = append(a.body, sec)
	}
	for _, bs := range options.BinarySection {
		sec, _, err := b.binary(bs.Part, bs.Partial)
		if err != nil {
			return a, binaryErr(bs.Part, err)
		}
		a.bins = append(a.bins, sec)
	}
	for _, bs := range options.BinarySectionSize {
		_, n, err := b.binary(bs.Part, nil)
		if err != nil {
			return a, binaryErr(bs.Part, err)
		}
		a.binSizes = append(a.binSizes, uint32(n))
	}
	return a, nil
}

package imap

import (
	"bufio"
	"bytes"
	"io"
	"slices"
	"strings"

	"github.com/emersion/go-imap/v2"
	gomessage "github.com/emersion/go-message"
	"github.com/emersion/go-message/textproto"
	"github.com/quillmail/quill/internal/fts"
	"github.com/quillmail/quill/internal/mimepart"
	"github.com/quillmail/quill/third_party/imapserver"
)

// maxMIMEDepth bounds how deep BODYSTRUCTURE and SEARCH descend into nested
// multiparts and message/rfc822 parts; deeper parts are treated as opaque
// leaves. Real mail nests a few levels.
const maxMIMEDepth = fts.MaxMIMEDepth

// headerLen returns the length of the message header including the empty
// line that ends it.
func headerLen(raw []byte) int { return fts.HeaderLen(raw) }

// bodySection returns the bytes of a FETCH BODY[section]<partial> (RFC 9051
// §6.4.5). The whole message, its header and its text are cut from the
// stored bytes directly, so they are exact; parts and header-field subsets
// go through the library's MIME walker.
func bodySection(raw []byte, sec *imap.FetchItemBodySection) []byte {
	var b []byte
	if len(sec.Part) == 0 && len(sec.HeaderFields) == 0 && len(sec.HeaderFieldsNot) == 0 {
		h := headerLen(raw)
		switch sec.Specifier {
		case imap.PartSpecifierNone:
			b = raw
		case imap.PartSpecifierHeader:
			b = raw[:h]
		case imap.PartSpecifierText:
			b = raw[h:]
		default:
			b = nil
		}
		return partial(b, sec.Partial)
	}
	if len(sec.Part) == 0 && sec.Specifier == imap.PartSpecifierHeader {
		if b, ok := filterHeader(raw[:headerLen(raw)], sec.HeaderFields, sec.HeaderFieldsNot); ok {
			return partial(b, sec.Partial)
		}
	}
	return imapserver.ExtractBodySection(bytes.NewReader(raw), sec)
}

// filterHeader answers HEADER.FIELDS and HEADER.FIELDS.NOT of a message's
// header without parsing it into a map: the fields kept, as they are, in
// their order, then the blank line. It is what a client lists a mailbox
// with, and the parse cost more than the rest of the FETCH. A header it
// cannot read plainly (a bare LF, a line without a colon, a name that is not
// printable ASCII)
// is left to the library (ok false); FuzzFilterHeader holds the two to
// the same answers.
func filterHeader(hdr []byte, fields, not []string) ([]byte, bool) {
	keep := func(name []byte) bool {
		if len(fields) > 0 && !slices.ContainsFunc(fields, func(f string) bool { return strings.EqualFold(f, string(name)) }) {
			return false
		}
		return !slices.ContainsFunc(not, func(f string) bool { return strings.EqualFold(f, string(name)) })
	}
	out := make([]byte, 0, 256)
	taking, inField := false, false
	for len(hdr) > 0 {
		i := bytes.IndexByte(hdr, '\n')
		if i < 1 || hdr[i-1] != '\r' || bytes.IndexByte(hdr[:i], 0) >= 0 {
			return nil, false
		}
		line := hdr[:i+1]
		hdr = hdr[i+1:]
		switch {
		case i == 1: // the blank line: the end
			if len(hdr) > 0 {
				return nil, false
			}
			return append(out, "\r\n"...), true
		case line[0] == ' ' || line[0] == '\t':
			if !inField {
				return nil, false // folding before any field
			}
			if taking {
				out = append(out, line...)
			}
		default:
			colon := bytes.IndexByte(line, ':')
			if colon < 1 || slices.ContainsFunc(line[:colon], func(c byte) bool { return c < 33 || c > 126 }) {
				return nil, false // not a field name (RFC 5322 §3.6.8): the library's call
			}
			taking, inField = keep(line[:colon]), true
			if taking {
				out = append(out, line...)
			}
		}
	}
	return nil, false // no blank line: a header cut short
}

func partial(b []byte, p *imap.SectionPartial) []byte {
	if p == nil {
		return b
	}
	if p.Offset < 0 || p.Offset >= int64(len(b)) || p.Size <= 0 {
		return []byte{}
	}
	end := int64(len(b))
	if p.Size < end-p.Offset {
		end = p.Offset + p.Size
	}
	return b[p.Offset:end]
}

func readHeader(raw []byte) textproto.Header { return fts.ReadHeader(raw) }

// envelope builds the ENVELOPE of a message (RFC 9051 §7.5.2) from its
// header. The library's ExtractEnvelope decodes the subject and its writer
// re-encodes it, and it loses groups and unusual addresses (see addr.go);
// envelopeOf keeps what the message says.
func envelope(raw []byte) *imap.Envelope {
	return envelopeOf(readHeader(raw))
}

func unfold(s string) string { return fts.Unfold(s) }

// bodyStructure builds BODY/BODYSTRUCTURE (RFC 9051 §7.5.2). It replaces
// the library's ExtractBodyStructure, which omits the default charset of a
// part without Content-Type (RFC 2045 §5.2: text/plain; charset=us-ascii),
// ignores that parts of multipart/digest default to message/rfc822 (RFC 2046
// §5.1.5), recurses without a depth limit, and returns a multipart with no
// children for a body without parts, which its own writer then panics on.
func bodyStructure(raw []byte) imap.BodyStructure {
	br := bufio.NewReader(bytes.NewReader(raw))
	h, _ := textproto.ReadHeader(br)
	return partStructure(h, br, "", 0)
}

func partStructure(rh textproto.Header, body io.Reader, parent string, depth int) imap.BodyStructure {
	mediaType, params := mimepart.MediaType(rh, parent)
	typ, sub, _ := strings.Cut(mediaType, "/")
	if typ == "multipart" && params["boundary"] != "" && depth < maxMIMEDepth {
		bs := multiStructure(rh, sub, params)
		mr := textproto.NewMultipartReader(body, params["boundary"])
		for len(bs.Children) < maxParts {
			p, err := mr.NextPart()
			if err != nil {
				break
			}
			bs.Children = append(bs.Children, partStructure(p.Header, p, mediaType, depth+1))
		}
		return withAChild(bs)
	}
	data, _ := io.ReadAll(io.LimitReader(body, 1<<31-1))
	lines := textLines(data)
	var msg *imap.BodyStructureMessageRFC822
	if mimepart.IsMessage(mediaType) && depth < maxMIMEDepth {
		br := bufio.NewReader(bytes.NewReader(data))
		ch, _ := textproto.ReadHeader(br)
		msg = &imap.BodyStructureMessageRFC822{
			Envelope:      envelopeOf(ch),
			BodyStructure: partStructure(ch, br, "", depth+1),
			NumLines:      lines,
		}
	}
	return singleStructure(rh, mediaType, params, int64(len(data)), lines, msg)
}

// multiStructure is what a multipart's header says of it in BODYSTRUCTURE;
// its children are the caller's.
func multiStructure(rh textproto.Header, sub string, params map[string]string) *imap.BodyStructureMultiPart {
	h := gomessage.Header{Header: rh}
	return &imap.BodyStructureMultiPart{Subtype: sub, Extended: &imap.BodyStructureMultiPartExt{
		Params: params, Disposition: disposition(h), Language: language(h), Location: h.Get("Content-Location")}}
}

// withAChild gives a multipart without parts one: RFC 9051 body-type-mpart
// needs one, so it is said to be empty text.
func withAChild(bs *imap.BodyStructureMultiPart) *imap.BodyStructureMultiPart {
	if len(bs.Children) == 0 {
		bs.Children = append(bs.Children, &imap.BodyStructureSinglePart{Type: "text", Subtype: "plain",
			Params: map[string]string{"charset": "us-ascii"}, Text: &imap.BodyStructureText{},
			Extended: &imap.BodyStructureSinglePartExt{}})
	}
	return bs
}

// singleStructure is the BODYSTRUCTURE of a part that is not a multipart
// (or one without a boundary, or too deep), of size bytes in lines lines;
// msg is what an encapsulated message holds, nil if it was not read.
func singleStructure(rh textproto.Header, mediaType string, params map[string]string, size, lines int64, msg *imap.BodyStructureMessageRFC822) *imap.BodyStructureSinglePart {
	h := gomessage.Header{Header: rh}
	typ, sub, _ := strings.Cut(mediaType, "/")
	if typ == "text" && params["charset"] == "" {
		// RFC 2045 §5.2: the default charset is us-ascii.
		if params == nil {
			params = map[string]string{}
		}
		params["charset"] = "us-ascii"
	}
	if typ == "multipart" {
		// No boundary (or too deep): the parts cannot be told apart.
		typ, sub = "text", "plain"
	}
	bs := &imap.BodyStructureSinglePart{
		Type: typ, Subtype: sub, Params: params,
		ID:          h.Get("Content-Id"),
		Description: h.Get("Content-Description"),
		Encoding:    strings.ToLower(strings.TrimSpace(h.Get("Content-Transfer-Encoding"))),
		Size:        uint32(min(size, 1<<31-1)),
		Extended:    &imap.BodyStructureSinglePartExt{Disposition: disposition(h), Language: language(h), Location: h.Get("Content-Location")},
	}
	if bs.Encoding == "" {
		bs.Encoding = "7bit"
	}
	if msg != nil {
		bs.MessageRFC822 = msg
	} else if mimepart.IsMessage(mediaType) {
		bs.Type, bs.Subtype = "application", "octet-stream"
	}
	if typ == "text" {
		bs.Text = &imap.BodyStructureText{NumLines: lines}
	}
	return bs
}

// maxParts bounds the parts of one multipart that BODYSTRUCTURE lists.
const maxParts = mimepart.MaxParts

func disposition(h gomessage.Header) *imap.BodyStructureDisposition {
	d, params, err := h.ContentDisposition()
	if err != nil || d == "" {
		return nil
	}
	return &imap.BodyStructureDisposition{Value: d, Params: params}
}

func language(h gomessage.Header) []string {
	v := h.Get("Content-Language")
	if v == "" {
		return nil
	}
	var out []string
	for _, l := range strings.Split(v, ",") {
		if l = strings.TrimSpace(l); l != "" {
			out = append(out, l)
		}
	}
	return out
}

// textLines counts the lines of a body: its line ends, plus a last line
// without one (the CRLF before a boundary belongs to the boundary, RFC 2046
// §5.1.1, so a part's last line usually has none).
func textLines(b []byte) int64 {
	n := int64(bytes.Count(b, []byte("\n")))
	if len(b) > 0 && b[len(b)-1] != '\n' {
		n++
	}
	return n
}

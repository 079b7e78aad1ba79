// Package fts is the text side of IMAP SEARCH: the text a message offers to
// SEARCH (its header as written and as decoded, the decoded text of its text
// parts), that text cut into the terms the node's text index keeps, and a
// SEARCH string turned into the terms any message it matches must hold.
//
// IMAP SEARCH matches substrings, case-insensitively (RFC 9051 §6.4.4), not
// words, so the index is a filter: the messages it leaves out cannot match,
// and those it keeps are matched against their bytes as before. Whatever the
// index holds, a SEARCH answers what it would answer without one; only its
// speed changes. The index lives beside the message replicas on each node
// (mailbox/textindex.go), so repair and re-homing rebuild it with the
// replicas (Porcupine §4 keeps a message's data with its replicas; the papers
// have no text search of their own).
//
// Written by hand: bleve and the other Go full-text libraries match words
// with ranking and keep their own files, outside Pebble's batches and the
// replicas' lifecycle, while SEARCH needs a filter that is never narrower
// than substring match. Terms are runs of letters and digits; a needle's
// term must be contained in some term of the message (so a needle that
// starts or ends inside a word still finds it), and the Subject is also kept
// whole, so SUBJECT "topic 7" is answered exactly, without reading the
// messages it matches (Sure).
package fts

import (
	"bufio"
	"bytes"
	"io"
	"mime"
	"strings"
	"unicode"
	"unicode/utf8"

	gomessage "github.com/emersion/go-message"
	_ "github.com/emersion/go-message/charset" // decode text in any charset
	"github.com/emersion/go-message/textproto"
)

// MaxMIMEDepth bounds how deep the text of nested multiparts and
// message/rfc822 parts is read; real mail nests a few levels.
const MaxMIMEDepth = 32

// maxText bounds how much text one message contributes to a search or to
// the index.
const maxText = 32 << 20

// HeaderLen returns the length of the message header including the empty
// line that ends it (RFC 5322 §2.1); a message without that line is all
// header.
func HeaderLen(raw []byte) int {
	if bytes.HasPrefix(raw, []byte("\r\n")) {
		return 2
	}
	if bytes.HasPrefix(raw, []byte("\n")) {
		return 1
	}
	end := len(raw)
	if i := bytes.Index(raw, []byte("\r\n\r\n")); i >= 0 {
		end = i + 4
	}
	if i := bytes.Index(raw, []byte("\n\n")); i >= 0 && i+2 < end {
		end = i + 2
	}
	return end
}

// ReadHeader parses a message's header, as far as it parses.
func ReadHeader(raw []byte) textproto.Header {
	h, _ := textproto.ReadHeader(bufio.NewReader(bytes.NewReader(raw[:HeaderLen(raw)])))
	return h
}

// Unfold joins a folded header value's lines (RFC 5322 §2.2.3).
func Unfold(s string) string {
	s = strings.ReplaceAll(s, "\r\n", "")
	return strings.ReplaceAll(s, "\n", "")
}

var wordDecoder = &mime.WordDecoder{CharsetReader: gomessage.CharsetReader}

// DecodeHeader decodes the RFC 2047 encoded words of a header value.
func DecodeHeader(v string) (string, error) { return wordDecoder.DecodeHeader(v) }

// BodyText returns the text BODY and TEXT search, lower-cased: each part's
// header and content as written, except the content of base64 parts (no
// text anyone searches for, and it would fill the index with noise), and
// the decoded text of every text part (transfer encoding and charset
// undone). A multipart's preamble, epilogue and boundary lines are not
// searched; a multipart or message part that does not parse is searched as
// written.
func BodyText(raw []byte) string {
	var b strings.Builder
	br := bufio.NewReader(bytes.NewReader(raw))
	h, err := textproto.ReadHeader(br)
	if err != nil {
		b.Write(raw[HeaderLen(raw):])
	} else {
		partText(&b, h, br, 0)
	}
	return strings.ToLower(b.String())
}

// partText appends an entity's searchable text: the headers of its parts as
// written, the content of each part not in base64, and the decoded content
// of its text parts.
func partText(b *strings.Builder, h textproto.Header, body io.Reader, depth int) {
	if b.Len() > maxText {
		return
	}
	mh := gomessage.Header{Header: h}
	mt, params, _ := mh.ContentType()
	switch {
	case depth < MaxMIMEDepth && strings.HasPrefix(mt, "multipart/") && params["boundary"] != "":
		// A multipart whose parts cannot be found (a boundary that never
		// appears) is searched as written, like a leaf.
		content, _ := io.ReadAll(io.LimitReader(body, int64(maxText-b.Len())))
		mr := textproto.NewMultipartReader(bytes.NewReader(content), params["boundary"])
		parts := 0
		for {
			p, err := mr.NextPart()
			if err != nil {
				break
			}
			parts++
			textproto.WriteHeader(b, p.Header)
			partText(b, p.Header, p, depth+1)
		}
		if parts == 0 {
			b.Write(content)
		}
	case depth < MaxMIMEDepth && (mt == "message/rfc822" || mt == "message/global"):
		content, _ := io.ReadAll(io.LimitReader(body, int64(maxText-b.Len())))
		br := bufio.NewReader(bytes.NewReader(content))
		ch, err := textproto.ReadHeader(br)
		if err != nil {
			b.Write(content) // searched as written
			return
		}
		textproto.WriteHeader(b, ch)
		partText(b, ch, br, depth+1)
	default:
		content, _ := io.ReadAll(io.LimitReader(body, int64(maxText-b.Len())))
		cte := strings.ToLower(strings.TrimSpace(h.Get("Content-Transfer-Encoding")))
		if cte != "base64" {
			b.Write(content)
		}
		if mt != "" && !strings.HasPrefix(mt, "text/") {
			return
		}
		if plain(cte, params["charset"]) {
			return // the content as written is its text
		}
		e, err := gomessage.New(mh, bytes.NewReader(content))
		if e == nil || (err != nil && !gomessage.IsUnknownCharset(err) && !gomessage.IsUnknownEncoding(err)) {
			return
		}
		b.WriteByte('\n')
		io.Copy(b, io.LimitReader(e.Body, int64(max(maxText-b.Len(), 0))))
	}
}

// plain reports whether a part's decoded text is its content as written.
func plain(cte, charset string) bool {
	switch cte {
	case "", "7bit", "8bit", "binary":
	default:
		return false
	}
	switch strings.ToLower(charset) {
	case "", "us-ascii", "utf-8", "utf8":
		return true
	}
	return false
}

// Fields of the index. A field holds terms: the tokens of some text, or
// for FieldSubject whole values.
const (
	FieldBody    = "b" // tokens of BodyText
	FieldHeader  = "h" // tokens of the header as written and of every field decoded
	FieldSubject = "s" // Subject values whole, as written (unfolded) and decoded
	fieldAddr    = "a" // + name: tokens of that address field's values
)

// LongValue is the term a whole-value field holds for a value too long to
// keep whole; its messages are candidates for every needle.
const LongValue = "\x00long"

// maxValue is the longest value a whole-value field keeps.
const maxValue = 512

// Token sizes: a token up to maxToken bytes is a term; a longer one is kept
// as windows of maxToken bytes every maxToken/2, so any piece of it up to
// maxToken/2+1 bytes lies inside one window. A needle's token is matched by
// its first maxToken/2 bytes.
const (
	maxToken    = 64
	needleToken = maxToken / 2
)

// addrFields are the header fields whose tokens have a field of their own,
// for FROM, TO, CC, BCC and HEADER on them.
var addrFields = map[string]bool{"from": true, "to": true, "cc": true, "bcc": true, "sender": true, "reply-to": true}

// Terms returns the terms of a message, by field.
func Terms(raw []byte) map[string][]string {
	sets := map[string]map[string]bool{}
	add := func(field, term string) {
		s := sets[field]
		if s == nil {
			s = map[string]bool{}
			sets[field] = s
		}
		s[term] = true
	}
	tokens := func(field, text string) { Tokens(text, func(t string) { add(field, t) }) }

	hl := HeaderLen(raw)
	tokens(FieldHeader, strings.ToLower(string(raw[:hl])))
	h := ReadHeader(raw)
	for f := h.Fields(); f.Next(); {
		key := strings.ToLower(f.Key())
		v := Unfold(f.Value())
		lv := strings.ToLower(v)
		var dv string
		if d, err := DecodeHeader(v); err == nil {
			dv = strings.ToLower(d)
			tokens(FieldHeader, dv)
		}
		switch {
		case key == "subject":
			for _, s := range []string{lv, dv} {
				if len(s) > maxValue {
					add(FieldSubject, LongValue)
				} else {
					add(FieldSubject, s)
				}
			}
		case addrFields[key]:
			tokens(fieldAddr+key, lv)
			tokens(fieldAddr+key, dv)
			// SEARCH also matches each address as parsed: comments,
			// quotes and folding inside it gone, placeholders for a
			// missing part (ParseAddressList).
			for _, a := range ParseAddressList(v) {
				tokens(fieldAddr+key, strings.ToLower(a.Mailbox+"@"+a.Host))
				tokens(fieldAddr+key, strings.ToLower(a.Name))
			}
		}
	}
	tokens(FieldBody, BodyText(raw))

	out := make(map[string][]string, len(sets))
	for f, s := range sets {
		list := make([]string, 0, len(s))
		for t := range s {
			list = append(list, t)
		}
		out[f] = list
	}
	return out
}

// Tokens calls fn for each term of lower-cased text: each run of letters
// and digits, a run longer than maxToken bytes as overlapping windows.
func Tokens(text string, fn func(string)) {
	start := -1
	flush := func(end int) {
		if start < 0 {
			return
		}
		tok := text[start:end]
		start = -1
		if len(tok) <= maxToken {
			fn(tok)
			return
		}
		for i := 0; i < len(tok); i += maxToken / 2 {
			fn(tok[i:min(i+maxToken, len(tok))])
			if i+maxToken >= len(tok) {
				break
			}
		}
	}
	for i, r := range text {
		if r != utf8.RuneError && (unicode.IsLetter(r) || unicode.IsDigit(r)) {
			if start < 0 {
				start = i
			}
			continue
		}
		flush(i)
	}
	flush(len(text))
}

// Query is one SEARCH string criterion for the index: a message matches
// only if the needle is in one of the fields.
type Query struct {
	Fields []string
	Needle string
}

// QueryText, QueryBody and QueryHeader return the query for SEARCH TEXT,
// BODY and HEADER (SUBJECT, FROM, TO, CC and BCC are HEADER on that field).
// ok is false when the index cannot narrow the search (an empty HEADER
// value matches every message with the field).
func QueryText(needle string) (Query, bool) {
	return Query{Fields: []string{FieldHeader, FieldBody}, Needle: needle}, needle != ""
}

func QueryBody(needle string) (Query, bool) {
	return Query{Fields: []string{FieldBody}, Needle: needle}, needle != ""
}

func QueryHeader(key, needle string) (Query, bool) {
	key = strings.ToLower(key)
	switch {
	case needle == "":
		return Query{}, false
	case key == "subject":
		return Query{Fields: []string{FieldSubject}, Needle: needle}, true
	case addrFields[key]:
		return Query{Fields: []string{fieldAddr + key}, Needle: needle}, true
	}
	return Query{Fields: []string{FieldHeader}, Needle: needle}, true
}

// AddressField reports whether a header field (lower-case name) holds
// addresses that SEARCH matches as parsed too.
func AddressField(key string) bool { return addrFields[key] }

// Whole reports whether a field keeps values whole rather than tokens:
// exactly the values SEARCH compares for its header key, so that the index
// can prove a match as well as rule one out (Sure).
func Whole(field string) bool { return field == FieldSubject }

// NeedleTokens returns the pieces of a needle that every term-holding field
// of a matching message contains: each of its tokens, cut to needleToken
// bytes.
func NeedleTokens(needle string) []string {
	var out []string
	Tokens(strings.ToLower(needle), func(t string) {
		if len(t) > needleToken {
			t = t[:needleToken]
		}
		out = append(out, t)
	})
	return out
}

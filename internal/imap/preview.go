package imap

import (
	"bufio"
	"bytes"
	"html"
	"io"
	"strings"
	"unicode/utf8"

	gomessage "github.com/emersion/go-message"
	"github.com/emersion/go-message/textproto"
)

// maxPreview is RFC 8970 §3.1's limit: at most 256 characters.
const maxPreview = 256

// previewRead bounds what is decoded of a part to make its preview: the
// text of a preview is near the start, and a preview must be cheap.
const previewRead = 16 << 10

// preview is the PREVIEW of a message (RFC 8970 §3.1): the start of its
// first text/plain part that is not an attachment, else of its first
// text/html with the markup removed, decoded, white space collapsed, cut
// to 256 characters; "" when it has no text.
func preview(raw []byte) string {
	br := bufio.NewReader(bytes.NewReader(raw))
	h, err := textproto.ReadHeader(br)
	if err != nil {
		return ""
	}
	var plain, htmlText string
	previewPart(h, br, 0, &plain, &htmlText)
	text := plain
	if text == "" {
		text = htmlText
	}
	return cutPreview(text)
}

// previewPart finds the first plain and the first HTML text of an entity.
func previewPart(rh textproto.Header, body io.Reader, depth int, plain, htmlText *string) {
	if depth > maxMIMEDepth || *plain != "" {
		return
	}
	h := gomessage.Header{Header: rh}
	mt, params, _ := h.ContentType()
	if disp, _, _ := h.ContentDisposition(); disp == "attachment" {
		return
	}
	switch {
	case strings.HasPrefix(mt, "multipart/"):
		mr := textproto.NewMultipartReader(body, params["boundary"])
		for *plain == "" {
			p, err := mr.NextPart()
			if err != nil {
				return
			}
			previewPart(p.Header, p, depth+1, plain, htmlText)
		}
	case mt == "" || mt == "text/plain" || (mt == "text/html" && *htmlText == ""):
		e, err := gomessage.New(h, body)
		if e == nil || (err != nil && !gomessage.IsUnknownCharset(err) && !gomessage.IsUnknownEncoding(err)) {
			return
		}
		b, _ := io.ReadAll(io.LimitReader(e.Body, previewRead))
		if mt == "text/html" {
			*htmlText = collapse(stripTags(string(b)))
		} else {
			*plain = collapse(string(b))
		}
	}
}

// stripTags drops HTML markup (tags, comments, and what style and script
// elements hold) and decodes entities: enough for a preview's plain text.
// Names are matched in ASCII on the text itself (lower-casing a copy could
// change its length, and its offsets would not fit the original).
func stripTags(s string) string {
	var b strings.Builder
	for len(s) > 0 {
		i := strings.IndexByte(s, '<')
		if i < 0 {
			b.WriteString(s)
			break
		}
		b.WriteString(s[:i])
		s = s[i:]
		end := ">"
		switch {
		case hasPrefixFold(s, "<!--"):
			end = "-->"
		case hasPrefixFold(s, "<style"):
			end = "</style>"
		case hasPrefixFold(s, "<script"):
			end = "</script>"
		}
		j := indexFold(s, end)
		if j < 0 {
			break
		}
		s = s[j+len(end):]
		b.WriteByte(' ')
	}
	return html.UnescapeString(b.String())
}

// hasPrefixFold reports whether s starts with the ASCII prefix, in any case.
func hasPrefixFold(s, prefix string) bool {
	return len(s) >= len(prefix) && strings.EqualFold(s[:len(prefix)], prefix)
}

// indexFold is the first index of the ASCII sub in s, in any case, or -1.
func indexFold(s, sub string) int {
	for i := 0; i+len(sub) <= len(s); i++ {
		if hasPrefixFold(s[i:], sub) {
			return i
		}
	}
	return -1
}

// collapse turns every run of white space into one space, trimmed.
func collapse(s string) string { return strings.Join(strings.Fields(s), " ") }

// cutPreview keeps valid UTF-8 and at most maxPreview characters.
func cutPreview(s string) string {
	s = strings.ToValidUTF8(s, "")
	if utf8.RuneCountInString(s) <= maxPreview {
		return s
	}
	n := 0
	for i := range s {
		if n == maxPreview {
			return strings.TrimRight(s[:i], " ")
		}
		n++
	}
	return s
}

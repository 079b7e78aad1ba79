// Copyright 2010 The Go Authors. All rights reserved.
// Use of this source code is governed by a BSD-style
// license that can be found in the LICENSE file.
//
// A port of github.com/emersion/go-message v0.18.2 textproto/multipart.go
// (itself Go's mime/multipart reader), reading only: the same boundary
// rules, line by line, with one addition, pos, the offset in the message of
// the next byte the reader has not consumed. Quill answers IMAP sections of
// small messages with that library; the part table must place every part
// where the library finds it, quirks included, so the reader is copied
// rather than rewritten.

package mimepart

import (
	"bufio"
	"bytes"
	"fmt"
	"io"

	"github.com/emersion/go-message/textproto"
)

// peekBufferSize is the library's: a preamble line longer than this ends
// the multipart there (bufio.ErrBufferFull), as it does in the library.
const peekBufferSize = 4096

// part is one part of a multipart body: its header, then its bytes up to
// the next boundary.
type part struct {
	header  textproto.Header
	mr      *multipartReader
	n       int   // known data bytes waiting in mr.bufReader
	total   int64 // total data bytes read already
	err     error // error to return when n == 0
	readErr error // read error observed from mr.bufReader
}

func newMultipartReader(r io.Reader, boundary string, base int64) *multipartReader {
	b := []byte("\r\n--" + boundary + "--")
	c := &countingReader{r: &stickyErrorReader{r: r}}
	return &multipartReader{
		bufReader:        bufio.NewReaderSize(c, peekBufferSize),
		count:            c,
		base:             base,
		nl:               b[:2],
		nlDashBoundary:   b[:len(b)-2],
		dashBoundaryDash: b[2:],
		dashBoundary:     b[2 : len(b)-2],
	}
}

type stickyErrorReader struct {
	r   io.Reader
	err error
}

func (r *stickyErrorReader) Read(p []byte) (n int, _ error) {
	if r.err != nil {
		return 0, r.err
	}
	n, r.err = r.r.Read(p)
	return n, r.err
}

// countingReader counts what its reader gave.
type countingReader struct {
	r io.Reader
	n int64
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	return n, err
}

// Read reads the body of a part, after its header and before the next
// part (if any) begins.
func (p *part) Read(d []byte) (int, error) {
	br := p.mr.bufReader
	for p.n == 0 && p.err == nil {
		peek, _ := br.Peek(br.Buffered())
		p.n, p.err = scanUntilBoundary(peek, p.mr.dashBoundary, p.mr.nlDashBoundary, p.total, p.readErr)
		if p.n == 0 && p.err == nil {
			_, p.readErr = br.Peek(len(peek) + 1)
			if p.readErr == io.EOF {
				p.readErr = io.ErrUnexpectedEOF
			}
		}
	}
	if p.n == 0 {
		return 0, p.err
	}
	n := min(len(d), p.n)
	n, _ = br.Read(d[:n])
	p.total += int64(n)
	p.n -= n
	if p.n == 0 {
		return n, p.err
	}
	return n, nil
}

func scanUntilBoundary(buf, dashBoundary, nlDashBoundary []byte, total int64, readErr error) (int, error) {
	if total == 0 {
		if bytes.HasPrefix(buf, dashBoundary) {
			switch matchAfterPrefix(buf, dashBoundary, readErr) {
			case -1:
				return len(dashBoundary), nil
			case 0:
				return 0, nil
			case +1:
				return 0, io.EOF
			}
		}
		if bytes.HasPrefix(dashBoundary, buf) {
			return 0, readErr
		}
	}
	if i := bytes.Index(buf, nlDashBoundary); i >= 0 {
		switch matchAfterPrefix(buf[i:], nlDashBoundary, readErr) {
		case -1:
			return i + len(nlDashBoundary), nil
		case 0:
			return i, nil
		case +1:
			return i, io.EOF
		}
	}
	if bytes.HasPrefix(nlDashBoundary, buf) {
		return 0, readErr
	}
	i := bytes.LastIndexByte(buf, nlDashBoundary[0])
	if i >= 0 && bytes.HasPrefix(nlDashBoundary, buf[i:]) {
		return i, nil
	}
	return len(buf), readErr
}

func matchAfterPrefix(buf, prefix []byte, readErr error) int {
	if len(buf) == len(prefix) {
		if readErr != nil {
			return +1
		}
		return 0
	}
	c := buf[len(prefix)]
	if c == ' ' || c == '\t' || c == '\r' || c == '\n' || c == '-' {
		return +1
	}
	return -1
}

// close reads the rest of the part.
func (p *part) close() {
	io.Copy(io.Discard, p)
}

type multipartReader struct {
	bufReader *bufio.Reader
	count     *countingReader
	base      int64 // the offset in the message of the reader's first byte

	currentPart *part
	partsRead   int

	nl               []byte
	nlDashBoundary   []byte
	dashBoundaryDash []byte
	dashBoundary     []byte
}

// pos is the offset in the message of the next byte not consumed.
func (r *multipartReader) pos() int64 {
	return r.base + r.count.n - int64(r.bufReader.Buffered())
}

// nextPart returns the next part, with the offsets of its header (hdr)
// and of its first byte (body), or an error (io.EOF after the last).
func (r *multipartReader) nextPart() (p *part, hdr, body int64, err error) {
	if r.currentPart != nil {
		r.currentPart.close()
	}
	if string(r.dashBoundary) == "--" {
		return nil, 0, 0, fmt.Errorf("multipart: boundary is empty")
	}
	expectNewPart := false
	for {
		line, err := r.bufReader.ReadSlice('\n')
		if err == io.EOF && r.isFinalBoundary(line) {
			return nil, 0, 0, io.EOF
		}
		if err != nil {
			return nil, 0, 0, fmt.Errorf("multipart: NextPart: %v", err)
		}
		if r.isBoundaryDelimiterLine(line) {
			r.partsRead++
			hdr := r.pos()
			h, err := textproto.ReadHeader(r.bufReader)
			if err != nil {
				return nil, 0, 0, err
			}
			bp := &part{header: h, mr: r}
			r.currentPart = bp
			return bp, hdr, r.pos(), nil
		}
		if r.isFinalBoundary(line) {
			return nil, 0, 0, io.EOF
		}
		if expectNewPart {
			return nil, 0, 0, fmt.Errorf("multipart: expecting a new Part; got line %q", string(line))
		}
		if r.partsRead == 0 {
			continue
		}
		if bytes.Equal(line, r.nl) {
			expectNewPart = true
			continue
		}
		return nil, 0, 0, fmt.Errorf("multipart: unexpected line in Next(): %q", line)
	}
}

func (r *multipartReader) isFinalBoundary(line []byte) bool {
	if !bytes.HasPrefix(line, r.dashBoundaryDash) {
		return false
	}
	rest := skipLWSPChar(line[len(r.dashBoundaryDash):])
	return len(rest) == 0 || bytes.Equal(rest, r.nl)
}

func (r *multipartReader) isBoundaryDelimiterLine(line []byte) bool {
	if !bytes.HasPrefix(line, r.dashBoundary) {
		return false
	}
	rest := skipLWSPChar(line[len(r.dashBoundary):])
	// Lines ending in \n alone, seen on the first boundary, switch the
	// reader to them (a violation of RFC 2046, common in practice).
	if r.partsRead == 0 && len(rest) == 1 && rest[0] == '\n' {
		r.nl = r.nl[1:]
		r.nlDashBoundary = r.nlDashBoundary[1:]
	}
	return bytes.Equal(rest, r.nl)
}

func skipLWSPChar(b []byte) []byte {
	for len(b) > 0 && (b[0] == ' ' || b[0] == '\t') {
		b = b[1:]
	}
	return b
}

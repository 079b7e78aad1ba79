package mimepart

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
)

// tableVersion is the first byte of an encoded table; a table in another
// version is not read (the caller scans the message again).
const tableVersion = 1

// NoTable is what is kept in a table's place for a message that has none
// (ErrTooManyParts): Unmarshal says ErrNoTable, and the message is read
// whole without another scan.
var NoTable = []byte{0}

// ErrNoTable is Unmarshal's error for NoTable.
var ErrNoTable = errors.New("mimepart: the message has no part table")

// Flags of a part in the encoding.
const (
	flagHdrErr = 1 << iota
	flagTruncated
	flagCut
	flagDecodeErr
)

// Marshal encodes the table compactly: a version byte, then the sizes and
// each part as varints of offsets relative to the part before (a few bytes
// a part).
func (t *Table) Marshal() []byte {
	b := []byte{tableVersion}
	b = binary.AppendUvarint(b, uint64(t.Size))
	b = binary.AppendUvarint(b, uint64(t.HeaderLen))
	return appendPart(b, &t.Root)
}

func appendPart(b []byte, p *Part) []byte {
	var f byte
	if p.HdrErr {
		f |= flagHdrErr
	}
	if p.Truncated {
		f |= flagTruncated
	}
	if p.Cut {
		f |= flagCut
	}
	if p.DecodeErr {
		f |= flagDecodeErr
	}
	b = append(b, f, byte(p.Kind)<<4|byte(p.Enc))
	for _, v := range []int64{p.Hdr, p.Body - p.Hdr, p.End - p.Body, p.Lines, p.Decoded} {
		b = binary.AppendUvarint(b, uint64(v))
	}
	switch p.Kind {
	case Multipart:
		b = binary.AppendUvarint(b, uint64(len(p.Children)))
		for i := range p.Children {
			b = appendPart(b, &p.Children[i])
		}
	case Message:
		b = appendPart(b, p.Inner)
	}
	return b
}

// Unmarshal decodes a table Marshal made; ErrTable if it cannot.
func Unmarshal(b []byte) (*Table, error) {
	if bytes.Equal(b, NoTable) {
		return nil, ErrNoTable
	}
	if len(b) == 0 || b[0] != tableVersion {
		return nil, fmt.Errorf("%w: version %v", ErrTable, b[:min(1, len(b))])
	}
	d := decoder{b: b[1:]}
	t := &Table{Size: d.int(), HeaderLen: d.int()}
	d.part(&t.Root, 0)
	if d.err != nil || len(d.b) != 0 || !within(&t.Root, 0, t.Size) || t.HeaderLen > t.Size {
		return nil, ErrTable
	}
	return t, nil
}

// within reports whether p and the parts under it lie between lo and hi.
func within(p *Part, lo, hi int64) bool {
	if !(lo <= p.Hdr && p.Hdr <= p.Body && p.Body <= p.End && p.End <= hi) {
		return false
	}
	for i := range p.Children {
		if !within(&p.Children[i], p.Body, p.End) {
			return false
		}
	}
	return p.Inner == nil || within(p.Inner, p.Body, p.End)
}

type decoder struct {
	b   []byte
	err error
}

func (d *decoder) int() int64 {
	v, n := binary.Uvarint(d.b)
	if n <= 0 || v > 1<<62 {
		d.err = ErrTable
		return 0
	}
	d.b = d.b[n:]
	return int64(v)
}

func (d *decoder) part(p *Part, depth int) {
	if d.err != nil || len(d.b) < 2 || depth > MaxDepth+1 {
		d.err = ErrTable
		return
	}
	f, ke := d.b[0], d.b[1]
	d.b = d.b[2:]
	p.HdrErr, p.Truncated, p.Cut, p.DecodeErr = f&flagHdrErr != 0, f&flagTruncated != 0, f&flagCut != 0, f&flagDecodeErr != 0
	p.Kind, p.Enc = Kind(ke>>4), Enc(ke&0xf)
	p.Hdr = d.int()
	p.Body = p.Hdr + d.int()
	p.End = p.Body + d.int()
	p.Lines, p.Decoded = d.int(), d.int()
	switch p.Kind {
	case Leaf:
	case Multipart:
		n := d.int()
		if n > MaxParts || n > int64(len(d.b)) {
			d.err = ErrTable
			return
		}
		if n > 0 {
			p.Children = make([]Part, n)
		}
		for i := range p.Children {
			d.part(&p.Children[i], depth+1)
		}
	case Message:
		p.Inner = &Part{}
		d.part(p.Inner, depth+1)
	default:
		d.err = ErrTable
	}
	if p.Enc > Unknown {
		d.err = ErrTable
	}
}

package mailbox

import (
	"bytes"
	"fmt"
	"sync"

	"github.com/klauspost/compress/zstd"
)

// The value a message body is kept under in the store (KindBody): the
// message's bytes compressed as one zstd frame (RFC 8878) when that saves
// enough, else the bytes themselves. Mail text compresses two to four
// times; a Maildir keeps it as it is, in 4 KiB blocks.
//
// A zstd frame starts with its magic number (28 B5 2F FD), and no message
// stored before compression was added begins with it in practice (a
// message starts with a header field name). To keep even that case right,
// a stored value that starts with the magic but is not a valid frame reads
// as the bytes themselves, and a body that starts with the magic is always
// stored compressed. Each frame carries its content checksum, so a valid
// frame cannot be an accident of the message text.
//
// The codec is per message, without a dictionary: a dictionary would save
// more on small messages (their headers are alike) but would have to be
// kept, versioned and shipped to every replica for as long as a body
// written with it lives.

// zstdMagic begins every zstd frame (RFC 8878 §3.1.1).
var zstdMagic = []byte{0x28, 0xb5, 0x2f, 0xfd}

// minCompressSize is the smallest body worth compressing: below it the
// frame's own header and checksum (about 16 bytes) eat what is saved.
const minCompressSize = 256

// Compression is kept only when it saves at least 1/minSavingDivisor of
// the body (as Pebble does for its blocks): a body that barely shrinks
// (an attachment already compressed) is kept as it is and costs no
// decompression when read.
const minSavingDivisor = 8

// bodyEncoderLevel is zstd's fastest level: about a tenth of the cost of
// the default level on mail text for a ratio only a few per cent worse,
// and a message is compressed on the delivery path, before its fsync.
const bodyEncoderLevel = zstd.SpeedFastest

var (
	bodyCodecOnce sync.Once
	bodyEncoder   *zstd.Encoder
	bodyDecoder   *zstd.Decoder
)

// bodyCodec returns the shared encoder and decoder; EncodeAll and
// DecodeAll are safe for concurrent use and keep a few states for reuse.
// Low-memory mode and a decoder without its own goroutines keep an idle
// node's memory small.
func bodyCodec() (*zstd.Encoder, *zstd.Decoder) {
	bodyCodecOnce.Do(func() {
		var err error
		bodyEncoder, err = zstd.NewWriter(nil, zstd.WithEncoderLevel(bodyEncoderLevel),
			zstd.WithEncoderCRC(true), zstd.WithLowerEncoderMem(true))
		if err != nil {
			panic(fmt.Sprintf("zstd encoder: %v", err)) // only for invalid options, fixed above
		}
		bodyDecoder, err = zstd.NewReader(nil, zstd.WithDecoderConcurrency(0), zstd.WithDecoderLowmem(true),
			zstd.WithDecoderMaxMemory(maxBodyValue))
		if err != nil {
			panic(fmt.Sprintf("zstd decoder: %v", err))
		}
	})
	return bodyEncoder, bodyDecoder
}

// maxBodyValue bounds what one stored body may decompress to, so a
// corrupt or hostile value cannot make a node allocate without limit. It
// is far above any message SMTP or IMAP accepts.
const maxBodyValue = 1 << 30

// encodeBody returns the store value for a message's bytes.
func encodeBody(raw []byte) []byte {
	magic := bytes.HasPrefix(raw, zstdMagic)
	if len(raw) < minCompressSize && !magic {
		return raw
	}
	enc, _ := bodyCodec()
	c := enc.EncodeAll(raw, make([]byte, 0, len(raw)/2))
	if len(c) > len(raw)-len(raw)/minSavingDivisor && !magic {
		return raw
	}
	return c
}

// decodeBody returns the message's bytes from a store value. The result
// may share v's memory when the value is not compressed.
func decodeBody(v []byte) ([]byte, error) {
	if !bytes.HasPrefix(v, zstdMagic) {
		return v, nil
	}
	_, dec := bodyCodec()
	raw, err := dec.DecodeAll(v, nil)
	if err != nil {
		if isFrame(v) {
			return nil, fmt.Errorf("stored body: %w", err)
		}
		return v, nil // a message of its own that happens to begin with the magic
	}
	return raw, nil
}

// isFrame reports whether v's frame header parses: a value that does is
// a compressed body whose content is damaged, not a plain message.
func isFrame(v []byte) bool {
	var h zstd.Header
	return h.Decode(v) == nil && h.HasCheckSum
}

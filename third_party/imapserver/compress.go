package imapserver

import (
	"bytes"
	"io"
	"strings"

	"compress/flate"

	"github.com/emersion/go-imap/v2"
	inflate "github.com/quillmail/quill/third_party/imapserver/internal/flate"
	"github.com/quillmail/quill/third_party/imapserver/internal/imapwire"
)

// quill: COMPRESS=DEFLATE (RFC 4978), which upstream beta.8 does not have.
//
// The reader is internal/flate, Go's decompressor changed to return each
// block as it ends: a client that ends each command with a partial flush
// (mbsync, Thunderbird) would otherwise wait for an answer to a command the
// server cannot see yet (internal/flate's doc says why neither Go's reader
// nor klauspost/compress's do). The writer is Go's, sync-flushed after
// every write the connection's buffer makes, so each response leaves as
// soon as the uncompressed one would.

// CapCompressDeflate is the capability of RFC 4978 §3.
const CapCompressDeflate imap.Cap = "COMPRESS=DEFLATE"

// compressLevel 5 of Go's flate compresses IMAP responses as well as the
// higher levels (215 bytes for 17 KB of FETCH lines, level 1: 316) and
// holds the least memory of its levels (0.8 MB, level 1: 1.2 MB).
const compressLevel = 5

// DefaultMaxCompressed is Options.MaxCompressed's default: 512 compressed
// connections hold about 420 MB of compressors.
const DefaultMaxCompressed = 512

// ResponseCodeCompressionActive is RFC 4978's code for a second COMPRESS.
const ResponseCodeCompressionActive imap.ResponseCode = "COMPRESSIONACTIVE"

func (c *Conn) handleCompress(tag string, dec *imapwire.Decoder) error {
	var mech string
	if !dec.ExpectSP() || !dec.ExpectAtom(&mech) || !dec.ExpectCRLF() {
		return dec.Err()
	}
	if err := c.checkState(imap.ConnStateAuthenticated); err != nil {
		return err
	}
	if !c.server.options.caps().Has(CapCompressDeflate) {
		return &imap.Error{Type: imap.StatusResponseTypeBad, Text: "Unknown command"}
	}
	if !strings.EqualFold(mech, "DEFLATE") {
		return newClientBugError("Unknown compression mechanism " + mech)
	}
	if c.compressed {
		return &imap.Error{Type: imap.StatusResponseTypeNo, Code: ResponseCodeCompressionActive,
			Text: "DEFLATE is already active"}
	}
	if !c.server.takeCompressSlot() {
		return &imap.Error{Type: imap.StatusResponseTypeNo, Code: imap.ResponseCodeLimit,
			Text: "Too many compressed connections; go on without COMPRESS"}
	}
	c.compressed = true // the slot is given back when the connection ends

	// Nothing may be written between the OK and the first compressed
	// byte: hold the encoder until the switch is made.
	enc := newResponseEncoder(c)
	defer enc.end()
	err := writeStatusResp(enc.Encoder, tag, &imap.StatusResponse{Type: imap.StatusResponseTypeOK, Text: "DEFLATE active"})
	if err != nil {
		return err
	}
	if err := c.bw.Flush(); err != nil {
		return err
	}

	// What the client sent after the command is compressed already.
	var buf bytes.Buffer
	if _, err := io.CopyN(&buf, c.br, int64(c.br.Buffered())); err != nil {
		return err
	}
	rw := c.server.options.wrapReadWriter(c.NetConn())
	fw, err := flate.NewWriter(rw, compressLevel)
	if err != nil {
		return err
	}
	c.br.Reset(inflate.NewReader(io.MultiReader(&buf, rw)))
	c.bw.Reset(syncFlushWriter{fw})
	return nil
}

// takeCompressSlot counts a connection under COMPRESS, if fewer than
// MaxCompressed are.
func (s *Server) takeCompressSlot() bool {
	limit := s.options.MaxCompressed
	if limit <= 0 {
		limit = DefaultMaxCompressed
	}
	s.mutex.Lock()
	defer s.mutex.Unlock()
	if s.compressed >= limit {
		return false
	}
	s.compressed++
	return true
}

// syncFlushWriter compresses each write and flushes it (Z_SYNC_FLUSH):
// the connection's buffered writer writes only when a response is to go
// out.
type syncFlushWriter struct{ w *flate.Writer }

func (s syncFlushWriter) Write(p []byte) (int, error) {
	n, err := s.w.Write(p)
	if err == nil {
		err = s.w.Flush()
	}
	return n, err
}

package mailbox

import (
	"encoding/binary"
	"errors"
	"fmt"
	"time"

	"github.com/quillmail/quill/internal/cluster"
	"github.com/quillmail/quill/internal/hlc"
	"github.com/quillmail/quill/internal/replica"
)

// Message records are encoded by hand rather than as JSON: they are read in
// bulk (a SELECT of a large mailbox, a bucket scan) and this keeps each one a
// few dozen bytes with no reflection.
//
//	version(1) | len(id) id | size | date(unix ns, zig-zag) | modseq | nflags { len(f) f }
//	  | stamp clock | len(node) node | want | nreplicas { len(n) n }   (replication; absent in old records)

const recordVersion = 1

func encodeMessage(m *Message) []byte {
	b := make([]byte, 0, 48+len(m.ID))
	b = append(b, recordVersion)
	b = binary.AppendUvarint(b, uint64(len(m.ID)))
	b = append(b, m.ID...)
	b = binary.AppendUvarint(b, uint64(m.Size))
	b = binary.AppendVarint(b, m.Date.UnixNano())
	b = binary.AppendUvarint(b, m.ModSeq)
	b = binary.AppendUvarint(b, uint64(len(m.Flags)))
	for _, f := range m.Flags {
		b = binary.AppendUvarint(b, uint64(len(f)))
		b = append(b, f...)
	}
	// Replication (appended, so records written before it still decode).
	b = binary.AppendUvarint(b, uint64(m.Version.Clock))
	b = binary.AppendUvarint(b, uint64(len(m.Version.Node)))
	b = append(b, m.Version.Node...)
	b = binary.AppendUvarint(b, uint64(m.Want))
	b = binary.AppendUvarint(b, uint64(len(m.Replicas)))
	for _, n := range m.Replicas {
		b = binary.AppendUvarint(b, uint64(len(n)))
		b = append(b, n...)
	}
	return b
}

var errShort = errors.New("truncated record")

func decodeMessage(b []byte, m *Message) error {
	if len(b) == 0 || b[0] != recordVersion {
		return fmt.Errorf("message record: unknown version")
	}
	b = b[1:]
	str := func() (string, error) {
		n, k := binary.Uvarint(b)
		if k <= 0 || uint64(len(b)-k) < n {
			return "", errShort
		}
		s := string(b[k : k+int(n)])
		b = b[k+int(n):]
		return s, nil
	}
	uv := func() (uint64, error) {
		v, k := binary.Uvarint(b)
		if k <= 0 {
			return 0, errShort
		}
		b = b[k:]
		return v, nil
	}
	var err error
	if m.ID, err = str(); err != nil {
		return err
	}
	size, err := uv()
	if err != nil {
		return err
	}
	m.Size = int64(size)
	ns, k := binary.Varint(b)
	if k <= 0 {
		return errShort
	}
	b = b[k:]
	m.Date = time.Unix(0, ns)
	if m.ModSeq, err = uv(); err != nil {
		return err
	}
	nf, err := uv()
	if err != nil {
		return err
	}
	if nf > uint64(len(b)) {
		return errShort
	}
	m.Flags = make([]string, 0, nf)
	for i := uint64(0); i < nf; i++ {
		f, err := str()
		if err != nil {
			return err
		}
		m.Flags = append(m.Flags, f)
	}
	if len(b) == 0 {
		return nil
	}
	c, err := uv()
	if err != nil {
		return err
	}
	node, err := str()
	if err != nil {
		return err
	}
	m.Version = replica.Stamp{Clock: hlc.Timestamp(c), Node: cluster.NodeID(node)}
	want, err := uv()
	if err != nil {
		return err
	}
	m.Want = int(want)
	nr, err := uv()
	if err != nil {
		return err
	}
	if nr > uint64(len(b)) {
		return errShort
	}
	m.Replicas = make([]cluster.NodeID, 0, nr)
	for i := uint64(0); i < nr; i++ {
		n, err := str()
		if err != nil {
			return err
		}
		m.Replicas = append(m.Replicas, cluster.NodeID(n))
	}
	return nil
}

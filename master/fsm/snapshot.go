package fsm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"strings"

	"github.com/dgraph-io/badger/v4"
	"github.com/hashicorp/raft"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/master/masterpb"
)

// The snapshot stream: a header, then (uvarint key length, key, uvarint value length, value)
// records in key order, then a zero key length and the CRC-32C of everything before it.
const snapshotMagic = "strata-fsm-snapshot-v1\n"

var crcTable = crc32.MakeTable(crc32.Castagnoli)

// snapshot is a read-only transaction opened at the applied index. Persist streams exactly
// that view, however many entries are applied meanwhile; a Badger backup started in Persist
// would include them and make the snapshot claim an index older than its contents.
type snapshot struct {
	txn   *badger.Txn
	index uint64
}

var _ raft.FSMSnapshot = (*snapshot)(nil)

// Persist writes the snapshot and closes the sink, or cancels it on any error so that raft
// never keeps a partial snapshot.
func (s *snapshot) Persist(sink raft.SnapshotSink) error {
	if err := s.write(sink); err != nil {
		_ = sink.Cancel()
		return fmt.Errorf("persisting snapshot at index %d: %w", s.index, err)
	}
	if err := sink.Close(); err != nil {
		return fmt.Errorf("closing snapshot at index %d: %w", s.index, err)
	}
	return nil
}

func (s *snapshot) write(w io.Writer) error {
	sw := newSnapshotWriter(w)
	it := s.txn.NewIterator(badger.DefaultIteratorOptions)
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		err := item.Value(func(v []byte) error { return sw.record(item.Key(), v) })
		if err != nil {
			return fmt.Errorf("reading %q: %w", item.Key(), err)
		}
	}
	return sw.close()
}

// snapshotWriter encodes a snapshot stream.
type snapshotWriter struct {
	w      io.Writer
	crc    hashWriter
	bw     *bufio.Writer
	err    error
	lenBuf [binary.MaxVarintLen64]byte
}

func newSnapshotWriter(w io.Writer) *snapshotWriter {
	crc := crc32.New(crcTable)
	sw := &snapshotWriter{w: w, crc: crc, bw: bufio.NewWriterSize(io.MultiWriter(w, crc), 1<<20)}
	_, sw.err = sw.bw.WriteString(snapshotMagic)
	return sw
}

func (sw *snapshotWriter) uvarint(v uint64) {
	if sw.err == nil {
		n := binary.PutUvarint(sw.lenBuf[:], v)
		_, sw.err = sw.bw.Write(sw.lenBuf[:n])
	}
}

func (sw *snapshotWriter) bytes(p []byte) {
	if sw.err == nil {
		_, sw.err = sw.bw.Write(p)
	}
}

// record adds one key and its value.
func (sw *snapshotWriter) record(key, val []byte) error {
	sw.uvarint(uint64(len(key)))
	sw.bytes(key)
	sw.uvarint(uint64(len(val)))
	sw.bytes(val)
	return sw.err
}

// close ends the stream with a zero key length and the checksum.
func (sw *snapshotWriter) close() error {
	sw.uvarint(0)
	if sw.err == nil {
		sw.err = sw.bw.Flush()
	}
	if sw.err != nil {
		return sw.err
	}
	var sum [4]byte
	binary.BigEndian.PutUint32(sum[:], sw.crc.Sum32())
	_, err := sw.w.Write(sum[:])
	return err
}

// Release ends the read transaction.
func (s *snapshot) Release() { s.txn.Discard() }

// crcReader feeds what it reads into a CRC.
type crcReader struct {
	r   *bufio.Reader
	crc hashWriter
}

type hashWriter interface {
	io.Writer
	Sum32() uint32
}

func (c *crcReader) ReadByte() (byte, error) {
	b, err := c.r.ReadByte()
	if err == nil {
		_, _ = c.crc.Write([]byte{b})
	}
	return b, err
}

func (c *crcReader) readFull(p []byte) error {
	if _, err := io.ReadFull(c.r, p); err != nil {
		return err
	}
	_, _ = c.crc.Write(p)
	return nil
}

// maxRecord bounds a key or value read from a snapshot, so a corrupt length cannot make the
// restore allocate without limit.
const maxRecord = 256 << 20

// readSnapshot loads a snapshot stream into db through a write batch (a restore is larger than
// any transaction may be).
func readSnapshot(r io.Reader, db *badger.DB) error {
	wb := db.NewWriteBatch()
	defer wb.Cancel()
	records, _, err := scanSnapshot(r, func(key, val []byte) error {
		if err := wb.Set(key, val); err != nil {
			return fmt.Errorf("loading %q: %w", key, err)
		}
		return nil
	})
	if err != nil {
		return err
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("writing %d records: %w", records, err)
	}
	return nil
}

// SnapshotInfo describes a snapshot stream VerifySnapshot read.
type SnapshotInfo struct {
	// AppliedIndex and AppliedTerm are those of the last entry the snapshot holds.
	AppliedIndex, AppliedTerm uint64
	// Checksum is the stream's CRC-32C.
	Checksum                 uint32
	Records                  int
	Datasets, Files, Workers int
	// AliveWorkers are the workers the snapshot holds as alive (or being marked lost).
	AliveWorkers []*masterpb.Worker
}

// ID names the snapshot: its last entry and its checksum.
func (i SnapshotInfo) ID() string {
	return fmt.Sprintf("index %d, term %d, checksum %08x", i.AppliedIndex, i.AppliedTerm, i.Checksum)
}

// VerifySnapshot reads a snapshot stream to its end, checking its format and checksum without
// storing anything, and says what it holds: a backup is checked whole before it replaces a
// state (raft cannot undo a restore that fails half-way).
func VerifySnapshot(r io.Reader) (SnapshotInfo, error) {
	return inspectSnapshot(r, func(_, _ []byte) error { return nil })
}

// inspectSnapshot reads a snapshot stream as VerifySnapshot does, handing each record to fn.
func inspectSnapshot(r io.Reader, fn func(key, val []byte) error) (SnapshotInfo, error) {
	var info SnapshotInfo
	records, checksum, err := scanSnapshot(r, func(key, val []byte) error {
		k := string(key)
		switch {
		case k == string(keyApplied):
			if len(val) != 16 {
				return fmt.Errorf("applied-index record has %d bytes, want 16", len(val))
			}
			info.AppliedIndex, info.AppliedTerm = binary.BigEndian.Uint64(val), binary.BigEndian.Uint64(val[8:])
		case strings.HasPrefix(k, prefixDataset):
			info.Datasets++
		case strings.HasPrefix(k, prefixFile):
			info.Files++
		case strings.HasPrefix(k, prefixWorker):
			info.Workers++
			w := &masterpb.Worker{}
			if err := proto.Unmarshal(val, w); err != nil {
				return fmt.Errorf("decoding %q: %w", key, err)
			}
			if w.GetState() == masterpb.WorkerState_WORKER_STATE_ALIVE || w.GetLossPending() {
				info.AliveWorkers = append(info.AliveWorkers, w)
			}
		}
		return fn(key, val)
	})
	info.Records, info.Checksum = records, checksum
	if err != nil {
		return info, err
	}
	if info.AppliedIndex == 0 {
		return info, errors.New("the snapshot has no applied-index record: it holds no state of a running master")
	}
	return info, nil
}

// PrepareRestore copies a backup (a snapshot stream) to out as the snapshot a new install
// restores, checking it whole as VerifySnapshot does. The backup's peer records, which give the
// old install's replicas' addresses, are replaced by peers, those of the install that restores
// it (a replica that names a leader by a record of the backup would send clients to the old
// install's address); and the copy records which backup it is (RestoredFrom), in the same
// snapshot, so that a restore whose outcome its caller could not learn (the leader lost its
// leadership before the entry after it committed) can be recognised when it is asked again.
// out is only of use if the error is nil.
func PrepareRestore(backup io.Reader, out io.Writer, peers []*masterpb.Peer) (SnapshotInfo, error) {
	sw := newSnapshotWriter(out)
	for _, p := range peers {
		v, err := proto.MarshalOptions{Deterministic: true}.Marshal(p)
		if err != nil {
			return SnapshotInfo{}, fmt.Errorf("encoding peer %s: %w", p.GetRaftId(), err)
		}
		if err := sw.record(peerKey(p.GetRaftId()), v); err != nil {
			return SnapshotInfo{}, err
		}
	}
	info, err := inspectSnapshot(backup, func(key, val []byte) error {
		if strings.HasPrefix(string(key), prefixPeer) || string(key) == string(keyRestoredFrom) {
			return nil
		}
		return sw.record(key, val)
	})
	if err != nil {
		return info, err
	}
	if err := sw.record(keyRestoredFrom, []byte(info.ID())); err != nil {
		return info, err
	}
	return info, sw.close()
}

// scanSnapshot reads a snapshot stream, handing each record to fn, and checks its checksum at
// the end; it returns the number of records read.
func scanSnapshot(r io.Reader, fn func(key, val []byte) error) (int, uint32, error) {
	cr := &crcReader{r: bufio.NewReaderSize(r, 1<<20), crc: crc32.New(crcTable)}
	magic := make([]byte, len(snapshotMagic))
	if err := cr.readFull(magic); err != nil {
		return 0, 0, fmt.Errorf("reading header: %w", err)
	}
	if string(magic) != snapshotMagic {
		return 0, 0, errors.New("not a state machine snapshot (bad header)")
	}
	records := 0
	for {
		klen, err := binary.ReadUvarint(cr)
		if err != nil {
			return records, 0, fmt.Errorf("reading record %d: %w", records, err)
		}
		if klen == 0 {
			break
		}
		if klen > maxRecord {
			return records, 0, fmt.Errorf("record %d: key length %d is corrupt", records, klen)
		}
		key := make([]byte, klen)
		if err := cr.readFull(key); err != nil {
			return records, 0, fmt.Errorf("reading key of record %d: %w", records, err)
		}
		vlen, err := binary.ReadUvarint(cr)
		if err != nil {
			return records, 0, fmt.Errorf("reading value length of %q: %w", key, err)
		}
		if vlen > maxRecord {
			return records, 0, fmt.Errorf("value length %d of %q is corrupt", vlen, key)
		}
		val := make([]byte, vlen)
		if err := cr.readFull(val); err != nil {
			return records, 0, fmt.Errorf("reading value of %q: %w", key, err)
		}
		if err := fn(key, val); err != nil {
			return records, 0, err
		}
		records++
	}
	want := cr.crc.Sum32()
	var sum [4]byte
	if _, err := io.ReadFull(cr.r, sum[:]); err != nil {
		return records, 0, fmt.Errorf("reading checksum: %w", err)
	}
	if got := binary.BigEndian.Uint32(sum[:]); got != want {
		return records, 0, fmt.Errorf("checksum mismatch: stream says %08x, content is %08x", got, want)
	}
	// A stream that goes on after its checksum is not one snapshot.
	switch _, err := cr.r.ReadByte(); {
	case err == nil:
		return records, 0, errors.New("the stream goes on after its checksum")
	case !errors.Is(err, io.EOF):
		return records, 0, fmt.Errorf("reading past the checksum: %w", err)
	}
	return records, want, nil
}

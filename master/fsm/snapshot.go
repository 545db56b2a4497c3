package fsm

import (
	"bufio"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"

	"github.com/dgraph-io/badger/v4"
	"github.com/hashicorp/raft"
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
	crc := crc32.New(crcTable)
	bw := bufio.NewWriterSize(io.MultiWriter(w, crc), 1<<20)
	if _, err := bw.WriteString(snapshotMagic); err != nil {
		return err
	}
	it := s.txn.NewIterator(badger.DefaultIteratorOptions)
	defer it.Close()
	var lenBuf [binary.MaxVarintLen64]byte
	for it.Rewind(); it.Valid(); it.Next() {
		item := it.Item()
		key := item.Key()
		n := binary.PutUvarint(lenBuf[:], uint64(len(key)))
		if _, err := bw.Write(lenBuf[:n]); err != nil {
			return err
		}
		if _, err := bw.Write(key); err != nil {
			return err
		}
		err := item.Value(func(v []byte) error {
			n := binary.PutUvarint(lenBuf[:], uint64(len(v)))
			if _, err := bw.Write(lenBuf[:n]); err != nil {
				return err
			}
			_, err := bw.Write(v)
			return err
		})
		if err != nil {
			return fmt.Errorf("reading %q: %w", key, err)
		}
	}
	if err := bw.WriteByte(0); err != nil {
		return err
	}
	if err := bw.Flush(); err != nil {
		return err
	}
	var sum [4]byte
	binary.BigEndian.PutUint32(sum[:], crc.Sum32())
	_, err := w.Write(sum[:])
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
	cr := &crcReader{r: bufio.NewReaderSize(r, 1<<20), crc: crc32.New(crcTable)}
	magic := make([]byte, len(snapshotMagic))
	if err := cr.readFull(magic); err != nil {
		return fmt.Errorf("reading header: %w", err)
	}
	if string(magic) != snapshotMagic {
		return errors.New("not a state machine snapshot (bad header)")
	}
	wb := db.NewWriteBatch()
	defer wb.Cancel()
	records := 0
	for {
		klen, err := binary.ReadUvarint(cr)
		if err != nil {
			return fmt.Errorf("reading record %d: %w", records, err)
		}
		if klen == 0 {
			break
		}
		if klen > maxRecord {
			return fmt.Errorf("record %d: key length %d is corrupt", records, klen)
		}
		key := make([]byte, klen)
		if err := cr.readFull(key); err != nil {
			return fmt.Errorf("reading key of record %d: %w", records, err)
		}
		vlen, err := binary.ReadUvarint(cr)
		if err != nil {
			return fmt.Errorf("reading value length of %q: %w", key, err)
		}
		if vlen > maxRecord {
			return fmt.Errorf("value length %d of %q is corrupt", vlen, key)
		}
		val := make([]byte, vlen)
		if err := cr.readFull(val); err != nil {
			return fmt.Errorf("reading value of %q: %w", key, err)
		}
		if err := wb.Set(key, val); err != nil {
			return fmt.Errorf("loading %q: %w", key, err)
		}
		records++
	}
	want := cr.crc.Sum32()
	var sum [4]byte
	if _, err := io.ReadFull(cr.r, sum[:]); err != nil {
		return fmt.Errorf("reading checksum: %w", err)
	}
	if got := binary.BigEndian.Uint32(sum[:]); got != want {
		return fmt.Errorf("checksum mismatch: stream says %08x, content is %08x", got, want)
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("writing %d records: %w", records, err)
	}
	return nil
}

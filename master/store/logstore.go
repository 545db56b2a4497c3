package store

import (
	"encoding/binary"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/go-logr/logr"
	"github.com/hashicorp/raft"

	"github.com/strata-cache/strata/master/logadapter"
)

// ErrKeyNotFound is what the stable store returns for a key it does not hold. Its text matters:
// hashicorp/raft recognises a missing key by the message "not found", as raft-boltdb words it.
var ErrKeyNotFound = errors.New("not found")

const (
	prefixLog    = "l/"
	prefixStable = "s/"
	// logEncodingV1 is the first byte of every stored log entry.
	logEncodingV1 = 1
)

// LogStore is raft's LogStore and StableStore on one Badger database, as versions before the
// WAL kept them (in Config.Dir/raft); a replica now only reads it, to move it into the WAL
// (migrateBadgerLog). Writes are synced: raft acknowledged entries and votes only once they
// were durable.
type LogStore struct {
	db *badger.DB

	// first and last cache the index range, which raft asks for on every append.
	mu          sync.RWMutex
	first, last uint64
}

var (
	_ raft.LogStore    = (*LogStore)(nil)
	_ raft.StableStore = (*LogStore)(nil)
)

// LogStoreOptions tune the log database.
type LogStoreOptions struct {
	// MemTableSize is Badger's memtable size in bytes; 0 means 16 MiB.
	MemTableSize int64
	// BlockCacheSize is Badger's block cache in bytes; 0 means 16 MiB.
	BlockCacheSize int64
}

// OpenLogStore opens (or creates) the log and stable store in dir.
func OpenLogStore(dir string, log logr.Logger, o LogStoreOptions) (*LogStore, error) {
	if o.MemTableSize == 0 {
		o.MemTableSize = 16 << 20
	}
	if o.BlockCacheSize == 0 {
		o.BlockCacheSize = 16 << 20
	}
	opts := badger.DefaultOptions(dir).
		WithLogger(logadapter.NewBadger(log.WithName("badger"))).
		WithSyncWrites(true).
		WithMemTableSize(o.MemTableSize).
		WithBlockCacheSize(o.BlockCacheSize).
		// Badger refuses a value threshold above its batch limit (15% of the memtable).
		WithValueThreshold(min(1<<20, o.MemTableSize*15/100/2)).
		WithNumVersionsToKeep(1).
		WithNumCompactors(2)
	db, err := badger.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("opening raft log database in %s: %w", dir, err)
	}
	s := &LogStore{db: db}
	if err := s.loadRange(); err != nil {
		_ = db.Close()
		return nil, err
	}
	return s, nil
}

// Close closes the database.
func (s *LogStore) Close() error {
	if err := s.db.Close(); err != nil {
		return fmt.Errorf("closing raft log database: %w", err)
	}
	return nil
}

// DB exposes the database for value-log garbage collection.
func (s *LogStore) DB() *badger.DB { return s.db }

func logKey(index uint64) []byte {
	k := make([]byte, len(prefixLog)+8)
	copy(k, prefixLog)
	binary.BigEndian.PutUint64(k[len(prefixLog):], index)
	return k
}

func (s *LogStore) loadRange() error {
	err := s.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.PrefetchValues = false
		opts.Prefix = []byte(prefixLog)
		it := txn.NewIterator(opts)
		it.Rewind()
		if it.Valid() {
			s.first = binary.BigEndian.Uint64(it.Item().Key()[len(prefixLog):])
		}
		it.Close()

		opts.Reverse = true
		it = txn.NewIterator(opts)
		defer it.Close()
		// In reverse, Seek lands on the greatest key at or before the one given.
		it.Seek(append([]byte(prefixLog), 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff))
		if it.Valid() {
			s.last = binary.BigEndian.Uint64(it.Item().Key()[len(prefixLog):])
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("reading the raft log's index range: %w", err)
	}
	return nil
}

// FirstIndex returns the first index written, 0 for an empty log.
func (s *LogStore) FirstIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.first, nil
}

// LastIndex returns the last index written, 0 for an empty log.
func (s *LogStore) LastIndex() (uint64, error) {
	s.mu.RLock()
	defer s.mu.RUnlock()
	return s.last, nil
}

// GetLog reads the entry at index into out, or returns raft.ErrLogNotFound.
func (s *LogStore) GetLog(index uint64, out *raft.Log) error {
	err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(logKey(index))
		if err != nil {
			return err
		}
		return item.Value(func(v []byte) error { return decodeLog(index, v, out) })
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return raft.ErrLogNotFound
	}
	if err != nil {
		return fmt.Errorf("reading raft log entry %d: %w", index, err)
	}
	return nil
}

// StoreLog stores one entry.
func (s *LogStore) StoreLog(l *raft.Log) error { return s.StoreLogs([]*raft.Log{l}) }

// StoreLogs stores entries, durably, before returning.
func (s *LogStore) StoreLogs(logs []*raft.Log) error {
	if len(logs) == 0 {
		return nil
	}
	// Writers hold the lock across the write so the cached range always matches the database
	// (raft appends from its main loop while its snapshot loop compacts the head).
	s.mu.Lock()
	defer s.mu.Unlock()
	err := s.batch(func(put func(k, v []byte) error) error {
		for _, l := range logs {
			if err := put(logKey(l.Index), encodeLog(l)); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("storing raft log entries %d-%d: %w", logs[0].Index, logs[len(logs)-1].Index, err)
	}
	for _, l := range logs {
		if s.first == 0 || l.Index < s.first {
			s.first = l.Index
		}
		if l.Index > s.last {
			s.last = l.Index
		}
	}
	return nil
}

// DeleteRange deletes the entries from min to max, both included.
func (s *LogStore) DeleteRange(lo, hi uint64) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	first, last := s.first, s.last
	// Only stored indexes need a delete: raft may name a range far wider than the log (after
	// installing a snapshot it deletes everything up to the snapshot's index).
	if lo < first {
		lo = first
	}
	if hi > last {
		hi = last
	}
	if first != 0 && lo <= hi {
		err := s.batch(func(put func(k, v []byte) error) error {
			for i := lo; i <= hi; i++ {
				if err := put(logKey(i), nil); err != nil {
					return err
				}
			}
			return nil
		})
		if err != nil {
			return fmt.Errorf("deleting raft log entries %d-%d: %w", lo, hi, err)
		}
	}
	// Raft deletes the head (compaction after a snapshot), the tail (a follower dropping
	// conflicting entries) or everything (installing a snapshot), never a middle part; that
	// would leave a gap the cached range cannot express, so it is reread.
	switch {
	case first == 0 || lo > hi:
	case lo <= first && hi >= last:
		s.first, s.last = 0, 0
	case lo <= first:
		s.first = hi + 1
	case hi >= last:
		s.last = lo - 1
	default:
		s.first, s.last = 0, 0
		return s.loadRange()
	}
	return nil
}

// batch runs fill with a put function (nil value = delete) inside transactions, committing
// and starting a new one whenever Badger says the current one is full.
func (s *LogStore) batch(fill func(put func(k, v []byte) error) error) error {
	txn := s.db.NewTransaction(true)
	defer func() { txn.Discard() }()
	put := func(k, v []byte) error {
		op := func() error {
			if v == nil {
				return txn.Delete(k)
			}
			return txn.Set(k, v)
		}
		err := op()
		if errors.Is(err, badger.ErrTxnTooBig) {
			if err := txn.Commit(); err != nil {
				return err
			}
			txn = s.db.NewTransaction(true)
			err = op()
		}
		return err
	}
	if err := fill(put); err != nil {
		return err
	}
	return txn.Commit()
}

// Set stores a stable value (raft's current term and vote).
func (s *LogStore) Set(key, val []byte) error {
	err := s.db.Update(func(txn *badger.Txn) error {
		return txn.Set(append([]byte(prefixStable), key...), val)
	})
	if err != nil {
		return fmt.Errorf("storing %q: %w", key, err)
	}
	return nil
}

// Get returns a stable value, or ErrKeyNotFound.
func (s *LogStore) Get(key []byte) ([]byte, error) {
	var val []byte
	err := s.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(append([]byte(prefixStable), key...))
		if err != nil {
			return err
		}
		val, err = item.ValueCopy(nil)
		return err
	})
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, ErrKeyNotFound
	}
	if err != nil {
		return nil, fmt.Errorf("reading %q: %w", key, err)
	}
	return val, nil
}

// SetUint64 stores a stable number.
func (s *LogStore) SetUint64(key []byte, val uint64) error {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], val)
	return s.Set(key, b[:])
}

// GetUint64 returns a stable number, or ErrKeyNotFound.
func (s *LogStore) GetUint64(key []byte) (uint64, error) {
	b, err := s.Get(key)
	if err != nil {
		return 0, err
	}
	if len(b) != 8 {
		return 0, fmt.Errorf("stable value %q has %d bytes, want 8", key, len(b))
	}
	return binary.BigEndian.Uint64(b), nil
}

// encodeLog writes an entry as: version byte, uvarint term, type byte, uvarint length and data,
// uvarint length and extensions, varint appended-at in Unix nanoseconds (0 when unset). The
// index is the key.
func encodeLog(l *raft.Log) []byte {
	b := make([]byte, 0, 1+3*binary.MaxVarintLen64+1+len(l.Data)+len(l.Extensions)+binary.MaxVarintLen64)
	b = append(b, logEncodingV1)
	b = binary.AppendUvarint(b, l.Term)
	b = append(b, byte(l.Type))
	b = binary.AppendUvarint(b, uint64(len(l.Data)))
	b = append(b, l.Data...)
	b = binary.AppendUvarint(b, uint64(len(l.Extensions)))
	b = append(b, l.Extensions...)
	var at int64
	if !l.AppendedAt.IsZero() {
		at = l.AppendedAt.UnixNano()
	}
	return binary.AppendVarint(b, at)
}

func decodeLog(index uint64, b []byte, out *raft.Log) error {
	bad := func(what string) error { return fmt.Errorf("raft log entry %d: corrupt %s", index, what) }
	if len(b) == 0 || b[0] != logEncodingV1 {
		return bad("encoding version")
	}
	b = b[1:]
	term, n := binary.Uvarint(b)
	if n <= 0 || len(b) < n+1 {
		return bad("term")
	}
	typ := raft.LogType(b[n])
	b = b[n+1:]
	readBytes := func(what string) ([]byte, error) {
		size, n := binary.Uvarint(b)
		if n <= 0 || uint64(len(b)-n) < size {
			return nil, bad(what)
		}
		v := make([]byte, size)
		copy(v, b[n:n+int(size)])
		b = b[n+int(size):]
		if size == 0 {
			return nil, nil
		}
		return v, nil
	}
	data, err := readBytes("data")
	if err != nil {
		return err
	}
	ext, err := readBytes("extensions")
	if err != nil {
		return err
	}
	at, n := binary.Varint(b)
	if n <= 0 {
		return bad("append time")
	}
	*out = raft.Log{Index: index, Term: term, Type: typ, Data: data, Extensions: ext}
	if at != 0 {
		out.AppendedAt = time.Unix(0, at)
	}
	return nil
}

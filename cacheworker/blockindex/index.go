package blockindex

import (
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/dgraph-io/badger/v4"
	"github.com/go-logr/logr"
)

// ErrNotFound is returned for a block the index has no entry for.
var ErrNotFound = errors.New("block not in index")

// entryVersion is written into every entry so that a later layout can read older ones.
const entryVersion = 1

const keyPrefix = "b/"

// Entry is what the worker remembers about one block.
type Entry struct {
	// ID is the block id, also its file name.
	ID string `json:"id"`
	// Tier is the name of the tier that holds it.
	Tier string `json:"tier"`
	// Dir is the tier directory the file is in.
	Dir string `json:"dir"`
	// Size is the block's length in bytes.
	Size int64 `json:"size"`
	// Checksum is the CRC-32C of the block's bytes.
	Checksum uint32 `json:"crc32c"`
	// Clean is true when a copy exists elsewhere (checkpointed, replicated, or read from the
	// under-store), so that the block may be dropped without persisting it first.
	Clean bool `json:"clean,omitempty"`
	// Pinned blocks are never evicted.
	Pinned bool `json:"pinned,omitempty"`
	// Accesses counts reads of the block.
	Accesses uint64 `json:"accesses,omitempty"`
	// LastAccess is the time of the latest read, or of the write.
	LastAccess time.Time `json:"lastAccess"`
	// Created is when the block was written.
	Created time.Time `json:"created"`
	// Origin is what the writer said the block is part of; the index keeps it and does not
	// read it (the worker uses it to report its blocks to the master after a restart).
	Origin []byte `json:"origin,omitempty"`
}

// Path is the block's file.
func (e Entry) Path() string { return BlockPath(e.Dir, e.ID) }

type storedEntry struct {
	Version int `json:"v"`
	Entry
}

// Index is the BadgerDB of block entries. Writes are not synced one by one; Sync makes every
// write so far durable. An entry is the commit point of a block write or move, so the tier
// store syncs after committing a block that has no copy elsewhere, and skips the sync for
// clean blocks: losing one of their entries in a crash only costs a re-read from the
// under-store, since the start-up check removes their files as orphans.
type Index struct {
	db  *badger.DB
	log logr.Logger
}

// Open opens (or creates) the index in dir.
func Open(dir string, log logr.Logger) (*Index, error) {
	opts := badger.DefaultOptions(dir).
		WithLogger(badgerLogger{log.WithName("badger")}).
		WithSyncWrites(false).
		// Entries are small and few (one per cached block), so the defaults, sized for
		// databases of many gigabytes, would only take memory from the cache itself.
		WithMemTableSize(8 << 20).
		WithBlockCacheSize(8 << 20).
		WithValueLogFileSize(64 << 20).
		WithNumMemtables(2).
		WithNumCompactors(2).
		WithNumVersionsToKeep(1).
		// Badger's metrics are process-wide expvars; the worker exports its own.
		WithMetricsEnabled(false)
	db, err := badger.Open(opts)
	if err != nil {
		return nil, fmt.Errorf("opening block index in %s: %w", dir, err)
	}
	return &Index{db: db, log: log}, nil
}

// Close closes the database.
func (x *Index) Close() error {
	if err := x.db.Close(); err != nil {
		return fmt.Errorf("closing block index: %w", err)
	}
	return nil
}

func key(id string) []byte { return []byte(keyPrefix + id) }

func encode(e Entry) ([]byte, error) {
	b, err := json.Marshal(storedEntry{Version: entryVersion, Entry: e})
	if err != nil {
		return nil, fmt.Errorf("encoding index entry of block %s: %w", e.ID, err)
	}
	return b, nil
}

func decode(k, v []byte) (Entry, error) {
	var s storedEntry
	if err := json.Unmarshal(v, &s); err != nil {
		return Entry{}, fmt.Errorf("decoding index entry %s: %w", k, err)
	}
	if s.Version != entryVersion {
		return Entry{}, fmt.Errorf("index entry %s has version %d; this worker reads version %d", k, s.Version, entryVersion)
	}
	return s.Entry, nil
}

// Sync makes every write so far durable.
func (x *Index) Sync() error {
	if err := x.db.Sync(); err != nil {
		return fmt.Errorf("syncing block index: %w", err)
	}
	return nil
}

// Put records e, replacing any entry of the same id.
func (x *Index) Put(e Entry) error {
	return x.PutMany([]Entry{e})
}

// PutMany records several entries in one write.
func (x *Index) PutMany(es []Entry) error {
	if len(es) == 0 {
		return nil
	}
	err := x.db.Update(func(txn *badger.Txn) error {
		for _, e := range es {
			v, err := encode(e)
			if err != nil {
				return err
			}
			if err := txn.Set(key(e.ID), v); err != nil {
				return err
			}
		}
		return nil
	})
	if errors.Is(err, badger.ErrTxnTooBig) {
		// Too many for one transaction (a flush of many access counters): split them up.
		half := len(es) / 2
		if err := x.PutMany(es[:half]); err != nil {
			return err
		}
		return x.PutMany(es[half:])
	}
	if err != nil {
		return fmt.Errorf("writing %d index entries (first: block %s): %w", len(es), es[0].ID, err)
	}
	return nil
}

// Delete removes the entry of id; a missing entry is not an error.
func (x *Index) Delete(id string) error {
	return x.DeleteMany([]string{id})
}

// DeleteMany removes several entries in one write.
func (x *Index) DeleteMany(ids []string) error {
	if len(ids) == 0 {
		return nil
	}
	wb := x.db.NewWriteBatch()
	defer wb.Cancel()
	for _, id := range ids {
		if err := wb.Delete(key(id)); err != nil {
			return fmt.Errorf("deleting index entry of block %s: %w", id, err)
		}
	}
	if err := wb.Flush(); err != nil {
		return fmt.Errorf("deleting %d index entries (first: block %s): %w", len(ids), ids[0], err)
	}
	return nil
}

// Get returns the entry of id, or an error wrapping ErrNotFound.
func (x *Index) Get(id string) (Entry, error) {
	var e Entry
	err := x.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(key(id))
		if errors.Is(err, badger.ErrKeyNotFound) {
			return fmt.Errorf("block %s: %w", id, ErrNotFound)
		}
		if err != nil {
			return fmt.Errorf("reading index entry of block %s: %w", id, err)
		}
		return item.Value(func(v []byte) error {
			e, err = decode(item.Key(), v)
			return err
		})
	})
	return e, err
}

// All returns every entry, ordered by id. An entry that cannot be decoded is an error: it
// means the index was written by an incompatible worker, and guessing would risk serving the
// wrong bytes.
func (x *Index) All() ([]Entry, error) {
	var out []Entry
	err := x.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = []byte(keyPrefix)
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			item := it.Item()
			var e Entry
			if err := item.Value(func(v []byte) error {
				var err error
				e, err = decode(item.Key(), v)
				return err
			}); err != nil {
				return err
			}
			out = append(out, e)
		}
		return nil
	})
	if err != nil {
		return nil, fmt.Errorf("listing block index: %w", err)
	}
	return out, nil
}

// badgerLogger sends Badger's messages to a logr.Logger. Its Info messages are routine
// (compactions, replay), so they go to V(1).
type badgerLogger struct{ log logr.Logger }

func (b badgerLogger) Errorf(f string, args ...any) { b.log.Error(nil, trim(f, args)) }
func (b badgerLogger) Warningf(f string, args ...any) {
	b.log.Info(trim(f, args), "level", "warning")
}
func (b badgerLogger) Infof(f string, args ...any)  { b.log.V(1).Info(trim(f, args)) }
func (b badgerLogger) Debugf(f string, args ...any) { b.log.V(2).Info(trim(f, args)) }

func trim(f string, args []any) string {
	return strings.TrimRight(fmt.Sprintf(f, args...), "\n")
}

package fsm

import (
	"bytes"
	"cmp"
	"errors"
	"fmt"
	"maps"
	"slices"
	"strings"

	"github.com/dgraph-io/badger/v4"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/master/masterpb"
)

// Queries. They read the local state, which is only as fresh as this replica: callers that need
// linearizable reads first make sure this replica is the leader and caught up (store.VerifyRead).

// DefaultListLimit and MaxListLimit bound one page of ListFiles.
const (
	DefaultListLimit = 1000
	MaxListLimit     = 10000
)

// GetFile returns the file at p.
func (f *FSM) GetFile(p string) (*masterpb.File, error) {
	if err := validPath(p); err != nil {
		return nil, err
	}
	var file *masterpb.File
	err := f.db.View(func(txn *badger.Txn) error {
		var err error
		file, err = getFile(txn, p)
		return err
	})
	return file, err
}

// Exists reports whether a file exists at p.
func (f *FSM) Exists(p string) (bool, error) {
	if err := validPath(p); err != nil {
		return false, err
	}
	var ok bool
	err := f.db.View(func(txn *badger.Txn) error {
		var err error
		ok, err = exists(txn, fileKey(p))
		return err
	})
	return ok, err
}

// Lookup says what p names: the file there, or a directory entry when files lie below p
// (directories exist only as the paths of the files in them), or ErrNotFound. It answers in one
// read what GetFile and a one-entry ListFiles would answer in two.
func (f *FSM) Lookup(p string) (*masterpb.ListEntry, error) {
	if err := validPath(p); err != nil {
		return nil, err
	}
	var entry *masterpb.ListEntry
	err := f.db.View(func(txn *badger.Txn) error {
		file, err := getFile(txn, p)
		if err == nil {
			entry = &masterpb.ListEntry{Path: p, File: file}
			return nil
		}
		if !errors.Is(err, ErrNotFound) {
			return err
		}
		opts := badger.DefaultIteratorOptions
		opts.Prefix = dirPrefix(p)
		opts.PrefetchValues = false
		it := txn.NewIterator(opts)
		defer it.Close()
		if it.Rewind(); !it.Valid() {
			return notFound("file or directory %s", p)
		}
		entry = &masterpb.ListEntry{Path: p, Dir: true}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return entry, nil
}

// ListFiles lists dir: its direct children (files and subdirectories) or, when recursive, every
// file below it, in path order, starting after startAfter, at most limit entries. next is the
// startAfter of the following page, empty at the end.
func (f *FSM) ListFiles(dir string, recursive bool, startAfter string, limit int) (entries []*masterpb.ListEntry, next string, err error) {
	if err := validDir(dir); err != nil {
		return nil, "", err
	}
	switch {
	case limit <= 0:
		limit = DefaultListLimit
	case limit > MaxListLimit:
		limit = MaxListLimit
	}
	prefix := dirPrefix(dir)
	dirPath := string(prefix[len(prefixFile):])
	err = f.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = prefix
		it := txn.NewIterator(opts)
		defer it.Close()
		seek := prefix
		if startAfter != "" {
			// Keys sort by path bytes, so "/d/a.txt" < "/d/a/x" < "/d/a0". After a file, resume
			// just past its key; after a directory entry, past everything in it ('0' follows '/').
			seek = append(fileKey(startAfter), 0)
			if !recursive {
				isFile, err := exists(txn, fileKey(startAfter))
				if err != nil {
					return err
				}
				if !isFile {
					seek = append(fileKey(startAfter), '/'+1)
				}
			}
			if bytes.Compare(seek, prefix) < 0 {
				seek = prefix
			}
		}
		it.Seek(seek)
		for it.ValidForPrefix(prefix) {
			if len(entries) == limit {
				next = entries[len(entries)-1].Path
				return nil
			}
			key := it.Item().Key()
			rest := string(key[len(prefix):])
			if i := strings.IndexByte(rest, '/'); !recursive && i >= 0 {
				sub := dirPath + rest[:i]
				entries = append(entries, &masterpb.ListEntry{Path: sub, Dir: true})
				it.Seek(append(fileKey(sub), '/'+1))
				continue
			}
			file := &masterpb.File{}
			if err := it.Item().Value(func(v []byte) error { return proto.Unmarshal(v, file) }); err != nil {
				return fmt.Errorf("decoding %q: %w", key, err)
			}
			entries = append(entries, &masterpb.ListEntry{Path: file.Path, File: file})
			it.Next()
		}
		return nil
	})
	if err != nil {
		return nil, "", fmt.Errorf("listing %s: %w", dir, err)
	}
	return entries, next, nil
}

// GetDataset returns the dataset called name.
func (f *FSM) GetDataset(name string) (*masterpb.Dataset, error) {
	if err := validID("dataset name", name); err != nil {
		return nil, err
	}
	ds := &masterpb.Dataset{}
	err := f.db.View(func(txn *badger.Txn) error {
		found, err := getProto(txn, datasetKey(name), ds)
		if err == nil && !found {
			err = notFound("dataset %s", name)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return ds, nil
}

// MaxLostPaths is the most lost files a usage lists (masterpb.DatasetUsage.lost_paths).
const MaxLostPaths = 10000

// DatasetUsage sums what the workers hold of the dataset called name: the bytes of its blocks
// that have a live copy, and the bytes of live copies per tier; with listLost, it lists the
// paths of its lost files too (at most MaxLostPaths). It reads every file and block of the
// dataset, so callers poll it, not call it per read.
func (f *FSM) DatasetUsage(name string, listLost bool) (*masterpb.DatasetUsage, error) {
	ds, err := f.GetDataset(name)
	if err != nil {
		return nil, err
	}
	usage := &masterpb.DatasetUsage{Name: name, Complete: ds.Complete}
	perTier := map[string]int64{}
	perNode := map[string]int64{}
	minCopies := -1
	attempts := map[string]*masterpb.AttemptUsage{}
	err = f.db.View(func(txn *badger.Txn) error {
		nodes := map[string]string{} // of the workers met so far
		nodeOf := func(worker string) (string, error) {
			if node, ok := nodes[worker]; ok {
				return node, nil
			}
			w, _, err := getWorker(txn, worker)
			if err != nil {
				return "", err
			}
			nodes[worker] = w.GetNode()
			return nodes[worker], nil
		}
		opts := badger.DefaultIteratorOptions
		opts.Prefix = dirPrefix(ds.Root)
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			file := &masterpb.File{}
			if err := it.Item().Value(func(v []byte) error { return proto.Unmarshal(v, file) }); err != nil {
				return fmt.Errorf("decoding file %s: %w", it.Item().Key(), err)
			}
			if file.Attempt != "" {
				// Not the dataset's until its attempt is published.
				a := attempts[file.Attempt]
				if a == nil {
					a = &masterpb.AttemptUsage{Attempt: file.Attempt}
					attempts[file.Attempt] = a
				}
				a.Files++
				a.Bytes += file.Size
				continue
			}
			usage.Files++
			usage.TotalBytes += file.Size
			if file.CheckpointState == masterpb.CheckpointState_CHECKPOINT_STATE_DONE {
				usage.CheckpointedBytes += file.Size
			}
			uncached := false
			for _, id := range file.BlockIds {
				b, err := getBlock(txn, id)
				if err != nil {
					return err
				}
				live := false
				counted := map[string]bool{} // the nodes this block was counted on
				for _, l := range b.Locations {
					if l.Lost {
						continue
					}
					live = true
					perTier[l.Tier] += b.Size
					node, err := nodeOf(l.Worker)
					if err != nil {
						return err
					}
					if node != "" && !counted[node] {
						counted[node] = true
						perNode[node] += b.Size
					}
				}
				if minCopies < 0 || len(counted) < minCopies {
					minCopies = len(counted)
				}
				if live {
					usage.CachedBytes += b.Size
				} else {
					uncached = true
				}
			}
			if uncached {
				usage.UncachedFiles++
				if file.CheckpointState != masterpb.CheckpointState_CHECKPOINT_STATE_DONE {
					usage.LostFiles++
					if listLost && len(usage.LostPaths) < MaxLostPaths {
						usage.LostPaths = append(usage.LostPaths, file.Path)
					}
				}
			}
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	usage.MinCopies = uint32(max(minCopies, 0))
	for _, a := range slices.Sorted(maps.Keys(attempts)) {
		usage.Attempts = append(usage.Attempts, attempts[a])
	}
	for _, tier := range slices.Sorted(maps.Keys(perTier)) {
		usage.Tiers = append(usage.Tiers, &masterpb.TierUsage{Tier: tier, UsedBytes: perTier[tier]})
	}
	for node, bytes := range perNode {
		usage.Nodes = append(usage.Nodes, &masterpb.NodeUsage{Node: node, CachedBytes: bytes})
	}
	slices.SortFunc(usage.Nodes, func(a, b *masterpb.NodeUsage) int {
		if c := cmp.Compare(b.CachedBytes, a.CachedBytes); c != 0 {
			return c
		}
		return strings.Compare(a.Node, b.Node)
	})
	return usage, nil
}

// BlockLocations returns the blocks of the file at p, or the blocks with the given ids when p is
// empty, each with its path filled in. Unknown block ids are reported as ErrNotFound.
func (f *FSM) BlockLocations(p string, ids []uint64) ([]*masterpb.Block, error) {
	var blocks []*masterpb.Block
	err := f.db.View(func(txn *badger.Txn) error {
		if p != "" {
			if err := validPath(p); err != nil {
				return err
			}
			file, err := getFile(txn, p)
			if err != nil {
				return err
			}
			ids = file.BlockIds
		}
		paths := map[uint64]string{}
		for _, id := range ids {
			b, err := getBlock(txn, id)
			if err != nil {
				return err
			}
			if _, ok := paths[b.FileId]; !ok {
				file, err := getFileByID(txn, b.FileId)
				switch {
				case err == nil:
					paths[b.FileId] = file.Path
				case errors.Is(err, ErrNotFound):
					paths[b.FileId] = ""
				default:
					return err
				}
			}
			b.Path = paths[b.FileId]
			blocks = append(blocks, b)
		}
		return nil
	})
	if err != nil {
		return nil, err
	}
	return blocks, nil
}

// GetWorker returns the worker called id.
func (f *FSM) GetWorker(id string) (*masterpb.Worker, error) {
	var w *masterpb.Worker
	err := f.db.View(func(txn *badger.Txn) error {
		var found bool
		var err error
		w, found, err = getWorker(txn, id)
		if err == nil && !found {
			err = notFound("worker %s", id)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return w, nil
}

// Workers returns every worker, alive or lost, by id.
func (f *FSM) Workers() ([]*masterpb.Worker, error) {
	var out []*masterpb.Worker
	err := scan(f.db, prefixWorker, func() proto.Message { return &masterpb.Worker{} }, func(m proto.Message) {
		out = append(out, m.(*masterpb.Worker))
	})
	return out, err
}

// RestoredFrom names the backup the state was restored from (SnapshotInfo.ID), if any.
func (f *FSM) RestoredFrom() (string, error) {
	var id string
	err := f.db.View(func(txn *badger.Txn) error {
		item, err := txn.Get(keyRestoredFrom)
		if errors.Is(err, badger.ErrKeyNotFound) {
			return nil
		}
		if err != nil {
			return err
		}
		v, err := item.ValueCopy(nil)
		id = string(v)
		return err
	})
	return id, err
}

// Holdings are what a state holds, as a restore weighs it.
type Holdings struct {
	Datasets int
	// Files are all files; Written are those a pod wrote (File.written), which exist nowhere
	// else. The others record blocks cached from a source, which workers report again when they
	// register.
	Files, Written int
}

// Holds counts the Datasets and files the state holds.
func (f *FSM) Holds() (Holdings, error) {
	var h Holdings
	err := f.db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix, opts.PrefetchValues = []byte(prefixDataset), false
		it := txn.NewIterator(opts)
		for it.Rewind(); it.Valid(); it.Next() {
			h.Datasets++
		}
		it.Close()
		opts.Prefix = []byte(prefixFile)
		it = txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			h.Files++
			file := &masterpb.File{}
			if err := it.Item().Value(func(v []byte) error { return proto.Unmarshal(v, file) }); err != nil {
				return fmt.Errorf("reading %q: %w", it.Item().Key(), err)
			}
			if file.GetWritten() {
				h.Written++
			}
		}
		return nil
	})
	return h, err
}

// Peers returns the gRPC addresses of the Raft servers, by Raft id.
func (f *FSM) Peers() ([]*masterpb.Peer, error) {
	var out []*masterpb.Peer
	err := scan(f.db, prefixPeer, func() proto.Message { return &masterpb.Peer{} }, func(m proto.Message) {
		out = append(out, m.(*masterpb.Peer))
	})
	return out, err
}

// Peer returns the peer record of a Raft server.
func (f *FSM) Peer(raftID string) (*masterpb.Peer, error) {
	p := &masterpb.Peer{}
	err := f.db.View(func(txn *badger.Txn) error {
		found, err := getProto(txn, peerKey(raftID), p)
		if err == nil && !found {
			err = notFound("peer %s", raftID)
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	return p, nil
}

func scan(db *badger.DB, prefix string, alloc func() proto.Message, emit func(proto.Message)) error {
	err := db.View(func(txn *badger.Txn) error {
		opts := badger.DefaultIteratorOptions
		opts.Prefix = []byte(prefix)
		it := txn.NewIterator(opts)
		defer it.Close()
		for it.Rewind(); it.Valid(); it.Next() {
			m := alloc()
			if err := it.Item().Value(func(v []byte) error { return proto.Unmarshal(v, m) }); err != nil {
				return fmt.Errorf("decoding %q: %w", it.Item().Key(), err)
			}
			emit(m)
		}
		return nil
	})
	if err != nil {
		return fmt.Errorf("scanning %s: %w", prefix, err)
	}
	return nil
}

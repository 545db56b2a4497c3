package fsm

import (
	"bytes"
	"encoding/binary"
	"errors"
	"fmt"
	"path"
	"sort"

	"github.com/dgraph-io/badger/v4"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/master/masterpb"
)

// Command handlers. Each one checks everything it needs before it writes, reads only through
// txn, and takes time only from its at argument (the envelope's timestamp).

// getProto loads key into m; found is false when the key is absent.
func getProto(txn *badger.Txn, key []byte, m proto.Message) (found bool, err error) {
	item, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading %q: %w", key, err)
	}
	err = item.Value(func(v []byte) error { return proto.Unmarshal(v, m) })
	if err != nil {
		return false, fmt.Errorf("decoding %q: %w", key, err)
	}
	return true, nil
}

func putProto(txn *badger.Txn, key []byte, m proto.Message) error {
	// Deterministic marshaling keeps the stored bytes identical on every replica.
	v, err := proto.MarshalOptions{Deterministic: true}.Marshal(m)
	if err != nil {
		return fmt.Errorf("encoding %q: %w", key, err)
	}
	if err := txn.Set(key, v); err != nil {
		return fmt.Errorf("writing %q: %w", key, err)
	}
	return nil
}

func del(txn *badger.Txn, key []byte) error {
	if err := txn.Delete(key); err != nil {
		return fmt.Errorf("deleting %q: %w", key, err)
	}
	return nil
}

func exists(txn *badger.Txn, key []byte) (bool, error) {
	_, err := txn.Get(key)
	if errors.Is(err, badger.ErrKeyNotFound) {
		return false, nil
	}
	if err != nil {
		return false, fmt.Errorf("reading %q: %w", key, err)
	}
	return true, nil
}

// hasPrefix reports whether any key starts with prefix.
func hasPrefix(txn *badger.Txn, prefix []byte) bool {
	opts := badger.DefaultIteratorOptions
	opts.PrefetchValues = false
	opts.Prefix = prefix
	it := txn.NewIterator(opts)
	defer it.Close()
	it.Seek(prefix)
	return it.ValidForPrefix(prefix)
}

func getFile(txn *badger.Txn, p string) (*masterpb.File, error) {
	f := &masterpb.File{}
	found, err := getProto(txn, fileKey(p), f)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, notFound("file %s", p)
	}
	return f, nil
}

func getFileByID(txn *badger.Txn, id uint64) (*masterpb.File, error) {
	item, err := txn.Get(fileIDKey(id))
	if errors.Is(err, badger.ErrKeyNotFound) {
		return nil, notFound("file id %d", id)
	}
	if err != nil {
		return nil, fmt.Errorf("reading file id %d: %w", id, err)
	}
	p, err := item.ValueCopy(nil)
	if err != nil {
		return nil, fmt.Errorf("reading file id %d: %w", id, err)
	}
	return getFile(txn, string(p))
}

func getDataset(txn *badger.Txn, name string) (*masterpb.Dataset, error) {
	ds := &masterpb.Dataset{}
	found, err := getProto(txn, datasetKey(name), ds)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, notFound("dataset %s", name)
	}
	return ds, nil
}

func getBlock(txn *badger.Txn, id uint64) (*masterpb.Block, error) {
	b := &masterpb.Block{}
	found, err := getProto(txn, blockKey(id), b)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, notFound("block %d", id)
	}
	return b, nil
}

func getWorker(txn *badger.Txn, id string) (*masterpb.Worker, bool, error) {
	w := &masterpb.Worker{}
	found, err := getProto(txn, workerKey(id), w)
	return w, found, err
}

// checkNamespace makes p usable as a new file: no ancestor is a file and p is not a directory.
func checkNamespace(txn *badger.Txn, p string) error {
	for dir := path.Dir(p); dir != "/"; dir = path.Dir(dir) {
		ok, err := exists(txn, fileKey(dir))
		if err != nil {
			return err
		}
		if ok {
			return failedPrecondition("cannot create %s: %s is a file", p, dir)
		}
	}
	if hasPrefix(txn, dirPrefix(p)) {
		return alreadyExists("%s is a directory", p)
	}
	return nil
}

func createFile(txn *badger.Txn, at int64, req *masterpb.CreateFileRequest) (proto.Message, error) {
	if err := validPath(req.Path); err != nil {
		return nil, err
	}
	for _, parent := range req.Parents {
		if err := validPath(parent); err != nil {
			return nil, invalid("lineage parent: %v", err)
		}
	}
	ds := &masterpb.Dataset{}
	if req.Dataset != "" {
		var err error
		if ds, err = getDataset(txn, req.Dataset); err != nil {
			return nil, err
		}
		if !under(req.Path, ds.Root) {
			return nil, invalid("path %s is outside dataset %s (root %s)", req.Path, ds.Name, ds.Root)
		}
	}
	existing := &masterpb.File{}
	found, err := getProto(txn, fileKey(req.Path), existing)
	if err != nil {
		return nil, err
	}
	attempt := attemptOf(ds, req.Attempt)
	if found {
		if req.ClientToken != "" && existing.ClientToken == req.ClientToken {
			// A retry of the request that created the file.
			return existing, nil
		}
		if !supersedes(attempt, existing) {
			return nil, alreadyExists("file %s", req.Path)
		}
	}
	if ds.Complete {
		return nil, completeError(ds, "create", req.Path)
	}
	if found {
		if _, err := removeFile(txn, existing); err != nil {
			return nil, err
		}
	}
	if err := checkNamespace(txn, req.Path); err != nil {
		return nil, err
	}
	id, err := nextFileID(txn)
	if err != nil {
		return nil, err
	}
	f := &masterpb.File{
		Id:               id,
		Path:             req.Path,
		Dataset:          req.Dataset,
		CreatedUnixNano:  at,
		ModifiedUnixNano: at,
		Parents:          req.Parents,
		Lineage:          req.Lineage,
		ClientToken:      req.ClientToken,
		Access:           &masterpb.AccessStats{},
		Attempt:          attempt,
		Written:          req.Written,
	}
	if err := putProto(txn, fileKey(f.Path), f); err != nil {
		return nil, err
	}
	if err := txn.Set(fileIDKey(id), []byte(f.Path)); err != nil {
		return nil, fmt.Errorf("indexing file id %d: %w", id, err)
	}
	return f, nil
}

func nextFileID(txn *badger.Txn) (uint64, error) {
	id := uint64(1)
	item, err := txn.Get(keyNextFileID)
	switch {
	case errors.Is(err, badger.ErrKeyNotFound):
	case err != nil:
		return 0, fmt.Errorf("reading next file id: %w", err)
	default:
		if err := item.Value(func(v []byte) error {
			if len(v) != 8 {
				return fmt.Errorf("next-file-id record has %d bytes", len(v))
			}
			id = binary.BigEndian.Uint64(v)
			return nil
		}); err != nil {
			return 0, err
		}
	}
	if err := txn.Set(keyNextFileID, u64(id+1)); err != nil {
		return 0, fmt.Errorf("writing next file id: %w", err)
	}
	return id, nil
}

func renameFile(txn *badger.Txn, at int64, req *masterpb.RenameFileRequest) (proto.Message, error) {
	if err := validPath(req.From); err != nil {
		return nil, err
	}
	if err := validPath(req.To); err != nil {
		return nil, err
	}
	f, err := getFile(txn, req.From)
	if err != nil {
		return nil, err
	}
	if req.From == req.To {
		return f, nil
	}
	target := &masterpb.File{}
	ok, err := getProto(txn, fileKey(req.To), target)
	if err != nil {
		return nil, err
	}
	if ok && !supersedes(f.Attempt, target) {
		return nil, alreadyExists("file %s", req.To)
	}
	if err := checkNamespace(txn, req.To); err != nil {
		return nil, err
	}
	if f.Dataset != "" {
		ds := &masterpb.Dataset{}
		if _, err := getProto(txn, datasetKey(f.Dataset), ds); err != nil {
			return nil, err
		}
		if ds.Root != "" && !under(req.To, ds.Root) {
			return nil, failedPrecondition("cannot move %s out of dataset %s (root %s)", req.From, ds.Name, ds.Root)
		}
		if ds.Complete {
			return nil, completeError(ds, "rename", req.From)
		}
	}
	if ok {
		if _, err := removeFile(txn, target); err != nil {
			return nil, err
		}
	}
	if err := del(txn, fileKey(req.From)); err != nil {
		return nil, err
	}
	f.Path = req.To
	f.ModifiedUnixNano = at
	if err := putProto(txn, fileKey(f.Path), f); err != nil {
		return nil, err
	}
	if err := txn.Set(fileIDKey(f.Id), []byte(f.Path)); err != nil {
		return nil, fmt.Errorf("indexing file id %d: %w", f.Id, err)
	}
	return f, nil
}

// removeFile deletes a file, its blocks and their worker indexes; it returns the number of keys
// it deleted, which bounds dataset deletion steps.
func removeFile(txn *badger.Txn, f *masterpb.File) (keys int, err error) {
	for _, bid := range f.BlockIds {
		b, err := getBlock(txn, bid)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return keys, err
		}
		for _, loc := range b.Locations {
			if !loc.Lost {
				if err := del(txn, workerBlockKey(loc.Worker, bid)); err != nil {
					return keys, err
				}
				keys++
			}
		}
		if err := del(txn, blockKey(bid)); err != nil {
			return keys, err
		}
		keys++
	}
	if err := del(txn, fileKey(f.Path)); err != nil {
		return keys, err
	}
	if err := del(txn, fileIDKey(f.Id)); err != nil {
		return keys, err
	}
	return keys + 2, nil
}

func deleteFile(txn *badger.Txn, req *masterpb.DeleteFileRequest) (proto.Message, error) {
	if err := validPath(req.Path); err != nil {
		return nil, err
	}
	f, err := getFile(txn, req.Path)
	if err != nil {
		return nil, err
	}
	if f.Dataset != "" {
		ds := &masterpb.Dataset{}
		if _, err := getProto(txn, datasetKey(f.Dataset), ds); err != nil {
			return nil, err
		}
		if ds.Complete {
			return nil, completeError(ds, "delete", req.Path)
		}
	}
	if _, err := removeFile(txn, f); err != nil {
		return nil, err
	}
	return &masterpb.DeleteFileResponse{BlocksDeleted: uint64(len(f.BlockIds))}, nil
}

// completeError refuses to change a complete dataset's files.
func completeError(ds *masterpb.Dataset, action, p string) error {
	return failedPrecondition("cannot %s %s: dataset %s is complete (its writer finished), so its files no longer change; "+
		"deleting the dataset, as a recomputation does, makes it writable again", action, p, ds.Name)
}

// completeDataset marks a dataset complete (see masterpb.Dataset); marking it again is a no-op.
func completeDataset(txn *badger.Txn, req *masterpb.CompleteDatasetRequest) (proto.Message, error) {
	ds, err := getDataset(txn, req.Name)
	if err != nil {
		return nil, err
	}
	if ds.Complete {
		return ds, nil
	}
	ds.Complete = true
	if err := putProto(txn, datasetKey(ds.Name), ds); err != nil {
		return nil, err
	}
	return ds, nil
}

// reopenDataset clears a dataset's complete flag: its files may be written again.
func reopenDataset(txn *badger.Txn, req *masterpb.ReopenDatasetRequest) (proto.Message, error) {
	ds, err := getDataset(txn, req.Name)
	if err != nil {
		return nil, err
	}
	if !ds.Complete {
		return ds, nil
	}
	ds.Complete = false
	if err := putProto(txn, datasetKey(ds.Name), ds); err != nil {
		return nil, err
	}
	return ds, nil
}

// setDatasetRecovery sets what a read of the dataset's lost files does, registering the dataset
// (with the request's root) when it is not known: a recomputation made the master forget it.
func setDatasetRecovery(txn *badger.Txn, at int64, req *masterpb.SetDatasetRecoveryRequest) (proto.Message, error) {
	if req.Recovery.GetWaitSeconds() < 0 {
		return nil, invalid("recovery wait_seconds must not be negative, got %d", req.Recovery.GetWaitSeconds())
	}
	registered, err := registerDataset(txn, at, &masterpb.RegisterDatasetRequest{Name: req.Name, Root: req.Root})
	if err != nil {
		return nil, err
	}
	ds := registered.(*masterpb.Dataset)
	if proto.Equal(ds.Recovery, req.Recovery) {
		return ds, nil
	}
	ds.Recovery = req.Recovery
	if err := putProto(txn, datasetKey(ds.Name), ds); err != nil {
		return nil, err
	}
	return ds, nil
}

// sealFile creates a file and commits its blocks in one transaction (see
// masterpb.SealFileRequest). A retry finds the file its first attempt made, by client token.
func sealFile(txn *badger.Txn, at int64, req *masterpb.SealFileRequest) (proto.Message, error) {
	switch {
	case req.ClientToken == "":
		return nil, invalid("sealing %s needs a client token, so that a retry finds the file", req.Path)
	case len(req.Blocks) > MaxSealBlocks:
		return nil, invalid("sealing %s: %d blocks, more than the %d one command takes; create the file and commit its blocks instead",
			req.Path, len(req.Blocks), MaxSealBlocks)
	}
	if existing, err := getFile(txn, req.Path); err == nil && existing.ClientToken == req.ClientToken {
		return existing, nil
	}
	if _, err := createFile(txn, at, &masterpb.CreateFileRequest{Path: req.Path, Dataset: req.Dataset, ClientToken: req.ClientToken, Attempt: req.Attempt, Written: req.Written}); err != nil {
		return nil, err
	}
	for _, b := range req.Blocks {
		commit := proto.Clone(b).(*masterpb.CommitBlockRequest)
		commit.Path = req.Path
		if _, err := commitBlock(txn, at, commit); err != nil {
			return nil, err
		}
	}
	return getFile(txn, req.Path)
}

// attemptOf is the attempt a file of ds written by the attempt named in a request belongs to:
// that one when ds commits per attempt, none (published at once) otherwise.
func attemptOf(ds *masterpb.Dataset, requested string) string {
	if !ds.GetRecovery().GetCommitPerAttempt() {
		return ""
	}
	return requested
}

// supersedes says whether a file of attempt may take the place of existing: an unsettled
// attempt's file gives way to another attempt's (a retry of a killed pod writes the same paths;
// the killed one's files are discarded anyway), a published file to nothing.
func supersedes(attempt string, existing *masterpb.File) bool {
	return attempt != "" && existing.Attempt != ""
}

// settleAttemptStep publishes (clears File.attempt) or discards at most limit keys' worth of
// the files of one attempt of a dataset's writer; done says none is left. A complete dataset
// takes no more files, so publishing there is refused; discarding is not.
func settleAttemptStep(txn *badger.Txn, req *masterpb.SettleAttemptStep) (proto.Message, error) {
	if req.Attempt == "" {
		return nil, invalid("settling an attempt of dataset %s needs the attempt's name", req.Dataset)
	}
	ds, err := getDataset(txn, req.Dataset)
	if err != nil {
		return nil, err
	}
	cost := removalCost
	if req.Publish {
		cost = func(*masterpb.File) int { return 1 } // its record rewritten
	}
	files, more, err := filesForStep(txn, ds.Root, req.Limit, func(f *masterpb.File) bool { return f.Attempt == req.Attempt }, cost)
	if err != nil {
		return nil, err
	}
	if req.Publish && ds.Complete && len(files) > 0 {
		return nil, completeError(ds, "publish the files of attempt "+req.Attempt+" in", ds.Root)
	}
	for _, f := range files {
		if !req.Publish {
			if _, err := removeFile(txn, f); err != nil {
				return nil, err
			}
			continue
		}
		f.Attempt = ""
		if err := putProto(txn, fileKey(f.Path), f); err != nil {
			return nil, err
		}
	}
	return &masterpb.SettleAttemptStepResult{Files: uint64(len(files)), Done: !more}, nil
}

// forgetWorker removes the record of a lost worker whose blocks were all marked lost. The lost
// copies stay on the blocks' records (readers skip them), so that a block whose last copy was
// there is still known to be lost.
func forgetWorker(txn *badger.Txn, req *masterpb.ForgetWorkerRequest) (proto.Message, error) {
	if err := validID("worker id", req.Worker); err != nil {
		return nil, err
	}
	w, found, err := getWorker(txn, req.Worker)
	switch {
	case err != nil:
		return nil, err
	case !found:
		return &masterpb.ForgetWorkerResponse{}, nil
	case w.State != masterpb.WorkerState_WORKER_STATE_LOST:
		return nil, failedPrecondition("worker %s is alive: mark it lost first (MarkWorkerLost), so that its blocks are accounted for", w.Id)
	case w.LossPending:
		return nil, failedPrecondition("worker %s is still being marked lost: forget it once MarkWorkerLost has returned", w.Id)
	}
	if err := del(txn, workerKey(w.Id)); err != nil {
		return nil, err
	}
	return &masterpb.ForgetWorkerResponse{Forgotten: true}, nil
}

func registerDataset(txn *badger.Txn, at int64, req *masterpb.RegisterDatasetRequest) (proto.Message, error) {
	if err := validID("dataset name", req.Name); err != nil {
		return nil, err
	}
	if err := validPath(req.Root); err != nil {
		return nil, invalid("dataset root: %v", err)
	}
	existing := &masterpb.Dataset{}
	found, err := getProto(txn, datasetKey(req.Name), existing)
	if err != nil {
		return nil, err
	}
	if found {
		if existing.Root == req.Root && existing.Source == req.Source {
			return existing, nil
		}
		return nil, alreadyExists("dataset %s with root %s and source %q", req.Name, existing.Root, existing.Source)
	}
	// Roots must not nest: deleting one dataset would delete another's files.
	opts := badger.DefaultIteratorOptions
	opts.Prefix = []byte(prefixDataset)
	it := txn.NewIterator(opts)
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		other := &masterpb.Dataset{}
		if err := it.Item().Value(func(v []byte) error { return proto.Unmarshal(v, other) }); err != nil {
			return nil, fmt.Errorf("decoding dataset %q: %w", it.Item().Key(), err)
		}
		if other.Root == req.Root || under(req.Root, other.Root) || under(other.Root, req.Root) {
			return nil, failedPrecondition("root %s overlaps dataset %s (root %s)", req.Root, other.Name, other.Root)
		}
	}
	ok, err := exists(txn, fileKey(req.Root))
	if err != nil {
		return nil, err
	}
	if ok {
		return nil, failedPrecondition("root %s is a file", req.Root)
	}
	ds := &masterpb.Dataset{Name: req.Name, Root: req.Root, Source: req.Source, CreatedUnixNano: at}
	if err := putProto(txn, datasetKey(ds.Name), ds); err != nil {
		return nil, err
	}
	return ds, nil
}

// defaultStepLimit bounds the keys one step of a multi-step command touches when the command
// does not say.
const defaultStepLimit = 1024

// removalCost bounds the keys removing f touches: its records, and each block's with its copies.
func removalCost(f *masterpb.File) int { return 2 + len(f.BlockIds)*(1+MaxLocationsPerBlock) }

// filesForStep collects, in key order, the files below root that match, as many as one step of
// a multi-step command may touch: at most limit keys (defaultStepLimit if 0) as cost counts them,
// and always at least one. more says files were left for the next step. The files are collected
// first and changed after: the iterator must not see its own changes.
func filesForStep(txn *badger.Txn, root string, limit uint32, match func(*masterpb.File) bool, cost func(*masterpb.File) int) (files []*masterpb.File, more bool, err error) {
	budget := int(limit)
	if budget == 0 {
		budget = defaultStepLimit
	}
	opts := badger.DefaultIteratorOptions
	opts.Prefix = dirPrefix(root)
	it := txn.NewIterator(opts)
	defer it.Close()
	for it.Rewind(); it.Valid(); it.Next() {
		f := &masterpb.File{}
		if err := it.Item().Value(func(v []byte) error { return proto.Unmarshal(v, f) }); err != nil {
			return nil, false, fmt.Errorf("decoding %q: %w", it.Item().Key(), err)
		}
		if !match(f) {
			continue
		}
		c := cost(f)
		if len(files) > 0 && c > budget {
			return files, true, nil
		}
		files = append(files, f)
		budget -= c
	}
	return files, false, nil
}

func deleteDatasetStep(txn *badger.Txn, req *masterpb.DeleteDatasetStep) (proto.Message, error) {
	ds, err := getDataset(txn, req.Name)
	if err != nil {
		return nil, err
	}
	files, more, err := filesForStep(txn, ds.Root, req.Limit, func(*masterpb.File) bool { return true }, removalCost)
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		if _, err := removeFile(txn, f); err != nil {
			return nil, err
		}
	}
	res := &masterpb.DeleteDatasetStepResult{FilesDeleted: uint64(len(files)), Done: !more}
	if !more {
		if err := del(txn, datasetKey(ds.Name)); err != nil {
			return nil, err
		}
	}
	return res, nil
}

func commitBlock(txn *badger.Txn, at int64, req *masterpb.CommitBlockRequest) (proto.Message, error) {
	switch {
	case req.BlockId == 0:
		return nil, invalid("block id 0 is reserved")
	case req.Offset < 0 || req.Size < 0:
		return nil, invalid("block %d: negative offset or size", req.BlockId)
	case req.Tier == "":
		return nil, invalid("block %d: empty tier", req.BlockId)
	}
	if err := validPath(req.Path); err != nil {
		return nil, err
	}
	if err := validID("worker", req.Worker); err != nil {
		return nil, err
	}
	f, err := getFile(txn, req.Path)
	if err != nil {
		return nil, err
	}
	w, found, err := getWorker(txn, req.Worker)
	if err != nil {
		return nil, err
	}
	if !found || w.State != masterpb.WorkerState_WORKER_STATE_ALIVE {
		return nil, failedPrecondition("worker %s is not registered as alive", req.Worker)
	}

	b := &masterpb.Block{}
	found, err = getProto(txn, blockKey(req.BlockId), b)
	if err != nil {
		return nil, err
	}
	if found {
		if b.FileId != f.Id || b.Offset != req.Offset || b.Size != req.Size || b.Checksum != req.Checksum {
			return nil, failedPrecondition("block %d is committed with file id %d, offset %d, size %d, checksum %q",
				b.Id, b.FileId, b.Offset, b.Size, b.Checksum)
		}
	} else {
		if len(f.BlockIds) >= MaxBlocksPerFile {
			return nil, failedPrecondition("file %s has the maximum of %d blocks", f.Path, MaxBlocksPerFile)
		}
		b = &masterpb.Block{Id: req.BlockId, FileId: f.Id, Offset: req.Offset, Size: req.Size, Checksum: req.Checksum}
		if err := insertBlock(txn, f, b); err != nil {
			return nil, err
		}
		if end := req.Offset + req.Size; end > f.Size {
			f.Size = end
		}
		f.ModifiedUnixNano = at
		if err := putProto(txn, fileKey(f.Path), f); err != nil {
			return nil, err
		}
	}

	// A known copy on this worker is updated in place: a tier move, or a copy that survived the
	// worker's loss and is reported again.
	var loc *masterpb.BlockLocation
	for _, l := range b.Locations {
		if l.Worker == req.Worker {
			loc = l
		}
	}
	if loc == nil {
		if len(b.Locations) >= MaxLocationsPerBlock {
			return nil, failedPrecondition("block %d has the maximum of %d locations", b.Id, MaxLocationsPerBlock)
		}
		loc = &masterpb.BlockLocation{Worker: req.Worker}
		b.Locations = append(b.Locations, loc)
	}
	loc.Tier, loc.Lost = req.Tier, false
	if err := putProto(txn, blockKey(b.Id), b); err != nil {
		return nil, err
	}
	if err := txn.Set(workerBlockKey(req.Worker, b.Id), nil); err != nil {
		return nil, fmt.Errorf("indexing block %d on worker %s: %w", b.Id, req.Worker, err)
	}
	return b, nil
}

// removeBlockCopy forgets one worker's copy of a block; a copy the master does not list is
// forgotten already. The block itself stays: other copies, its checkpoint or its under-store
// still serve it.
func removeBlockCopy(txn *badger.Txn, req *masterpb.RemoveBlockCopyRequest) (proto.Message, error) {
	if req.BlockId == 0 {
		return nil, invalid("block id 0 is reserved")
	}
	if err := validID("worker", req.Worker); err != nil {
		return nil, err
	}
	b, err := getBlock(txn, req.BlockId)
	if err != nil {
		return nil, err
	}
	kept := b.Locations[:0]
	for _, l := range b.Locations {
		if l.Worker != req.Worker {
			kept = append(kept, l)
		}
	}
	if len(kept) == len(b.Locations) {
		return b, nil
	}
	b.Locations = kept
	if err := putProto(txn, blockKey(b.Id), b); err != nil {
		return nil, err
	}
	if err := del(txn, workerBlockKey(req.Worker, b.Id)); err != nil {
		return nil, fmt.Errorf("unindexing block %d on worker %s: %w", b.Id, req.Worker, err)
	}
	return b, nil
}

// insertBlock adds b to f's block list in offset order (a binary search that reads the blocks it
// compares against; writers append, so the common case reads one block).
func insertBlock(txn *badger.Txn, f *masterpb.File, b *masterpb.Block) error {
	offsets := make(map[int]int64)
	var readErr error
	offsetAt := func(i int) int64 {
		if o, ok := offsets[i]; ok {
			return o
		}
		other, err := getBlock(txn, f.BlockIds[i])
		if err != nil {
			readErr = err
			return 0
		}
		offsets[i] = other.Offset
		return other.Offset
	}
	n := len(f.BlockIds)
	i := n
	if n > 0 && offsetAt(n-1) >= b.Offset {
		i = sort.Search(n, func(i int) bool { return offsetAt(i) >= b.Offset })
	}
	if readErr != nil {
		return readErr
	}
	if i < n && offsetAt(i) == b.Offset {
		return failedPrecondition("file %s already has block %d at offset %d", f.Path, f.BlockIds[i], b.Offset)
	}
	f.BlockIds = append(f.BlockIds, 0)
	copy(f.BlockIds[i+1:], f.BlockIds[i:])
	f.BlockIds[i] = b.Id
	return readErr
}

func registerWorker(txn *badger.Txn, at int64, req *masterpb.RegisterWorkerRequest) (proto.Message, error) {
	if err := validID("worker id", req.Id); err != nil {
		return nil, err
	}
	w, found, err := getWorker(txn, req.Id)
	if err != nil {
		return nil, err
	}
	if found && w.LossPending {
		return nil, failedPrecondition("worker %s: its loss is still being recorded; register again shortly", req.Id)
	}
	registered := at
	if found && w.State == masterpb.WorkerState_WORKER_STATE_ALIVE {
		registered = w.RegisteredUnixNano
	}
	w = &masterpb.Worker{
		Id:                    req.Id,
		Address:               req.Address,
		Node:                  req.Node,
		Tiers:                 req.Tiers,
		State:                 masterpb.WorkerState_WORKER_STATE_ALIVE,
		RegisteredUnixNano:    registered,
		LastHeartbeatUnixNano: at,
	}
	if err := putProto(txn, workerKey(w.Id), w); err != nil {
		return nil, err
	}
	return w, nil
}

func heartbeat(txn *badger.Txn, at int64, req *masterpb.HeartbeatRequest) (proto.Message, error) {
	if err := validID("worker id", req.Worker); err != nil {
		return nil, err
	}
	w, found, err := getWorker(txn, req.Worker)
	if err != nil {
		return nil, err
	}
	if !found || w.State != masterpb.WorkerState_WORKER_STATE_ALIVE {
		return &masterpb.HeartbeatResponse{Command: masterpb.WorkerCommand_WORKER_COMMAND_REGISTER}, nil
	}
	w.LastHeartbeatUnixNano = at
	if len(req.Tiers) > 0 {
		w.Tiers = req.Tiers
	}
	if err := putProto(txn, workerKey(w.Id), w); err != nil {
		return nil, err
	}
	return &masterpb.HeartbeatResponse{}, nil
}

func markWorkerLostStep(txn *badger.Txn, at int64, req *masterpb.MarkWorkerLostStep) (proto.Message, error) {
	if err := validID("worker id", req.Worker); err != nil {
		return nil, err
	}
	w, found, err := getWorker(txn, req.Worker)
	if err != nil {
		return nil, err
	}
	if !found {
		return nil, notFound("worker %s", req.Worker)
	}
	res := &masterpb.MarkWorkerLostStepResult{Counts: &masterpb.MarkWorkerLostResponse{}}
	switch {
	case w.State != masterpb.WorkerState_WORKER_STATE_LOST:
		w.State = masterpb.WorkerState_WORKER_STATE_LOST
		w.LostReason, w.LostUnixNano, w.LossPending = req.Reason, at, true
	case !w.LossPending:
		res.Done = true
		return res, nil
	}
	limit := int(req.Limit)
	if limit == 0 {
		limit = defaultStepLimit
	}

	prefix := workerBlockPrefix(w.Id)
	var blockIDs []uint64
	opts := badger.DefaultIteratorOptions
	opts.PrefetchValues = false
	opts.Prefix = prefix
	it := txn.NewIterator(opts)
	for it.Rewind(); it.Valid() && len(blockIDs) <= limit; it.Next() {
		blockIDs = append(blockIDs, binary.BigEndian.Uint64(bytes.TrimPrefix(it.Item().Key(), prefix)))
	}
	it.Close()
	if len(blockIDs) > limit {
		blockIDs = blockIDs[:limit]
	} else {
		res.Done = true
		w.LossPending = false
	}

	alive := map[string]bool{w.Id: false}
	isAlive := func(id string) (bool, error) {
		if a, ok := alive[id]; ok {
			return a, nil
		}
		other, found, err := getWorker(txn, id)
		if err != nil {
			return false, err
		}
		alive[id] = found && other.State == masterpb.WorkerState_WORKER_STATE_ALIVE
		return alive[id], nil
	}
	for _, bid := range blockIDs {
		if err := del(txn, workerBlockKey(w.Id, bid)); err != nil {
			return nil, err
		}
		b, err := getBlock(txn, bid)
		if errors.Is(err, ErrNotFound) {
			continue
		}
		if err != nil {
			return nil, err
		}
		loss := &masterpb.BlockLoss{Worker: w.Id, Reason: req.Reason, AtUnixNano: at}
		for _, loc := range b.Locations {
			if loc.Worker == w.Id {
				loc.Lost = true
				continue
			}
			if !loc.Lost {
				a, err := isAlive(loc.Worker)
				if err != nil {
					return nil, err
				}
				loss.ReplicaExists = loss.ReplicaExists || a
			}
		}
		f, err := getFileByID(txn, b.FileId)
		switch {
		case err == nil:
			loss.CheckpointExists = f.CheckpointState == masterpb.CheckpointState_CHECKPOINT_STATE_DONE
		case !errors.Is(err, ErrNotFound):
			return nil, err
		}
		b.Loss = loss
		if err := putProto(txn, blockKey(b.Id), b); err != nil {
			return nil, err
		}
		c := res.Counts
		c.BlocksLost++
		switch {
		case loss.ReplicaExists:
			c.BlocksWithReplica++
		case loss.CheckpointExists:
			c.BlocksWithCheckpoint++
		default:
			c.BlocksUnrecoverable++
		}
	}
	if err := putProto(txn, workerKey(w.Id), w); err != nil {
		return nil, err
	}
	return res, nil
}

func checkpointFile(txn *badger.Txn, at int64, req *masterpb.CheckpointFileRequest) (proto.Message, error) {
	if err := validPath(req.Path); err != nil {
		return nil, err
	}
	if _, ok := masterpb.CheckpointState_name[int32(req.State)]; !ok {
		return nil, invalid("unknown checkpoint state %d", req.State)
	}
	f, err := getFile(txn, req.Path)
	if err != nil {
		return nil, err
	}
	if req.ClientToken != "" && req.ClientToken != f.ClientToken {
		return nil, failedPrecondition("cannot record a checkpoint of %s: it was written again since (client token %q, not %q)",
			req.Path, f.ClientToken, req.ClientToken)
	}
	f.CheckpointState, f.CheckpointUri, f.CheckpointVersion, f.ModifiedUnixNano = req.State, req.Uri, req.Version, at
	if err := putProto(txn, fileKey(f.Path), f); err != nil {
		return nil, err
	}
	return f, nil
}

func recordAccess(txn *badger.Txn, at int64, req *masterpb.RecordAccessRequest) (proto.Message, error) {
	if err := validPath(req.Path); err != nil {
		return nil, err
	}
	f, err := getFile(txn, req.Path)
	if err != nil {
		return nil, err
	}
	if f.Access == nil {
		f.Access = &masterpb.AccessStats{}
	}
	reads := req.Reads
	if reads == 0 {
		reads = 1
	}
	f.Access.Reads += reads
	f.Access.LastAccessUnixNano = at
	if err := putProto(txn, fileKey(f.Path), f); err != nil {
		return nil, err
	}
	return f, nil
}

func setPeer(txn *badger.Txn, req *masterpb.SetPeer) (proto.Message, error) {
	if req.Peer == nil {
		return nil, invalid("set-peer without a peer")
	}
	if err := validID("raft id", req.Peer.RaftId); err != nil {
		return nil, err
	}
	if err := putProto(txn, peerKey(req.Peer.RaftId), req.Peer); err != nil {
		return nil, err
	}
	return req.Peer, nil
}

func removePeer(txn *badger.Txn, req *masterpb.RemovePeer) (proto.Message, error) {
	if err := validID("raft id", req.RaftId); err != nil {
		return nil, err
	}
	if err := del(txn, peerKey(req.RaftId)); err != nil {
		return nil, err
	}
	return &masterpb.Peer{RaftId: req.RaftId}, nil
}

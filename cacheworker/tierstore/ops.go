package tierstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"slices"
	"strings"

	"github.com/strata-cache/strata/cacheworker/blockindex"
)

// lookupAttempts bounds how often a read looks a block up again because it was moved between
// the lookup and the open. Each retry needs a whole move to complete in that gap, so more
// than a few means something else is wrong.
const lookupAttempts = 4

// Put stores size bytes from r as block id in the top tier, making room by demotion if the
// tier would pass its high watermark. It fails with ErrExists if the id is stored or being
// stored, and with a *TierFullError (ErrTierFull) if no room can be made without losing data.
func (s *Store) Put(ctx context.Context, id string, r io.Reader, size int64, opts PutOptions) (BlockInfo, error) {
	return s.store(ctx, id, size, opts, nil, func(d *dir, durable bool) (uint32, error) {
		return writeFile(ctx, d.path, id, r, size, opts.Checksum, durable)
	})
}

// Adopt stores the size bytes of the file at path as block id in the top tier, as Put does,
// without copying them when it can: a file on the file system of the top tier's directory
// becomes the block by a hard link (see linkFile); another is copied. path is left in place
// either way, for the caller to remove once Adopt returned, so that a process killed in
// between still has the bytes where they were. The caller must not change the file while it
// is stored: the block and path may be the same file.
func (s *Store) Adopt(ctx context.Context, id, path string, size int64, opts PutOptions) (BlockInfo, error) {
	return s.store(ctx, id, size, opts, sameFileSystem(s.tiers[0].dirs, path), func(d *dir, durable bool) (uint32, error) {
		sum, err := linkFile(ctx, d.path, id, path, size, opts.Checksum, durable)
		if !errors.Is(err, errOtherFileSystem) {
			return sum, err
		}
		f, err := openBlock(path)
		if err != nil {
			return 0, fmt.Errorf("storing block %s: %w", id, err)
		}
		defer func() { _ = f.Close() }() // read only
		return writeFile(ctx, d.path, id, f, size, opts.Checksum, durable)
	})
}

// store stores block id of size bytes in the top tier with write, which puts the block's file
// in a directory of that tier (one of dirs, when there are any) and returns its checksum; see
// Put.
func (s *Store) store(ctx context.Context, id string, size int64, opts PutOptions, dirs []*dir,
	write func(d *dir, durable bool) (uint32, error),
) (BlockInfo, error) {
	if err := blockindex.ValidateID(id); err != nil {
		return BlockInfo{}, fmt.Errorf("storing block: %w", err)
	}
	if size < 0 {
		return BlockInfo{}, fmt.Errorf("storing block %s: negative size %d", id, size)
	}
	if err := s.enter(); err != nil {
		return BlockInfo{}, err
	}
	defer s.exit()

	s.mu.Lock()
	if s.blocks[id] != nil || s.pending[id] {
		s.mu.Unlock()
		return BlockInfo{}, fmt.Errorf("storing block %s: %w", id, ErrExists)
	}
	s.pending[id] = true
	s.mu.Unlock()
	defer func() {
		s.mu.Lock()
		delete(s.pending, id)
		s.mu.Unlock()
	}()

	top := s.tiers[0]
	dataset := s.datasetOf(opts.Origin)
	if err := s.reserve(ctx, top, size, dataset); err != nil {
		return BlockInfo{}, fmt.Errorf("storing block %s: %w", id, err)
	}
	d := s.pickDirOf(top, size, dirs)
	// A block that exists nowhere else is synced, unless its directory is in memory.
	durable := !opts.Clean && !d.volatile
	sum, err := write(d, durable)
	if err != nil {
		s.release(top, d, size)
		return BlockInfo{}, err
	}
	now := s.cfg.Now()
	b := &block{id: id, tier: top, dir: d, size: size, checksum: sum, created: now, lastAccess: now,
		clean: opts.Clean, pinned: opts.Pinned, origin: slices.Clone(opts.Origin), dataset: dataset}

	l := s.stripe(id)
	l.Lock()
	defer l.Unlock()
	if err := s.commit(b.entry(), durable); err != nil {
		_ = os.Remove(b.path())
		s.release(top, d, size)
		return BlockInfo{}, fmt.Errorf("storing block %s: %w", id, err)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	s.addLocked(b)
	top.enter(b)
	return b.info(), nil
}

// Get reads a whole block and checks it against its checksum. A block that fails the check is
// removed and the error wraps ErrCorrupt. A read counts as an access for eviction and, in a
// lower tier, towards promotion.
func (s *Store) Get(ctx context.Context, id string) ([]byte, BlockInfo, error) {
	var data []byte
	info, err := s.read(ctx, id, func(b BlockInfo, p string) error {
		var err error
		data, err = readBlock(p, b.Size)
		if err == nil && blockindex.Checksum(data) != b.Checksum {
			err = fmt.Errorf("block %s in %s: crc32c %08x, expected %08x: %w", b.ID, p, blockindex.Checksum(data), b.Checksum, ErrCorrupt)
		}
		return err
	})
	return data, info, err
}

// OpenBlock opens a block for reading, for callers that read parts of it or hand the file to
// the kernel (sendfile, splice). Unlike Get it cannot check the checksum, which covers the
// whole block; blocks are checked when the store starts and whenever they are copied. The
// caller closes the file. The file stays readable if the block is moved or deleted meanwhile.
func (s *Store) OpenBlock(ctx context.Context, id string) (*os.File, BlockInfo, error) {
	var f *os.File
	info, err := s.read(ctx, id, func(_ BlockInfo, p string) error {
		var err error
		f, err = openBlock(p)
		return err
	})
	return f, info, err
}

// OpenVerified opens a whole block to copy it elsewhere (a checkpoint): the reader fails with
// ErrCorrupt at its end, instead of io.EOF, if the bytes do not match the block's checksum, so
// that a corrupt block is never copied as good. A copy is not a read: it counts as no access.
// The caller closes the reader.
func (s *Store) OpenVerified(ctx context.Context, id string) (io.ReadCloser, BlockInfo, error) {
	var f *os.File
	_, info, err := s.find(ctx, id, func(_ BlockInfo, p string) error {
		var err error
		f, err = openBlock(p)
		return err
	})
	if err != nil {
		return nil, BlockInfo{}, err
	}
	return verifiedFile{newVerifyingReader(id, f, info.Size, info.Checksum), f}, info, nil
}

// verifiedFile is a block file read through a verifyingReader.
type verifiedFile struct {
	io.Reader
	f *os.File
}

func (v verifiedFile) Close() error { return v.f.Close() }

// read finds a block and calls fn with its path (see find), and records the access.
func (s *Store) read(ctx context.Context, id string, fn func(b BlockInfo, path string) error) (BlockInfo, error) {
	b, _, err := s.find(ctx, id, fn)
	if err != nil {
		return BlockInfo{}, err
	}
	return s.touch(b), nil
}

// find finds a block and calls fn with its path, looking again if the block was moved away
// between the lookup and fn's open. It returns the block and what it was when fn ran.
func (s *Store) find(ctx context.Context, id string, fn func(b BlockInfo, path string) error) (*block, BlockInfo, error) {
	if err := blockindex.ValidateID(id); err != nil {
		return nil, BlockInfo{}, fmt.Errorf("reading block: %w", err)
	}
	if err := s.enter(); err != nil {
		return nil, BlockInfo{}, err
	}
	defer s.exit()
	for range lookupAttempts {
		if err := ctx.Err(); err != nil {
			return nil, BlockInfo{}, fmt.Errorf("reading block %s: %w", id, err)
		}
		s.mu.Lock()
		b := s.blocks[id]
		if b == nil {
			s.mu.Unlock()
			return nil, BlockInfo{}, fmt.Errorf("reading block %s: %w", id, ErrNotFound)
		}
		info, p := b.info(), b.path()
		s.mu.Unlock()

		err := fn(info, p)
		if errors.Is(err, fs.ErrNotExist) {
			continue
		}
		if errors.Is(err, ErrCorrupt) {
			s.quarantine(b, p, err)
			return nil, BlockInfo{}, err
		}
		if err != nil {
			return nil, BlockInfo{}, fmt.Errorf("reading block %s: %w", id, err)
		}
		return b, info, nil
	}
	return nil, BlockInfo{}, fmt.Errorf("reading block %s: it kept moving between tiers while being opened", id)
}

// touch records a successful read of b and queues it for promotion once it has been read
// PromotionThreshold times (its Dataset's, or the store's) in a lower tier.
func (s *Store) touch(b *block) BlockInfo {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.blocks[b.id] != b {
		// Deleted or dropped while it was read: it has left its tier's ranking and the index,
		// and a flush of its statistics would write it back, an entry with no file.
		return b.info()
	}
	b.accesses++
	b.lastAccess = s.cfg.Now()
	b.tierReads++
	b.tier.touched(b)
	s.unflushed[b.id] = b
	if b.tier.index > 0 && !b.queued && b.tierReads >= s.promotionThreshold(b.dataset) {
		b.queued = true
		s.queue[b.id] = true
		select {
		case s.wake <- struct{}{}:
		default: // Run has been woken already and will see the whole queue.
		}
	}
	return b.info()
}

// quarantine removes a block found corrupt at path p, unless it has moved meanwhile (the copy
// is checked on the way, so the new location holds good bytes).
func (s *Store) quarantine(b *block, p string, cause error) {
	l := s.stripe(b.id)
	l.Lock()
	defer l.Unlock()
	s.mu.Lock()
	if s.blocks[b.id] != b || b.path() != p {
		s.mu.Unlock()
		return
	}
	s.mu.Unlock()
	s.log.Error(cause, "removing corrupt block", "block", b.id, "path", p)
	if err := s.idx.Delete(b.id); err != nil {
		// The entry stays; the next start verifies the file again and removes it then.
		s.log.Error(err, "removing index entry of corrupt block", "block", b.id)
	}
	s.mu.Lock()
	s.forgetLocked(b)
	b.tier.corrupt++
	s.mu.Unlock()
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		s.log.Error(err, "removing corrupt block file", "path", p)
	}
}

// Delete removes a block. It fails with ErrNotFound if there is none.
func (s *Store) Delete(ctx context.Context, id string) error {
	if err := blockindex.ValidateID(id); err != nil {
		return fmt.Errorf("deleting block: %w", err)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("deleting block %s: %w", id, err)
	}
	l := s.stripe(id)
	l.Lock()
	defer l.Unlock()
	s.mu.Lock()
	b := s.blocks[id]
	s.mu.Unlock()
	if b == nil {
		return fmt.Errorf("deleting block %s: %w", id, ErrNotFound)
	}
	// The entry goes first: a crash before the file is removed leaves an orphan file, which
	// the next start removes, rather than a deleted block coming back.
	// Synced, so that a deleted block never comes back after a crash, even under an id that
	// is used again for other bytes.
	if err := s.idx.Delete(id); err != nil {
		return fmt.Errorf("deleting block %s: %w", id, err)
	}
	if err := s.idx.Sync(); err != nil {
		return fmt.Errorf("deleting block %s: %w", id, err)
	}
	s.mu.Lock()
	p := b.path()
	s.forgetLocked(b)
	s.mu.Unlock()
	if err := os.Remove(p); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("deleting block %s: %w", id, err)
	}
	return nil
}

// forgetLocked drops b from the in-memory state and frees its space. mu must be held.
func (s *Store) forgetLocked(b *block) {
	if s.cfg.OnRemove != nil {
		s.cfg.OnRemove(b.info())
	}
	delete(s.blocks, b.id)
	delete(s.unclean, b.id)
	delete(s.unflushed, b.id)
	delete(s.queue, b.id)
	b.tier.leave(b)
	b.tier.used -= b.size
	b.dir.used -= b.size
}

// Info describes a stored block without counting as an access.
func (s *Store) Info(id string) (BlockInfo, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	b := s.blocks[id]
	if b == nil {
		return BlockInfo{}, fmt.Errorf("block %s: %w", id, ErrNotFound)
	}
	return b.info(), nil
}

// Blocks describes every stored block, ordered by id: what a worker reports to the master
// when it registers.
func (s *Store) Blocks() []BlockInfo { return s.describe(s.blocks) }

// UncleanBlocks describes the blocks that are not clean (no copy exists elsewhere), ordered by
// id: what the checkpointer looks for, without listing every block the node holds.
func (s *Store) UncleanBlocks() []BlockInfo { return s.describe(s.unclean) }

// describe describes the blocks of m, one of the store's maps, ordered by id.
func (s *Store) describe(m map[string]*block) []BlockInfo {
	s.mu.Lock()
	out := make([]BlockInfo, 0, len(m))
	for _, b := range m {
		out = append(out, b.info())
	}
	s.mu.Unlock()
	slices.SortFunc(out, func(a, b BlockInfo) int { return strings.Compare(a.ID, b.ID) })
	return out
}

// Pin marks a block as never to be evicted, or lifts the mark.
func (s *Store) Pin(ctx context.Context, id string, pinned bool) error {
	return s.update(ctx, id, "pinning", func(b *block) { b.pinned = pinned })
}

// SetClean records that a copy of the block now exists elsewhere (it was checkpointed or
// replicated), so it may be dropped without persisting it first.
func (s *Store) SetClean(ctx context.Context, id string) error {
	return s.update(ctx, id, "marking clean", func(b *block) { b.clean = true })
}

// update changes a block's flags: in the index first, then in memory, so that a failed
// index write changes nothing.
func (s *Store) update(ctx context.Context, id, what string, change func(b *block)) error {
	if err := blockindex.ValidateID(id); err != nil {
		return fmt.Errorf("%s block: %w", what, err)
	}
	if err := s.enter(); err != nil {
		return err
	}
	defer s.exit()
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("%s block %s: %w", what, id, err)
	}
	l := s.stripe(id)
	l.Lock()
	defer l.Unlock()
	s.mu.Lock()
	b := s.blocks[id]
	if b == nil {
		s.mu.Unlock()
		return fmt.Errorf("%s block %s: %w", what, id, ErrNotFound)
	}
	shadow := *b
	change(&shadow)
	e := shadow.entry()
	s.mu.Unlock()
	if err := s.commit(e, true); err != nil {
		return fmt.Errorf("%s block %s: %w", what, id, err)
	}
	s.mu.Lock()
	change(b)
	b.tier.setPinned(b, b.pinned)
	s.trackCleanLocked(b)
	s.mu.Unlock()
	return nil
}

// addLocked puts b among the stored blocks, in place of any of its id. mu must be held.
func (s *Store) addLocked(b *block) {
	s.blocks[b.id] = b
	delete(s.unflushed, b.id) // b's statistics are the index's: it was just written or loaded
	s.trackCleanLocked(b)
}

// trackCleanLocked keeps unclean in step with b.clean. mu must be held.
func (s *Store) trackCleanLocked(b *block) {
	if b.clean {
		delete(s.unclean, b.id)
	} else {
		s.unclean[b.id] = b
	}
}

// commit writes a block's index entry, the commit point of its write or move, and makes it
// durable when the block has no copy elsewhere (see blockindex.Index).
func (s *Store) commit(e blockindex.Entry, durable bool) error {
	if err := s.idx.Put(e); err != nil {
		return err
	}
	if durable {
		s.indexSyncs.Add(1)
		return s.idx.Sync()
	}
	return nil
}

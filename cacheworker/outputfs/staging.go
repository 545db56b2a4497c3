package outputfs

import (
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/strata-cache/strata/cacheworker/blockindex"
)

// stagedFile holds the bytes of a file being written: a staging file per block of the file,
// named "<token>-<index>" in the mount's staging folder, so that the seal hands each block's
// file to the tier store (tierstore.Store.Adopt links it in) instead of copying its bytes.
// Block 0's file always exists, so that an empty file is found again after a takeover; a
// block nobody wrote has no file, and a block file shorter than the block ends in zeros up to
// the file's size. The staging files of a file being sealed stay until the seal succeeded:
// they name the same bytes as the blocks stored from them, at no cost, and tell a seal that
// a killed process began which bytes are the file's (see output.storeBlock).
//
// Its methods are called with the node's mu held.
type stagedFile struct {
	dir, token string
	blockSize  int64
	size       int64
	blocks     map[int64]bool     // the blocks that have a file
	open       map[int64]*os.File // some of those files, open: at most maxOpenBlockFiles
	sums       map[int64]*blockSum
}

// blockSum is the CRC-32C of the first length bytes of a block's file, taken as a writer
// writes the file it made, so that the seal hands the checksum to the tier store instead of
// the store reading the block back to take it (tierstore.PutOptions.Checksum; that read was an
// eighth of the worker's CPU in writing a large output). Those bytes were written through
// WriteAt only, each once: parts written past the summed ones wait, summed, until the bytes
// before them are in (threads that write parts of a file at once reach WriteAt in any order,
// as would the kernel's writeback cache), then join the sum (blockindex.CombineChecksums). A
// write over bytes already written, a part past more than maxPendingParts others, or a
// truncation into the bytes drops the sum, and the store reads the block as before. A block
// file made otherwise (by an older version, or found at a takeover) has none.
type blockSum struct {
	crc    uint32
	length int64
	// pending are the parts written past length, by offset in the block.
	pending map[int64]summedPart
}

type summedPart struct {
	crc    uint32
	length int64
}

// maxPendingParts bounds the parts a sum keeps waiting: a writer that scatters its writes over
// a block loses the sum instead.
const maxPendingParts = 64

// add takes p, written at off in the block, into the sum. It reports false when the sum no
// longer holds (p overlaps bytes written before).
func (b *blockSum) add(p []byte, off int64) bool {
	end := off + int64(len(p))
	if off < b.length {
		return false
	}
	for at, part := range b.pending {
		if off < at+part.length && at < end {
			return false
		}
	}
	if off > b.length {
		if len(b.pending) == maxPendingParts {
			return false
		}
		if b.pending == nil {
			b.pending = map[int64]summedPart{}
		}
		b.pending[off] = summedPart{crc: blockindex.Checksum(p), length: int64(len(p))}
		return true
	}
	b.crc = blockindex.UpdateChecksum(b.crc, p)
	b.length = end
	for part, ok := b.pending[b.length]; ok; part, ok = b.pending[b.length] {
		delete(b.pending, b.length)
		b.crc = blockindex.CombineChecksums(b.crc, part.crc, part.length)
		b.length += part.length
	}
	return true
}

// end is where the last byte the sum has seen ends.
func (b *blockSum) end() int64 {
	end := b.length
	for at, part := range b.pending {
		end = max(end, at+part.length)
	}
	return end
}

// whole returns the checksum of the block's first length bytes, if the sum has them all.
func (b *blockSum) whole(length int64) (uint32, bool) {
	if b.length != length || len(b.pending) != 0 {
		return 0, false
	}
	return b.crc, true
}

// maxOpenBlockFiles bounds the descriptors a staged file keeps open, so that a large file of
// small blocks (a TierPool's blocks may be 1 MiB) does not hold one for each of thousands of
// blocks; a writer goes through its blocks in order, and reopening one is cheap.
const maxOpenBlockFiles = 8

func newStagedFile(dir, token string, blockSize int64) *stagedFile {
	return &stagedFile{dir: dir, token: token, blockSize: blockSize, blocks: map[int64]bool{}, open: map[int64]*os.File{}, sums: map[int64]*blockSum{}}
}

// createStaged makes the staging of a new, empty file.
func createStaged(dir, token string, blockSize int64) (*stagedFile, error) {
	s := newStagedFile(dir, token, blockSize)
	f, err := os.OpenFile(s.blockPath(0), os.O_RDWR|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return nil, fmt.Errorf("creating a staging file: %w", err)
	}
	s.blocks[0], s.open[0], s.sums[0] = true, f, &blockSum{}
	return s, nil
}

// stagingNames groups the names in a staging folder by the token they stage.
func stagingNames(entries []fs.DirEntry) map[string][]string {
	byToken := map[string][]string{}
	for _, e := range entries {
		token, _, _ := strings.Cut(e.Name(), "-")
		byToken[token] = append(byToken[token], e.Name())
	}
	return byToken
}

// stagingFolder is a mount's staging folder as a process taking the mount over finds it.
type stagingFolder struct {
	dir       string
	blockSize int64
	names     map[string][]string // by token (stagingNames)
	// stored gives the file of block id if the tier store holds it with length bytes, else "";
	// nil when nothing is stored. An older version's seal freed the staged bytes of each
	// block it stored (see convertWhole).
	stored func(id string, length int64) string
}

// readStagingFolder lists dir for openStaged.
func readStagingFolder(dir string, blockSize int64, stored func(id string, length int64) string) (stagingFolder, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return stagingFolder{}, fmt.Errorf("listing the staging folder: %w", err)
	}
	return stagingFolder{dir: dir, blockSize: blockSize, names: stagingNames(entries), stored: stored}, nil
}

// openStaged opens again the staging of token that an earlier process left in folder. A file
// staged whole by an older version, one staging file named by its token, is cut into block
// files first. It also returns the newest modification time of the files.
func openStaged(folder stagingFolder, token string) (*stagedFile, time.Time, error) {
	s := newStagedFile(folder.dir, token, folder.blockSize)
	names := folder.names[token]
	var mtime time.Time
	fail := func(err error) (*stagedFile, time.Time, error) {
		s.close()
		return nil, time.Time{}, err
	}
	for _, name := range names {
		if name == token {
			return s.convertWhole(names, folder.stored)
		}
	}
	for _, name := range names {
		if !isBlockStagingName(token, name) {
			continue // not one of ours: dropUnknownStaged removes it
		}
		index, _ := strconv.ParseInt(strings.TrimPrefix(name, token+"-"), 10, 64)
		fi, err := os.Stat(filepath.Join(folder.dir, name))
		if err != nil {
			return fail(fmt.Errorf("finding the staging file %s: %w", name, err))
		}
		s.blocks[index] = true
		s.size = max(s.size, index*folder.blockSize+fi.Size())
		if fi.ModTime().After(mtime) {
			mtime = fi.ModTime()
		}
	}
	if !s.blocks[0] {
		return fail(fmt.Errorf("the staging file %s is missing", filepath.Base(s.blockPath(0))))
	}
	return s, mtime, nil
}

// convertWhole cuts a file staged whole (by an older version, as one file named by its token)
// into block files, replacing any that an earlier conversion, killed, left. That version's
// seal freed (punched out) the staged bytes of each block it stored: a block the tier store
// holds is linked in from there instead (stored), so that its file is the stored block, as a
// seal of this version leaves it.
func (s *stagedFile) convertWhole(names []string, stored func(id string, length int64) string) (*stagedFile, time.Time, error) {
	fail := func(err error) (*stagedFile, time.Time, error) {
		s.close()
		return nil, time.Time{}, err
	}
	for _, name := range names {
		if name != s.token {
			if err := os.Remove(filepath.Join(s.dir, name)); err != nil {
				return fail(fmt.Errorf("removing %s to convert the staging of %s again: %w", name, s.token, err))
			}
		}
	}
	whole, err := os.Open(filepath.Join(s.dir, s.token))
	if err != nil {
		return fail(fmt.Errorf("opening the staging file %s: %w", s.token, err))
	}
	defer func() { _ = whole.Close() }() // read only
	fi, err := whole.Stat()
	if err != nil {
		return fail(fmt.Errorf("opening the staging file %s: %w", s.token, err))
	}
	for off := int64(0); off < fi.Size(); off += s.blockSize {
		index, length := off/s.blockSize, min(s.blockSize, fi.Size()-off)
		if err := s.convertBlock(whole, index, length, stored); err != nil {
			return fail(fmt.Errorf("converting the staging file %s: %w", s.token, err))
		}
	}
	if _, err := s.file(0, true); err != nil { // an empty file's
		return fail(err)
	}
	s.size = fi.Size()
	if err := os.Remove(whole.Name()); err != nil {
		return fail(fmt.Errorf("removing the converted staging file %s: %w", s.token, err))
	}
	return s, fi.ModTime(), nil
}

// convertBlock makes the file of block index, length bytes, from whole or from the block
// the tier store holds.
func (s *stagedFile) convertBlock(whole *os.File, index, length int64, stored func(id string, length int64) string) error {
	if stored != nil {
		if p := stored(blockindex.OutputBlockID(s.token, index), length); p != "" {
			if err := os.Link(p, s.blockPath(index)); err == nil {
				s.blocks[index] = true
				return nil
			}
			// Moved or dropped meanwhile: what the whole file has is all there is.
		}
	}
	f, err := s.file(index, true)
	if err != nil {
		return err
	}
	_, err = io.Copy(f, io.NewSectionReader(whole, index*s.blockSize, length))
	return err
}

// isBlockStagingName says whether name is the staging file of a block of token.
func isBlockStagingName(token, name string) bool {
	index, err := strconv.ParseInt(strings.TrimPrefix(name, token+"-"), 10, 64)
	return strings.HasPrefix(name, token+"-") && err == nil && index >= 0
}

func (s *stagedFile) blockPath(index int64) string {
	return filepath.Join(s.dir, s.token+"-"+strconv.FormatInt(index, 10))
}

// file returns block index's file, open; one made empty if it has none and create is set, else
// nil.
func (s *stagedFile) file(index int64, create bool) (*os.File, error) {
	if f := s.open[index]; f != nil {
		return f, nil
	}
	if !create && !s.blocks[index] {
		return nil, nil
	}
	flags := os.O_RDWR
	if create {
		flags |= os.O_CREATE
	}
	f, err := os.OpenFile(s.blockPath(index), flags, 0o600)
	if err != nil {
		return nil, fmt.Errorf("opening the staging file of block %d: %w", index, err)
	}
	for other, g := range s.open {
		if len(s.open) < maxOpenBlockFiles {
			break
		}
		_ = g.Close()
		delete(s.open, other)
	}
	s.blocks[index], s.open[index] = true, f
	return f, nil
}

// WriteAt writes p at off, across as many block files as it spans.
func (s *stagedFile) WriteAt(p []byte, off int64) (int, error) {
	done := 0
	for done < len(p) {
		pos := off + int64(done)
		index := pos / s.blockSize
		k := int(min(int64(len(p)-done), (index+1)*s.blockSize-pos))
		made := !s.blocks[index]
		f, err := s.file(index, true)
		if err != nil {
			return done, err
		}
		if made {
			s.sums[index] = &blockSum{}
		}
		at := pos - index*s.blockSize
		w, err := f.WriteAt(p[done:done+k], at)
		if sum := s.sums[index]; sum != nil && (w < k || !sum.add(p[done:done+w], at)) {
			delete(s.sums, index) // a failed write may have written part: nobody knows what
		}
		done += w
		s.size = max(s.size, off+int64(done))
		if err != nil {
			return done, err
		}
	}
	return done, nil
}

// ReadAt reads into p from off, up to the file's size: io.EOF when it ends before p is full.
func (s *stagedFile) ReadAt(p []byte, off int64) (int, error) {
	if off >= s.size {
		return 0, io.EOF
	}
	end := min(off+int64(len(p)), s.size)
	for pos := off; pos < end; {
		index := pos / s.blockSize
		k := min(end, (index+1)*s.blockSize) - pos
		dest := p[pos-off : pos-off+k]
		got := 0
		f, err := s.file(index, false)
		if err != nil {
			return int(pos - off), err
		}
		if f != nil {
			got, err = f.ReadAt(dest, pos-index*s.blockSize)
			if err != nil && !errors.Is(err, io.EOF) {
				return int(pos - off), err
			}
		}
		clear(dest[got:]) // past the block file's end, or no file: never written
		pos += k
	}
	if n := int(end - off); n < len(p) {
		return n, io.EOF
	}
	return len(p), nil
}

// Truncate sets the file's size: block files past it go, the last one is cut or extended.
func (s *stagedFile) Truncate(size int64) error {
	last := max(size-1, 0) / s.blockSize
	for index := range s.blocks {
		if index > last {
			if err := s.removeBlock(index); err != nil {
				return fmt.Errorf("truncating a staged file: %w", err)
			}
		}
	}
	// The last block's file always has the file's end, so that a takeover finds the size.
	f, err := s.file(last, true)
	if err != nil {
		return err
	}
	if sum := s.sums[last]; sum != nil && sum.end() > size-last*s.blockSize {
		delete(s.sums, last)
	}
	if err := f.Truncate(size - last*s.blockSize); err != nil {
		return fmt.Errorf("truncating a staged file: %w", err)
	}
	s.size = size
	return nil
}

// Size is the file's size.
func (s *stagedFile) Size() int64 { return s.size }

// blockFile gives the path of block index's file with exactly length bytes, for the seal: a
// block nobody wrote gets a file of zeros (a hole), a short one is extended with zeros.
func (s *stagedFile) blockFile(index, length int64) (string, error) {
	f, err := s.file(index, true)
	if err != nil {
		return "", err
	}
	fi, err := f.Stat()
	if err != nil {
		return "", fmt.Errorf("sizing the staging file of block %d: %w", index, err)
	}
	if fi.Size() != length {
		if err := f.Truncate(length); err != nil {
			return "", fmt.Errorf("sizing the staging file of block %d: %w", index, err)
		}
	}
	return f.Name(), nil
}

// checksum is the CRC-32C of block index's file, whose length bytes were all written in order
// through WriteAt; ok is false when no sum covers exactly those bytes.
func (s *stagedFile) checksum(index, length int64) (crc uint32, ok bool) {
	sum := s.sums[index]
	if sum == nil {
		return 0, false
	}
	return sum.whole(length)
}

// restore gives block index's staged bytes a file of their own, a copy, in place of the one
// the tier store may share (see undoSeal).
func (s *stagedFile) restore(index int64) error {
	old, err := s.file(index, false)
	if err != nil || old == nil {
		return err // never written: nothing shared
	}
	tmp := s.blockPath(index) + ".restore"
	f, err := os.OpenFile(tmp, os.O_RDWR|os.O_CREATE|os.O_TRUNC, 0o600)
	if err == nil {
		_, err = io.Copy(f, io.NewSectionReader(old, 0, s.blockSize))
		if err == nil {
			err = os.Rename(tmp, s.blockPath(index))
		}
		if err != nil {
			_ = f.Close()
			_ = os.Remove(tmp)
		}
	}
	if err != nil {
		return fmt.Errorf("copying the staged bytes of block %d: %w", index, err)
	}
	_ = old.Close()
	s.open[index] = f
	return nil
}

// removeBlock closes and removes block index's file.
func (s *stagedFile) removeBlock(index int64) error {
	if f := s.open[index]; f != nil {
		_ = f.Close()
		delete(s.open, index)
	}
	delete(s.blocks, index)
	delete(s.sums, index)
	if err := os.Remove(s.blockPath(index)); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return err
	}
	return nil
}

// close closes the block files; they stay for the process taking over.
func (s *stagedFile) close() {
	for index, f := range s.open {
		_ = f.Close()
		delete(s.open, index)
	}
}

// remove closes and removes the block files.
func (s *stagedFile) remove() error {
	var errs []error
	for index := range s.blocks {
		if err := s.removeBlock(index); err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

package fuseconn

import (
	"errors"
	"fmt"
	"os"
	"sync"
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
	"golang.org/x/sys/unix"
)

// A READ whose answer lies in one local file (a block held in a tier) is answered by splicing
// it from that file into /dev/fuse through a pipe: the kernel puts references to the file's
// pages into the pipe and copies them once, into the pages of the request. Answered the
// ordinary way, the bytes are copied twice (pread into a reply buffer, write of the buffer)
// and pass through this process's memory, which on a host whose cores the reader shares with
// the server is most of what a read costs once its block is local.

// FileRange is where the answer to a READ lies: Len bytes of File from Off.
type FileRange struct {
	File *os.File
	Off  int64
	Len  int
}

// RangeReader is implemented by a file system whose reads can be answered from files. Mount
// and Adopt splice the READs it answers.
type RangeReader interface {
	// ReadRanges says where the answer to in lies, in order (a read across blocks lies in
	// several files), without waiting for anything slow (a fetch): ok false leaves the request
	// to the file system's Read. done is called once, with whether the answer was sent; until
	// then the files stay open. An answer not sent is read again through Read, which reports
	// what was wrong with it.
	ReadRanges(in *fuse.ReadIn) (ranges []FileRange, done func(sent bool), ok bool)
}

// BlockRanges cuts a read of [off, end) of a file kept in blocks of blockSize bytes into the
// ranges of the blocks' files, which file gives by block index; ok is false as soon as it has
// none for a block (the read is then not spliced).
func BlockRanges(off, end, blockSize int64, file func(index int64) (*os.File, bool)) (ranges []FileRange, ok bool) {
	for pos := off; pos < end; {
		index := pos / blockSize
		f, ok := file(index)
		if !ok {
			return nil, false
		}
		k := min(end, (index+1)*blockSize) - pos
		ranges = append(ranges, FileRange{File: f, Off: pos - index*blockSize, Len: int(k)})
		pos += k
	}
	return ranges, true
}

// Copying hides that fsys answers reads from files (RangeReader), so that a connection
// serving it answers every READ through its Read, copying (benchmarks compare the two).
func Copying(fsys fuse.RawFileSystem) fuse.RawFileSystem { return struct{ fuse.RawFileSystem }{fsys} }

const (
	opRead = 15 // FUSE_READ
	// pipeSize is the pipes' size: fs.pipe-max-size by default, the most a process without
	// CAP_SYS_RESOURCE may ask for. A pipe holds a page per slot, whatever a slot's length:
	// the header takes one, each page of a file one more, so a MaxReadRequest answer of
	// page-aligned ranges fits (see fits).
	pipeSize = MaxRead
	pageSize = 4096
	// idlePipes bounds the pipes kept for the next READs (two descriptors each).
	idlePipes = 16
)

// fits says whether an answer of ranges fits a pipe with its header: each range takes a slot
// per page it touches.
func fits(ranges []FileRange) bool {
	slots := 1
	for _, r := range ranges {
		first := r.Off / pageSize
		last := (r.Off + int64(r.Len) - 1) / pageSize
		slots += int(last - first + 1)
	}
	return slots <= pipeSize/pageSize
}

var errShortRange = errors.New("the file ended before the range")

// splicer answers READs from file ranges. Its pipes are kept between requests; a pipe left
// holding bytes by a failure is closed rather than reused.
type splicer struct {
	ranges RangeReader
	dev    syscall.RawConn // /dev/fuse, written without leaving Go's poller (Fd would)

	mu   sync.Mutex
	idle []*pipe
}

type pipe struct{ r, w int }

func (p *pipe) close() {
	_ = unix.Close(p.r)
	_ = unix.Close(p.w)
}

// newSplicer returns a splicer for fsys if it answers reads from files and this host makes
// pipes large enough, and nil otherwise (reads are then answered the ordinary way).
func newSplicer(dev *os.File, fsys fuse.RawFileSystem) (*splicer, error) {
	ranges, ok := fsys.(RangeReader)
	if !ok {
		return nil, nil
	}
	raw, err := dev.SyscallConn()
	if err != nil {
		return nil, fmt.Errorf("splicing reads: %w", err)
	}
	s := &splicer{ranges: ranges, dev: raw}
	p, err := s.newPipe()
	if err != nil {
		return nil, err
	}
	s.put(p)
	return s, nil
}

func (s *splicer) newPipe() (*pipe, error) {
	var fds [2]int
	if err := unix.Pipe2(fds[:], unix.O_CLOEXEC|unix.O_NONBLOCK); err != nil {
		return nil, fmt.Errorf("making a pipe to splice reads: %w", err)
	}
	p := &pipe{r: fds[0], w: fds[1]}
	if _, err := unix.FcntlInt(uintptr(p.w), unix.F_SETPIPE_SZ, pipeSize); err != nil {
		p.close()
		return nil, fmt.Errorf("making a pipe of %d bytes to splice reads (fs.pipe-max-size is smaller): %w", pipeSize, err)
	}
	return p, nil
}

func (s *splicer) get() (*pipe, error) {
	s.mu.Lock()
	if n := len(s.idle); n > 0 {
		p := s.idle[n-1]
		s.idle = s.idle[:n-1]
		s.mu.Unlock()
		return p, nil
	}
	s.mu.Unlock()
	return s.newPipe()
}

func (s *splicer) put(p *pipe) {
	s.mu.Lock()
	if len(s.idle) < idlePipes {
		s.idle = append(s.idle, p)
		p = nil
	}
	s.mu.Unlock()
	if p != nil {
		p.close()
	}
}

// close closes the idle pipes; requests still being answered close theirs.
func (s *splicer) close() {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, p := range s.idle {
		p.close()
	}
	s.idle = nil
}

// answer answers req, a READ, by splicing if its file system says where the answer lies, and
// reports whether it did: false leaves the request to be answered the ordinary way (if the
// kernel took the spliced answer after all, or no longer waits, that answer finds no request
// and is dropped); true, even with an error, means the request must not be answered again.
func (s *splicer) answer(req []byte) (answered bool, err error) {
	if len(req) < int(unsafe.Sizeof(fuse.ReadIn{})) {
		return false, nil
	}
	in := (*fuse.ReadIn)(unsafe.Pointer(&req[0]))
	if in.Opcode != opRead || in.Size > MaxRead {
		return false, nil
	}
	ranges, done, ok := s.ranges.ReadRanges(in)
	if !ok {
		return false, nil
	}
	defer func() { done(answered) }()
	length := 0
	for _, r := range ranges {
		length += r.Len
	}
	if !fits(ranges) {
		return false, nil // a request of a mount made with a larger max_read, or unaligned
	}
	p, err := s.get()
	if err != nil {
		return false, err
	}
	if err := fill(p, in.Unique, length, ranges); err != nil {
		p.close() // it may hold part of the answer
		if errors.Is(err, errShortRange) {
			return false, nil // the ordinary read says what is wrong with the file
		}
		return false, err
	}
	total := int(unsafe.Sizeof(fuse.OutHeader{})) + length
	var sent int64
	var serr error
	if err := s.dev.Write(func(fd uintptr) bool {
		sent, serr = unix.Splice(p.r, nil, int(fd), nil, total, unix.SPLICE_F_MOVE)
		return true
	}); err != nil {
		serr = err
	}
	switch {
	case serr == nil && sent == int64(total):
	case errors.Is(serr, syscall.ENOENT):
		// The request was interrupted and the kernel no longer waits for it.
		p.close()
		return true, nil
	default:
		p.close()
		return false, fmt.Errorf("splicing %d bytes of a READ answer into /dev/fuse (sent %d): %w", total, sent, serr)
	}
	s.put(p)
	return true, nil
}

// fill puts the answer's header and the bytes of ranges, length in all, into p.
func fill(p *pipe, unique uint64, length int, ranges []FileRange) error {
	h := fuse.OutHeader{Length: uint32(unsafe.Sizeof(fuse.OutHeader{})) + uint32(length), Unique: unique}
	hb := unsafe.Slice((*byte)(unsafe.Pointer(&h)), unsafe.Sizeof(h))
	if n, err := unix.Write(p.w, hb); err != nil || n != len(hb) {
		return fmt.Errorf("writing a READ answer's header into a pipe: %d bytes, %w", n, err)
	}
	for _, r := range ranges {
		if err := fillRange(p, r); err != nil {
			return err
		}
	}
	return nil
}

// fillRange moves r's bytes into p.
func fillRange(p *pipe, r FileRange) error {
	raw, err := r.File.SyscallConn()
	if err != nil {
		return err
	}
	off := r.Off
	for moved := 0; moved < r.Len; {
		var n int64
		var serr error
		if err := raw.Read(func(fd uintptr) bool {
			n, serr = unix.Splice(int(fd), &off, p.w, nil, r.Len-moved, unix.SPLICE_F_MOVE|unix.SPLICE_F_NONBLOCK)
			return true
		}); err != nil {
			return err
		}
		switch {
		case serr != nil:
			return fmt.Errorf("splicing %d bytes of %s at %d into a pipe: %w", r.Len-moved, r.File.Name(), off, serr)
		case n == 0:
			return errShortRange
		}
		moved += int(n)
	}
	return nil
}

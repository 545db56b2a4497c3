package outputfs

import (
	"context"
	"os"

	"github.com/hanwen/go-fuse/v2/fuse"

	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/cacheworker/fuseconn"
)

// ReadRanges implements fuseconn.RangeReader: a read of a sealed file whose blocks a local tier
// holds is spliced from the blocks' files into the FUSE device (one copy, none through the
// worker). Anything else (a file being written, a block another worker holds or a checkpoint
// must give back) goes to Read.
func (fsys *fileSystem) ReadRanges(in *fuse.ReadIn) ([]fuseconn.FileRange, func(sent bool), bool) {
	n := fsys.t.get(in.NodeId)
	if n == nil || n.dir {
		return nil, nil, false
	}
	n.mu.Lock()
	sealed, token, size := n.state.Sealed, n.state.Token, n.size
	n.mu.Unlock()
	off := int64(in.Offset)
	end := min(off+int64(in.Size), size)
	if !sealed || off >= end {
		return nil, nil, false
	}
	h := fsys.handle(in.Fh)
	var held []*splicedBlock
	release := func() {
		for _, b := range held {
			h.putSpliced(b)
		}
	}
	ranges, ok := fuseconn.BlockRanges(off, end, fsys.o.cfg.BlockSize, func(index int64) (*os.File, bool) {
		b := h.getSpliced(fsys.o, token, index)
		if b == nil {
			return nil, false
		}
		held = append(held, b)
		return b.file, true
	})
	if !ok {
		release()
		return nil, nil, false
	}
	done := func(sent bool) {
		release()
		if sent {
			fsys.o.cfg.Metrics.splicedReads.Inc()
		}
	}
	return ranges, done, true
}

// splicedBlock is the file of a local block that spliced reads of a handle use, open while
// the handle keeps it (the block it read last) or a splice is under way.
type splicedBlock struct {
	token string
	index int64
	file  *os.File
	refs  int // guarded by the handle's mu
}

// getSpliced returns the local file of block index of version token, held for one splice, or
// nil when no local tier holds it. A handle keeps the block it read last, so that a reader
// going through a block opens it (and counts an access to it) once.
func (h *handle) getSpliced(o *output, token string, index int64) *splicedBlock {
	h.mu.Lock()
	defer h.mu.Unlock()
	if b := h.spliced; b != nil && b.token == token && b.index == index {
		b.refs++
		return b
	}
	f, _, err := o.cfg.Store.OpenBlock(context.Background(), blockindex.OutputBlockID(token, index))
	if err != nil {
		return nil
	}
	if h.spliced != nil {
		h.dropSplicedLocked(h.spliced)
	}
	h.spliced = &splicedBlock{token: token, index: index, file: f, refs: 2} // the handle's, and this splice's
	return h.spliced
}

// putSpliced lets go of a block a splice held.
func (h *handle) putSpliced(b *splicedBlock) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.dropSplicedLocked(b)
}

func (h *handle) dropSplicedLocked(b *splicedBlock) {
	if b.refs--; b.refs == 0 {
		_ = b.file.Close()
	}
}

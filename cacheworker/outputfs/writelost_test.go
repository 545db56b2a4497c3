package outputfs

import (
	"context"
	"os"
	"syscall"
	"testing"

	"github.com/hanwen/go-fuse/v2/fuse"
	. "github.com/onsi/gomega"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/master/masterpb"
)

// TestAFileAWriteIntoWhichFailedIsNeverSealed fails a write into a staged file (its next block
// file cannot be made) and checks that the file is not sealed so, neither at its close nor at
// its release, however it is written afterwards, until it is truncated and written anew: a
// writer that ignored the error, or whose other thread wrote on, would otherwise publish a file
// with a hole.
func TestAFileAWriteIntoWhichFailedIsNeverSealed(t *testing.T) {
	g := NewWithT(t)
	fsys := unmountedFileSystem(t)
	staging := fsys.o.cfg.StagingDir
	unique := uint64(100)
	header := func(node uint64) fuse.InHeader { unique++; return fuse.InHeader{Unique: unique, NodeId: node} }
	published := func() bool {
		_, err := fsys.o.cfg.Master.GetFile(context.Background(), &masterpb.GetFileRequest{Path: fsys.o.masterPath("a")})
		if status.Code(err) == codes.NotFound {
			return false
		}
		g.Expect(err).NotTo(HaveOccurred())
		return true
	}

	var c fuse.CreateOut
	g.Expect(fsys.Create(nil, &fuse.CreateIn{InHeader: header(rootID), Mode: 0o644}, "a", &c)).To(Equal(fuse.OK))
	write := func(off int, data []byte) fuse.Status {
		_, st := fsys.Write(nil, &fuse.WriteIn{InHeader: header(c.NodeId), Fh: c.Fh, Offset: uint64(off)}, data)
		return st
	}
	block := int(fsys.o.cfg.BlockSize)
	g.Expect(write(0, make([]byte, block))).To(Equal(fuse.OK))

	// The staging folder away, the second block's file cannot be made.
	g.Expect(os.Rename(staging, staging+".away")).To(Succeed())
	g.Expect(write(block, make([]byte, block))).To(Equal(fuse.Status(syscall.ENOENT)))
	g.Expect(os.Rename(staging+".away", staging)).To(Succeed())
	g.Expect(write(2*block, make([]byte, 10))).To(Equal(fuse.OK), "a later write succeeds")

	g.Expect(fsys.Flush(nil, &fuse.FlushIn{InHeader: header(c.NodeId), Fh: c.Fh})).To(Equal(fuse.EIO),
		"its close is told it was not sealed")
	g.Expect(published()).To(BeFalse())
	n := fsys.t.get(c.NodeId)
	g.Expect(n.state.WriteLost).To(BeTrue())

	// A takeover knows of the lost write.
	own, records, err := readJournal(fsys.t.j.file, fsys.o.log)
	g.Expect(err).NotTo(HaveOccurred())
	next := newFileSystem(fsys.o)
	next.t, err = replay(own, records, staging, fsys.o.cfg.BlockSize, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(next.t.get(c.NodeId).state.WriteLost).To(BeTrue(), "recorded in the journal")
	fsys = next

	g.Expect(write(block, make([]byte, block))).To(Equal(fuse.OK), "writing the missing block again")
	fsys.Release(nil, &fuse.ReleaseIn{InHeader: header(c.NodeId), Fh: c.Fh})
	g.Expect(published()).To(BeFalse(), "neither is it sealed at its release: nobody knows every byte is back")

	// Truncated and written anew, it seals.
	var o fuse.OpenOut
	g.Expect(fsys.Open(nil, &fuse.OpenIn{InHeader: header(c.NodeId), Flags: syscall.O_WRONLY | syscall.O_TRUNC}, &o)).To(Equal(fuse.OK))
	c.Fh = o.Fh
	g.Expect(write(0, []byte("whole"))).To(Equal(fuse.OK))
	g.Expect(fsys.Flush(nil, &fuse.FlushIn{InHeader: header(c.NodeId), Fh: c.Fh})).To(Equal(fuse.OK))
	g.Expect(published()).To(BeTrue())
}

// TestATruncationToNothingClearsALostWriteOfAnEmptyFile checks that ftruncate(0) of a file a
// write into which failed while it was still empty (its first write found the tier full: the
// state is set here as that failure leaves it), which changes no size, lets it be written anew
// and sealed, as an O_TRUNC open does.
func TestATruncationToNothingClearsALostWriteOfAnEmptyFile(t *testing.T) {
	g := NewWithT(t)
	fsys := unmountedFileSystem(t)
	unique := uint64(100)
	header := func(node uint64) fuse.InHeader { unique++; return fuse.InHeader{Unique: unique, NodeId: node} }

	var c fuse.CreateOut
	g.Expect(fsys.Create(nil, &fuse.CreateIn{InHeader: header(rootID), Mode: 0o644}, "a", &c)).To(Equal(fuse.OK))
	n := fsys.t.get(c.NodeId)
	n.mu.Lock()
	n.state.WriteLost = true
	n.mu.Unlock()
	g.Expect(fsys.Flush(nil, &fuse.FlushIn{InHeader: header(c.NodeId), Fh: c.Fh})).To(Equal(fuse.EIO))

	truncate := &fuse.SetAttrIn{SetAttrInCommon: fuse.SetAttrInCommon{InHeader: header(c.NodeId), Valid: fuse.FATTR_SIZE, Size: 0}}
	var attr fuse.AttrOut
	g.Expect(fsys.SetAttr(nil, truncate, &attr)).To(Equal(fuse.OK))
	g.Expect(n.state.WriteLost).To(BeFalse())
	_, st := fsys.Write(nil, &fuse.WriteIn{InHeader: header(c.NodeId), Fh: c.Fh}, []byte("whole"))
	g.Expect(st).To(Equal(fuse.OK))
	g.Expect(fsys.Flush(nil, &fuse.FlushIn{InHeader: header(c.NodeId), Fh: c.Fh})).To(Equal(fuse.OK))
	f, err := fsys.o.cfg.Master.GetFile(context.Background(), &masterpb.GetFileRequest{Path: fsys.o.masterPath("a")})
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(f.GetSize()).To(BeEquivalentTo(5))
}

package outputfs

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	"github.com/go-logr/logr/testr"
	"github.com/hanwen/go-fuse/v2/fuse"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/blockindex"
	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/fuseconn"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// TestAResentRequestIsNotCarriedOutTwice drives the file system as the kernel would, without
// a mount: a process records changes, "dies", and the next one replays its journal and gets the
// requests the kernel sends again (flagged as resends). Those the journal has are answered
// without making their change twice; requests it lacks, and new ones of the same name, are
// carried out as usual.
func TestAResentRequestIsNotCarriedOutTwice(t *testing.T) {
	g := NewWithT(t)
	first := unmountedFileSystem(t)
	o, staging := first.o, first.o.cfg.StagingDir
	header := func(unique, node uint64) fuse.InHeader { return fuse.InHeader{Unique: unique, NodeId: node} }
	resent := func(unique, node uint64) fuse.InHeader { return header(unique|fuseconn.ResendFlag, node) }

	var created fuse.CreateOut
	g.Expect(first.Create(nil, &fuse.CreateIn{InHeader: header(10, rootID), Mode: 0o644}, "a", &created)).To(Equal(fuse.OK))
	var opened fuse.OpenOut
	g.Expect(first.Open(nil, &fuse.OpenIn{InHeader: header(11, created.NodeId), Flags: 1 /* O_WRONLY */}, &opened)).To(Equal(fuse.OK))
	var dir fuse.EntryOut
	g.Expect(first.Mkdir(nil, &fuse.MkdirIn{InHeader: header(12, rootID), Mode: 0o755}, "d", &dir)).To(Equal(fuse.OK))
	g.Expect(first.Rename(nil, &fuse.RenameIn{InHeader: header(13, rootID), Newdir: dir.NodeId}, "a", "b")).To(Equal(fuse.OK))
	a := first.t.get(created.NodeId)
	g.Expect(a.state.Writers).To(Equal(2), "the create and the open")

	takeOver := func() *fileSystem {
		t.Helper()
		own, records, err := readJournal(first.t.j.file, logr.Discard())
		g.Expect(err).NotTo(HaveOccurred())
		next := newFileSystem(o)
		next.t, err = replay(own, records, staging, o.cfg.BlockSize, nil)
		g.Expect(err).NotTo(HaveOccurred())
		return next
	}
	next := takeOver()
	writers := func() int {
		n := next.t.get(created.NodeId)
		n.mu.Lock()
		defer n.mu.Unlock()
		return n.state.Writers
	}
	g.Expect(writers()).To(Equal(2))
	g.Expect(next.t.rel(next.t.get(created.NodeId))).To(Equal("d/b"), "the rename is replayed")

	var again fuse.CreateOut
	g.Expect(next.Create(nil, &fuse.CreateIn{InHeader: resent(10, rootID), Mode: 0o644}, "a", &again)).To(Equal(fuse.OK),
		"a resent create is answered, though its name has moved on")
	g.Expect(again.NodeId).To(Equal(created.NodeId), "with the node it made")
	g.Expect(again.Fh & fhWritable).NotTo(BeZero())
	g.Expect(next.Open(nil, &fuse.OpenIn{InHeader: resent(11, created.NodeId), Flags: 1}, &opened)).To(Equal(fuse.OK))
	g.Expect(writers()).To(Equal(2), "a resent open is not counted twice")
	g.Expect(next.Mkdir(nil, &fuse.MkdirIn{InHeader: resent(12, rootID), Mode: 0o755}, "d", &dir)).To(Equal(fuse.OK))
	g.Expect(next.Rename(nil, &fuse.RenameIn{InHeader: resent(13, rootID), Newdir: dir.NodeId}, "a", "b")).To(Equal(fuse.OK),
		"a resent rename succeeds though its source is gone")

	g.Expect(next.Mkdir(nil, &fuse.MkdirIn{InHeader: header(12, rootID), Mode: 0o755}, "d", &dir)).To(Equal(fuse.Status(17)),
		"the same id without the resend flag is a new request: EEXIST")
	g.Expect(next.Rename(nil, &fuse.RenameIn{InHeader: resent(99, rootID), Newdir: dir.NodeId}, "a", "c")).To(Equal(fuse.ENOENT),
		"a resent request the journal lacks is carried out")

	next.Release(nil, &fuse.ReleaseIn{InHeader: header(14, created.NodeId), Fh: opened.Fh | fhWritable})
	g.Expect(writers()).To(Equal(1))
	first = next
	next = takeOver()
	next.Release(nil, &fuse.ReleaseIn{InHeader: resent(14, created.NodeId), Fh: opened.Fh | fhWritable})
	g.Expect(writers()).To(Equal(1), "a resent release is not counted twice")
}

// TestAJournalDropsATornRecord checks what a process killed while appending leaves: the whole
// records are read, the torn one is cut off, and appends go on after the last whole record.
func TestAJournalDropsATornRecord(t *testing.T) {
	for name, torn := range map[string][]byte{
		"nothing torn":      nil,
		"a torn length":     {9, 0},
		"a torn record":     {200, 0, 0, 0, '{', '"'},
		"a length, no data": {20, 0, 0, 0},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			j, err := newJournal(logr.Discard())
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(j.append(record{Kind: recMount, Mount: &mountRecord{Dir: "/mnt"}})).To(Succeed())
			g.Expect(j.append(record{Kind: recAdd, ID: rootID, Dir: true, State: &nodeState{Mode: rootMode}})).To(Succeed())
			whole := j.end
			_, err = j.file.WriteAt(torn, whole)
			g.Expect(err).NotTo(HaveOccurred())

			own, records, err := readJournal(j.file, logr.Discard())
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(records).To(HaveLen(2))
			g.Expect(own.end).To(Equal(whole))
			g.Expect(own.append(record{Kind: recStart})).To(Succeed())
			_, records, err = readJournal(j.file, logr.Discard())
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(records).To(HaveLen(3), "an append after a torn record is read")
		})
	}
	_, _, err := readJournal(mustJournal(t), logr.Discard())
	NewWithT(t).Expect(err).To(MatchError(ContainSubstring("does not start with the mount")))
}

func mustJournal(t *testing.T) *os.File {
	j, err := newJournal(logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return j.file
}

// TestACompactedJournalReplaysTheSameTree makes a journal compact itself many times over while
// files are made, moved and removed, and checks that a takeover from the compacted journal
// rebuilds the very tree, that whoever holds the handover is given each new journal, that the
// journal stays small, and that a holder refusing a new journal keeps the old one in use.
func TestACompactedJournalReplaysTheSameTree(t *testing.T) {
	g := NewWithT(t)
	defer func(size int64) { compactMinSize = size }(compactMinSize)
	compactMinSize = 4 << 10
	fsys := unmountedFileSystem(t)
	j, staging := fsys.t.j, fsys.o.cfg.StagingDir
	j.compactions = fsys.o.cfg.Metrics.compactions
	var held []*os.File
	refuse := false
	j.onNew = func(f *os.File) error {
		if refuse {
			return errors.New("the store is away")
		}
		held = append(held, f)
		return nil
	}

	unique := uint64(0)
	header := func(node uint64) fuse.InHeader { unique++; return fuse.InHeader{Unique: unique, NodeId: node} }
	var dir fuse.EntryOut
	g.Expect(fsys.Mkdir(nil, &fuse.MkdirIn{InHeader: header(rootID), Mode: 0o750}, "d", &dir)).To(Equal(fuse.OK))
	for i := range 300 {
		name := fmt.Sprintf("f%03d", i)
		var c fuse.CreateOut
		g.Expect(fsys.Create(nil, &fuse.CreateIn{InHeader: header(rootID), Mode: 0o640}, name, &c)).To(Equal(fuse.OK))
		switch i % 3 {
		case 0: // moved into the folder made first, an older node under a newer one's parent
			g.Expect(fsys.Rename(nil, &fuse.RenameIn{InHeader: header(rootID), Newdir: dir.NodeId}, name, name)).To(Equal(fuse.OK))
		case 1: // removed while open: it stays, detached, for its writer
			g.Expect(fsys.Unlink(nil, ptrTo(header(rootID)), name)).To(Equal(fuse.OK))
		}
	}
	g.Expect(held).NotTo(BeEmpty(), "the journal was compacted, and each new one handed on")
	g.Expect(testutil.ToFloat64(fsys.o.cfg.Metrics.compactions)).To(BeEquivalentTo(len(held)), "and counted")
	g.Expect(j.end).To(BeNumerically("<", 200<<10), "the journal stays about the size of the tree")

	own, records, err := readJournal(held[len(held)-1], logr.Discard())
	g.Expect(err).NotTo(HaveOccurred())
	next, err := replay(own, records, staging, fsys.o.cfg.BlockSize, nil)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(own.starts).To(Equal(j.starts))
	g.Expect(next.nodes).To(HaveLen(len(fsys.t.nodes)))
	for id, n := range fsys.t.nodes {
		m := next.nodes[id]
		g.Expect(m).NotTo(BeNil())
		g.Expect([]any{m.parent, m.name, m.dir, m.state.Mode, m.state.Writers, m.state.Unlinked, m.state.Token}).To(
			Equal([]any{n.parent, n.name, n.dir, n.state.Mode, n.state.Writers, n.state.Unlinked, n.state.Token}), "node %d", id)
		g.Expect(fsys.t.rel(n)).To(Equal(next.rel(m)))
	}

	refuse = true
	before := j.file
	for i := range 100 {
		var c fuse.CreateOut
		g.Expect(fsys.Create(nil, &fuse.CreateIn{InHeader: header(rootID), Mode: 0o640}, fmt.Sprintf("g%03d", i), &c)).To(Equal(fuse.OK))
	}
	g.Expect(j.file).To(BeIdenticalTo(before), "a journal the holder refused is not used")
}

func ptrTo[T any](v T) *T { return &v }

// unmountedFileSystem is an output file system that no kernel talks to, over a real master
// and a real tier store: tests call its request handlers as the kernel would.
func unmountedFileSystem(t *testing.T) *fileSystem {
	t.Helper()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	if _, err := master.RegisterWorker(context.Background(), &masterpb.RegisterWorkerRequest{Id: "pool/node-a", Node: "node-a"}); err != nil {
		t.Fatal(err)
	}
	dir := locations.NewDirectory(master, dataplane.NewPeers(), "pool/node-a", logr.Discard())
	tmp := t.TempDir()
	store, err := tierstore.Open(context.Background(), tierstore.Config{
		Tiers:    []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(tmp, "mem")}, Quota: 64 << 20}},
		IndexDir: filepath.Join(tmp, "index"), OnRemove: dir.Forget,
	})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = store.Close() })
	staging := t.TempDir()
	o := &output{cfg: Config{Dataset: "ns/out/uid", Root: "/datasets/ns/out/uid", Master: master, Store: store, Locations: dir,
		BlockSize: 1 << 10, StagingDir: staging, MasterTimeout: 10 * time.Second, Metrics: newMetrics()}, log: testr.New(t)}
	if _, err := master.RegisterDataset(context.Background(), &masterpb.RegisterDatasetRequest{Name: o.cfg.Dataset, Root: o.cfg.Root}); err != nil {
		t.Fatal(err)
	}
	j, err := newJournal(logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	fsys := newFileSystem(o)
	if fsys.t, err = newTree(j, mountRecord{Dir: "/mnt", Init: []byte{1}, StagingDir: staging}, nodeState{Mode: rootMode}); err != nil {
		t.Fatal(err)
	}
	return fsys
}

// TestASealAKilledProcessFinishedIsOnlyRecorded takes a file over whose seal an earlier process
// carried out (stored, committed, published) but was killed before recording: the close the
// kernel sends again finds it published and records it, rather than failing with EEXIST or
// storing it twice; and a seal killed half way (blocks stored, their staging files linked
// into the tier) is finished from the stored blocks, unless a block's bytes changed since.
func TestASealAKilledProcessFinishedIsOnlyRecorded(t *testing.T) {
	g := NewWithT(t)
	first := unmountedFileSystem(t)
	o := first.o
	write := func(fsys *fileSystem, name string, data []byte) uint64 {
		var c fuse.CreateOut
		g.Expect(fsys.Create(nil, &fuse.CreateIn{InHeader: fuse.InHeader{Unique: 1, NodeId: rootID}, Mode: 0o644}, name, &c)).To(Equal(fuse.OK))
		_, st := fsys.Write(nil, &fuse.WriteIn{InHeader: fuse.InHeader{NodeId: c.NodeId}, Fh: c.Fh}, data)
		g.Expect(st).To(Equal(fuse.OK))
		return c.NodeId
	}
	// Small files are sealed with one master command, large ones (over maxSealBlocks blocks of
	// 1 KiB) block by block: each way, one file the earlier process published and one it left
	// with its first block stored.
	small, large := 2500, maxSealBlocks*1024+5
	files := map[string][]byte{}
	ids := map[string]uint64{}
	for name, size := range map[string]int{"published-small": small, "published-large": large, "halfway-small": small, "halfway-large": large,
		"halfway-rewritten": small} {
		files[name] = bytes.Repeat([]byte(name[:1]), size)
		ids[name] = write(first, name, files[name])
	}
	for _, name := range []string{"published-small", "published-large"} {
		n := first.t.get(ids[name])
		g.Expect(o.seal(context.Background(), name, n.state.Token, "", n.staged, n.size, false)).To(Succeed())
	}
	for _, name := range []string{"halfway-small", "halfway-large", "halfway-rewritten"} {
		n := first.t.get(ids[name])
		_, err := o.storeBlock(context.Background(), blockindex.OutputBlockID(n.state.Token, 0), n.staged, 0, 1024, nil)
		g.Expect(err).NotTo(HaveOccurred())
	}
	// A block whose staging file changed after it was stored (as after a failed seal that could
	// neither drop the block nor give the staged bytes a file of their own): the stored block
	// is the same file, but no longer the bytes its checksum was taken of.
	rewritten := first.t.get(ids["halfway-rewritten"])
	_, err := rewritten.staged.WriteAt([]byte("REWRITTEN"), 3)
	g.Expect(err).NotTo(HaveOccurred())
	copy(files["halfway-rewritten"][3:], "REWRITTEN")

	own, records, err := readJournal(first.t.j.file, logr.Discard())
	g.Expect(err).NotTo(HaveOccurred())
	next := newFileSystem(o)
	next.t, err = replay(own, records, o.cfg.StagingDir, o.cfg.BlockSize, o.storedBlockFile(context.Background()))
	g.Expect(err).NotTo(HaveOccurred())
	for name, id := range ids {
		g.Expect(next.Flush(nil, &fuse.FlushIn{InHeader: fuse.InHeader{NodeId: id}, Fh: fhWritable})).To(Equal(fuse.OK), name)
		g.Expect(next.t.get(id).state.Sealed).To(BeTrue(), name)
	}
	for name, want := range files {
		f, err := o.cfg.Master.GetFile(context.Background(), &masterpb.GetFileRequest{Path: o.masterPath(name)})
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(f.GetSize()).To(BeEquivalentTo(len(want)))
		g.Expect(f.GetWritten()).To(BeTrue(), "%s is a pod's output, which a restore must not replace", name)
		var got []byte
		for index := int64(0); index*1024 < int64(len(want)); index++ {
			data, _, err := o.cfg.Store.(*tierstore.Store).Get(context.Background(), blockindex.OutputBlockID(f.GetClientToken(), index)) // checks the CRC
			g.Expect(err).NotTo(HaveOccurred(), "%s block %d", name, index)
			got = append(got, data...)
		}
		g.Expect(got).To(Equal(want), "%s reads back whole", name)
	}
}

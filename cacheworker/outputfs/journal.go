package outputfs

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"github.com/hanwen/go-fuse/v2/fuse"
	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/fuseconn"
)

// The journal is how a mount outlives its worker process, killed or not: every change to the
// tree the kernel sees (a node made, moved or removed, a file's state changed) is appended
// before the kernel is answered, to a memfd the CSI node plugin holds with the connection. A
// process taking the mount over replays it. It is kept small by recording state, not bytes:
// what is written is in the staging files, which outlive the process in the top tier's
// folder, and a staged file's size and mtime are read from them.
//
// Each record is a 4-byte little-endian length and that much JSON. A process killed while
// appending leaves a torn last record, which replay drops: that change was never answered,
// and the kernel sends its request again (see the request ids below).
//
// A record names the request that made the change (its FUSE unique id) when that change is
// not safe to make twice: creating a node, opening a file for writing, a writer's release.
// When a process is killed after recording such a change but before answering it, the kernel
// sends the request again to the next process (FUSE_NOTIFY_RESEND, flagged as a resend), which
// finds it in the journal and answers it without making the change twice.
//
// Compaction keeps the journal about the size of the tree: once it has grown past
// compactFactor times its size after the last compaction (and past compactMinSize), the
// journal keeps what its records say of each node (the view), and writes that anew into a new
// memfd: each node, then where it is, then the requests in flight that made a change (the only
// ones the kernel could still send again, besides those a takeover inherits, which are kept
// for a while after it). Whoever holds the handover is given the new file (Config.OnNewJournal)
// before the old one is let go; if that fails, the old one stays in use.

// recordKind says what a record does.
type recordKind string

const (
	recMount recordKind = "mount" // the mount itself; the first record
	recAdd   recordKind = "add"   // a node was made
	recMove  recordKind = "move"  // a node was renamed, or removed from the tree (Parent 0)
	recState recordKind = "state" // a node's attributes or a file's state changed
	recStart recordKind = "start" // a process started serving the mount
	recDone  recordKind = "done"  // a request in flight made a change to node ID (compaction)
)

var (
	// compactMinSize and compactFactor say when the journal is compacted (see above).
	compactMinSize int64 = 1 << 20
	compactFactor  int64 = 4
	// inheritedGrace is how long after a takeover compaction keeps the requests the journal
	// inherited: the kernel sends the unanswered ones again at once, at the takeover.
	inheritedGrace = time.Minute
)

// record is one journal entry.
type record struct {
	Kind recordKind `json:"k"`
	// Request is the unique id of the request whose change this is, when that change must not
	// be made twice; 0 otherwise.
	Request uint64 `json:"r,omitempty"`

	ID     uint64     `json:"id,omitempty"`
	Parent uint64     `json:"p,omitempty"`
	Name   string     `json:"n,omitempty"`
	Dir    bool       `json:"d,omitempty"`
	State  *nodeState `json:"s,omitempty"`

	Mount *mountRecord `json:"m,omitempty"`
}

// mountRecord is what does not change while mounted.
type mountRecord struct {
	Dir, Source string
	Init        []byte
	// Agreed is what INIT settled at mount: the flags and sizes the kernel works with.
	Agreed fuse.InitOut
	// StagingDir is where the files being written are staged.
	StagingDir string
	// BlockSize is the size of the blocks the mount's files are staged and sealed in, kept for
	// the mount's life (a TierPool's new block size applies to new mounts); 0 in the journal
	// of a version that staged each file whole, in one staging file.
	BlockSize int64 `json:",omitempty"`
	// Starts counts the processes that served the mount before this journal's first record.
	Starts int `json:",omitempty"`
}

// nodeState is what a node shows besides its place in the tree, and a file's progress.
type nodeState struct {
	Mode     uint32 `json:"mode"`
	UID      uint32 `json:"uid,omitempty"`
	GID      uint32 `json:"gid,omitempty"`
	MtimeNs  int64  `json:"mtime"`
	Token    string `json:"token,omitempty"`
	Size     int64  `json:"size,omitempty"` // of a sealed file; a staged one's is its staging file's
	Sealed   bool   `json:"sealed,omitempty"`
	Writers  int    `json:"writers,omitempty"`
	Unlinked bool   `json:"unlinked,omitempty"`
	// SealFailed: the last writer's close was told why the file could not be sealed.
	SealFailed bool `json:"sealFailed,omitempty"`
	// WriteLost: a write into the staging file failed, so bytes a writer gave are missing. The
	// file is never sealed so, whatever the writer does with the error (a writer that goes on,
	// or another thread's write, would otherwise seal a file with a hole), until it is truncated
	// to nothing and written anew.
	WriteLost bool `json:"writeLost,omitempty"`
	// Attempt and Writer are the pod (its UID) and container that created the file, when
	// Config.Callers knows them: the file is sealed as that pod's attempt.
	Attempt string `json:"attempt,omitempty"`
	Writer  string `json:"writer,omitempty"`
}

// journal appends records to its file.
type journal struct {
	mu   sync.Mutex
	file *os.File
	end  int64
	log  logr.Logger

	// What the records say, for compaction: the mount, how many processes started serving
	// it, and each node.
	mount  mountRecord
	starts int
	view   map[uint64]*viewNode
	// requests maps the requests in flight that made a change to the node changed.
	requests map[uint64]uint64
	// inherited are the requests a takeover found in the journal, kept until inheritedUntil.
	inherited      map[uint64]uint64
	inheritedUntil time.Time
	// compactAt is the size past which the journal is compacted.
	compactAt int64
	// onNew hands a compacted journal to whoever holds the handover; nil if nobody does.
	onNew func(*os.File) error
	// compactions counts the compactions; nil counts nowhere.
	compactions prometheus.Counter
}

// viewNode is what the records say of a node.
type viewNode struct {
	Parent uint64
	Name   string
	Dir    bool
	State  nodeState
}

func (j *journal) init(log logr.Logger) {
	j.log, j.view, j.requests, j.compactAt = log, map[uint64]*viewNode{}, map[uint64]uint64{}, compactMinSize
}

// apply updates what the journal knows from r.
func (j *journal) apply(r record) {
	switch r.Kind {
	case recMount:
		j.mount = *r.Mount
		j.starts = r.Mount.Starts
	case recStart:
		j.starts++
	case recAdd:
		j.view[r.ID] = &viewNode{Parent: r.Parent, Name: r.Name, Dir: r.Dir, State: *r.State}
	case recMove:
		if v := j.view[r.ID]; v != nil {
			v.Parent, v.Name = r.Parent, r.Name
		}
	case recState:
		if v := j.view[r.ID]; v != nil {
			v.State = *r.State
		}
	}
}

// newJournal makes an empty journal in a new memfd.
func newJournal(log logr.Logger) (*journal, error) {
	f, err := newJournalFile()
	if err != nil {
		return nil, err
	}
	j := &journal{file: f}
	j.init(log)
	return j, nil
}

func newJournalFile() (*os.File, error) {
	fd, err := unix.MemfdCreate("strata-output-journal", unix.MFD_CLOEXEC)
	if err != nil {
		return nil, fmt.Errorf("making the output mount's journal: %w", err)
	}
	return os.NewFile(uintptr(fd), "strata-output-journal"), nil
}

// encode is r as the journal stores it.
func encode(r record) ([]byte, error) {
	data, err := json.Marshal(r)
	if err != nil {
		return nil, fmt.Errorf("encoding a journal record: %w", err)
	}
	buf := make([]byte, 4+len(data))
	binary.LittleEndian.PutUint32(buf, uint32(len(data)))
	copy(buf[4:], data)
	return buf, nil
}

// append writes r at the journal's end. A failure means the change cannot be made: a process
// taking over would not know of it.
func (j *journal) append(r record) error {
	buf, err := encode(r)
	if err != nil {
		return err
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	if _, err := j.file.WriteAt(buf, j.end); err != nil {
		return fmt.Errorf("appending to the output mount's journal: %w", err)
	}
	j.end += int64(len(buf))
	j.apply(r)
	if r.Request != 0 {
		j.requests[r.Request] = r.ID
	}
	if j.end > j.compactAt {
		j.compactLocked()
	}
	return nil
}

// track notes that request, which changed node id, is in flight: a request an earlier process
// recorded, and the kernel sent again.
func (j *journal) track(request, id uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.requests[request] = id
}

// answered notes that request is no longer in flight. (Its answer is written to the kernel
// just after; a compaction and a kill in between would lose its record, and the kernel would
// send it again as a new request.)
func (j *journal) answered(request uint64) {
	j.mu.Lock()
	defer j.mu.Unlock()
	delete(j.requests, request)
}

// compactLocked writes what the journal says anew into a new file and, once whoever holds the
// handover holds that, appends there; j.mu is held.
func (j *journal) compactLocked() {
	f, size, err := j.snapshot()
	if err == nil && j.onNew != nil {
		err = j.onNew(f)
	}
	if err != nil {
		if f != nil {
			_ = f.Close()
		}
		j.compactAt = j.end * compactFactor
		j.log.Error(err, "compacting the output mount's journal; it goes on growing", "bytes", j.end)
		return
	}
	_ = j.file.Close()
	if j.compactions != nil {
		j.compactions.Inc()
	}
	j.log.V(1).Info("compacted the output mount's journal", "from", j.end, "to", size)
	j.file, j.end = f, size
	j.compactAt = max(compactMinSize, size*compactFactor)
}

// snapshot writes the journal's view to a new file: the mount, every node (detached), where
// each is, and the requests in flight.
func (j *journal) snapshot() (*os.File, int64, error) {
	f, err := newJournalFile()
	if err != nil {
		return nil, 0, err
	}
	mount := j.mount
	mount.Starts = j.starts
	records := []record{{Kind: recMount, Mount: &mount}}
	ids := make([]uint64, 0, len(j.view))
	for id := range j.view {
		ids = append(ids, id)
	}
	slices.Sort(ids)
	for _, id := range ids {
		v := j.view[id]
		st := v.State
		records = append(records, record{Kind: recAdd, ID: id, Name: v.Name, Dir: v.Dir, State: &st})
	}
	for _, id := range ids {
		if v := j.view[id]; v.Parent != 0 {
			records = append(records, record{Kind: recMove, ID: id, Parent: v.Parent, Name: v.Name})
		}
	}
	done := maps.Clone(j.requests)
	if time.Now().Before(j.inheritedUntil) {
		for req, id := range j.inherited {
			done[req] = id
		}
	}
	for req, id := range done {
		records = append(records, record{Kind: recDone, Request: req, ID: id})
	}
	var buf []byte
	for _, r := range records {
		b, err := encode(r)
		if err != nil {
			_ = f.Close()
			return nil, 0, err
		}
		buf = append(buf, b...)
	}
	if _, err := f.WriteAt(buf, 0); err != nil {
		_ = f.Close()
		return nil, 0, fmt.Errorf("writing the compacted journal: %w", err)
	}
	return f, int64(len(buf)), nil
}

// readJournal reads every whole record of f, drops a torn last one (cutting the file there,
// so that appends follow the last whole record), and returns a journal that appends to a
// descriptor of its own of f.
func readJournal(f *os.File, log logr.Logger) (*journal, []record, error) {
	size, err := f.Seek(0, io.SeekEnd)
	if err != nil {
		return nil, nil, fmt.Errorf("reading the output mount's journal: %w", err)
	}
	r := io.NewSectionReader(f, 0, size)
	var records []record
	var off int64
	for {
		var length [4]byte
		if _, err := r.ReadAt(length[:], off); err != nil {
			break // the end, or a torn length
		}
		n := int64(binary.LittleEndian.Uint32(length[:]))
		data := make([]byte, n)
		if _, err := r.ReadAt(data, off+4); err != nil {
			break // torn
		}
		var rec record
		if err := json.Unmarshal(data, &rec); err != nil {
			return nil, nil, fmt.Errorf("the output mount's journal has a bad record at %d: %w", off, err)
		}
		records = append(records, rec)
		off += 4 + n
	}
	if len(records) == 0 || records[0].Kind != recMount || records[0].Mount == nil {
		return nil, nil, errors.New("the output mount's journal does not start with the mount")
	}
	if off < size {
		if err := f.Truncate(off); err != nil {
			return nil, nil, fmt.Errorf("dropping the torn end of the output mount's journal: %w", err)
		}
	}
	own, err := fuseconn.DupFile(f)
	if err != nil {
		return nil, nil, err
	}
	j := &journal{file: own, end: off}
	j.init(log)
	j.inherited, j.inheritedUntil = map[uint64]uint64{}, time.Now().Add(inheritedGrace)
	for _, r := range records {
		j.apply(r)
		if r.Request != 0 {
			j.inherited[r.Request] = r.ID
		}
	}
	j.compactAt = max(compactMinSize, off*compactFactor)
	return j, records, nil
}

func (j *journal) close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.file.Close()
}

// dup returns a new descriptor of the journal's current file.
func (j *journal) dup() (*os.File, error) {
	j.mu.Lock()
	defer j.mu.Unlock()
	return fuseconn.DupFile(j.file)
}

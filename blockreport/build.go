package blockreport

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/master/masterpb"
)

// Master is the part of the master a report reads: the files it knows below a Dataset's root,
// where their blocks are, and the nodes of the workers that hold them.
type Master interface {
	ListFiles(ctx context.Context, req *masterpb.ListFilesRequest) (*masterpb.ListFilesResponse, error)
	GetBlockLocations(ctx context.Context, req *masterpb.GetBlockLocationsRequest) (*masterpb.GetBlockLocationsResponse, error)
	ListWorkers(ctx context.Context, req *masterpb.ListWorkersRequest) (*masterpb.ListWorkersResponse, error)
}

// Request says what to report on.
type Request struct {
	// Dataset is namespace/name, for the report's reader.
	Dataset string
	// Root is the Dataset's folder in the master's namespace (v1alpha1.MasterDatasetRoot).
	Root string
	// Dir is the folder of the tree to report, as CleanDir gives it.
	Dir       string
	BlockSize int64
	// Tree streams the tree of a Dataset read from stores into visit (the workers give it, one
	// object at a time: a tree may hold millions). Nil for an output, whose files are the
	// master's.
	Tree func(ctx context.Context, visit func(understore.ObjectInfo)) error
	// MaxFiles bounds the files described, the first in path order (all are counted).
	MaxFiles int
}

// entry is a file to describe: its path in the tree and where the master keeps its blocks.
type entry struct {
	path, masterPath string
	size             int64
}

// Build makes the report req asks for.
func Build(ctx context.Context, m Master, req Request) (*Report, error) {
	if req.BlockSize <= 0 {
		return nil, fmt.Errorf("block report of %s: the block size is unknown", req.Dataset)
	}
	r := &Report{Dataset: req.Dataset, Dir: req.Dir, Generated: time.Now().UTC(), BlockSize: req.BlockSize, Files: []File{}}
	first := newFirstEntries(req.MaxFiles)
	add := func(e entry) {
		r.TotalFiles++
		r.TotalBytes += e.size
		first.add(e)
	}
	if err := req.entries(ctx, m, add); err != nil {
		return nil, err
	}
	entries := first.sorted()
	nodes, err := workerNodes(ctx, m)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		f, err := req.describe(ctx, m, nodes, e)
		if err != nil {
			return nil, err
		}
		r.Files = append(r.Files, f)
	}
	return r, nil
}

// entries gives add the files of the folder asked for.
func (req *Request) entries(ctx context.Context, m Master, add func(entry)) error {
	if req.Tree != nil {
		return req.Tree(ctx, func(o understore.ObjectInfo) {
			if InDir(o.Path, req.Dir) {
				add(entry{path: o.Path, size: o.Size, masterPath: locations.MasterPath(path.Join(req.Root, o.Path), o.ETag)})
			}
		})
	}
	dir := path.Join(req.Root, req.Dir)
	for after := ""; ; {
		resp, err := m.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: dir, Recursive: true, StartAfter: after, StaleOk: true})
		switch {
		case status.Code(err) == codes.NotFound:
			// Nothing written below dir (yet).
			return nil
		case err != nil:
			return fmt.Errorf("listing the files of %s at the master: %w", req.Dataset, err)
		}
		for _, e := range resp.GetEntries() {
			if e.GetDir() || e.GetFile() == nil {
				continue
			}
			add(entry{path: strings.TrimPrefix(e.GetPath(), req.Root+"/"), masterPath: e.GetPath(), size: e.GetFile().GetSize()})
		}
		if after = resp.GetNextStartAfter(); after == "" {
			return nil
		}
	}
}

// firstEntries keeps the first max entries in path order of those added in any order: a heap
// of them whose top is the last kept, so that memory stays bounded however many are added.
type firstEntries struct {
	max  int
	heap []entry
}

func newFirstEntries(max int) *firstEntries { return &firstEntries{max: max} }

func (f *firstEntries) add(e entry) {
	if f.max <= 0 {
		f.heap = append(f.heap, e)
		return
	}
	if len(f.heap) < f.max {
		heap.Push(f, e)
		return
	}
	if e.path < f.heap[0].path {
		f.heap[0] = e
		heap.Fix(f, 0)
	}
}

// sorted are the entries kept, in path order.
func (f *firstEntries) sorted() []entry {
	out := slices.Clone(f.heap)
	slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.path, b.path) })
	return out
}

// heap.Interface, the greatest path on top.
func (f *firstEntries) Len() int           { return len(f.heap) }
func (f *firstEntries) Less(i, j int) bool { return f.heap[i].path > f.heap[j].path }
func (f *firstEntries) Swap(i, j int)      { f.heap[i], f.heap[j] = f.heap[j], f.heap[i] }
func (f *firstEntries) Push(x any)         { f.heap = append(f.heap, x.(entry)) }
func (f *firstEntries) Pop() any {
	last := f.heap[len(f.heap)-1]
	f.heap = f.heap[:len(f.heap)-1]
	return last
}

// describe finds where the blocks of e are.
func (req *Request) describe(ctx context.Context, m Master, nodes map[string]string, e entry) (File, error) {
	f := File{Path: e.path, Size: e.size, Blocks: (e.size + req.BlockSize - 1) / req.BlockSize}
	resp, err := m.GetBlockLocations(ctx, &masterpb.GetBlockLocationsRequest{Path: e.masterPath, StaleOk: true})
	switch {
	case status.Code(err) == codes.NotFound:
		// No block of it was ever cached (or it went meanwhile).
		return f, nil
	case err != nil:
		return File{}, fmt.Errorf("finding the blocks of %s at the master: %w", e.path, err)
	}
	var copies copyTotals
	for _, b := range resp.GetBlocks() {
		cached := false
		for _, loc := range b.GetLocations() {
			if loc.GetLost() {
				continue
			}
			cached = true
			node := nodes[loc.GetWorker()]
			if node == "" {
				node = loc.GetWorker()
			}
			copies.add(node, loc.GetTier(), 1, b.GetSize())
		}
		if cached {
			f.CachedBlocks++
			f.CachedBytes += b.GetSize()
		}
	}
	f.Copies = copies.sorted()
	return f, nil
}

// workerNodes maps the master's worker ids to their nodes.
func workerNodes(ctx context.Context, m Master) (map[string]string, error) {
	resp, err := m.ListWorkers(ctx, &masterpb.ListWorkersRequest{})
	if err != nil {
		return nil, fmt.Errorf("listing the workers at the master: %w", err)
	}
	nodes := make(map[string]string, len(resp.GetWorkers()))
	for _, w := range resp.GetWorkers() {
		nodes[w.GetId()] = w.GetNode()
	}
	return nodes, nil
}

// ErrTooLarge says a report does not fit its limit even with no file described.
var ErrTooLarge = errors.New("the block report does not fit a ConfigMap")

// EncodeWithin encodes r, leaving files out from the end (they stay counted in TotalFiles)
// until it fits in limit bytes.
func (r *Report) EncodeWithin(limit int) (string, error) {
	for {
		data, err := r.Encode()
		if err != nil {
			return "", err
		}
		if len(data) <= limit {
			return data, nil
		}
		if len(r.Files) == 0 {
			return "", ErrTooLarge
		}
		// Each file costs about the same: keep the share that fits, and at least one fewer.
		keep := min(len(r.Files)-1, len(r.Files)*limit/len(data))
		r.Files = r.Files[:keep]
	}
}

package blockreport

import (
	"cmp"
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
	// Tree is what the Dataset's mounts show, for a Dataset read from stores (a worker that
	// mounts it gives it). Nil for an output, whose files are the master's.
	Tree []understore.ObjectInfo
	// MaxFiles bounds the files described (all are counted).
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
	entries, err := req.entries(ctx, m)
	if err != nil {
		return nil, err
	}
	r := &Report{Dataset: req.Dataset, Dir: req.Dir, Generated: time.Now().UTC(), BlockSize: req.BlockSize, Files: []File{}}
	for _, e := range entries {
		r.TotalFiles++
		r.TotalBytes += e.size
	}
	if req.MaxFiles > 0 && len(entries) > req.MaxFiles {
		entries = entries[:req.MaxFiles]
	}
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

// entries are the files of the folder asked for, in path order.
func (req *Request) entries(ctx context.Context, m Master) ([]entry, error) {
	var out []entry
	if req.Tree != nil {
		for _, o := range req.Tree {
			if InDir(o.Path, req.Dir) {
				out = append(out, entry{path: o.Path, size: o.Size,
					masterPath: locations.MasterPath(path.Join(req.Root, o.Path), o.ETag)})
			}
		}
		slices.SortFunc(out, func(a, b entry) int { return strings.Compare(a.path, b.path) })
		return out, nil
	}
	dir := path.Join(req.Root, req.Dir)
	for after := ""; ; {
		resp, err := m.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: dir, Recursive: true, StartAfter: after, StaleOk: true})
		switch {
		case status.Code(err) == codes.NotFound:
			// Nothing written below dir (yet).
			return out, nil
		case err != nil:
			return nil, fmt.Errorf("listing the files of %s at the master: %w", req.Dataset, err)
		}
		for _, e := range resp.GetEntries() {
			if e.GetDir() || e.GetFile() == nil {
				continue
			}
			out = append(out, entry{path: strings.TrimPrefix(e.GetPath(), req.Root+"/"), masterPath: e.GetPath(), size: e.GetFile().GetSize()})
		}
		if after = resp.GetNextStartAfter(); after == "" {
			return out, nil
		}
	}
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
	copies := map[[2]string]*Copy{}
	var places [][2]string
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
			k := [2]string{node, loc.GetTier()}
			c, ok := copies[k]
			if !ok {
				c = &Copy{Node: node, Tier: loc.GetTier()}
				copies[k] = c
				places = append(places, k)
			}
			c.Blocks++
			c.Bytes += b.GetSize()
		}
		if cached {
			f.CachedBlocks++
			f.CachedBytes += b.GetSize()
		}
	}
	sortPlaces(places)
	for _, k := range places {
		f.Copies = append(f.Copies, *copies[k])
	}
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

func sortPlaces(places [][2]string) {
	slices.SortFunc(places, func(a, b [2]string) int {
		return cmp.Or(strings.Compare(a[0], b[0]), strings.Compare(a[1], b[1]))
	})
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

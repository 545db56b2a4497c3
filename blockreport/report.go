// Package blockreport says where the blocks of a Dataset's files are: on which nodes, in which
// tier, and how much of each file is cached at all. The operator builds a report when a user
// asks for one (the data.strata.dev/block-report-requested annotation) and writes it to a
// ConfigMap of the Dataset's namespace, which `kubectl strata ls` and `du` read: a user sees
// where its data is without any access to the master or the workers.
package blockreport

import (
	"cmp"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
	"time"
)

// ConfigMapKey is the key of the report in its ConfigMap.
const ConfigMapKey = "report.json"

// Report is where the blocks of the files of one folder of a Dataset's tree are.
type Report struct {
	// Dataset is namespace/name.
	Dataset string `json:"dataset"`
	// Dir is the folder reported, relative to the Dataset's root; empty for the whole tree.
	Dir string `json:"dir,omitempty"`
	// Generated is when the report was made; the cache moves on after.
	Generated time.Time `json:"generated"`
	// BlockSize is the unit the TierPool caches in.
	BlockSize int64 `json:"blockSize"`
	// Files are the folder's files in path order; fewer than TotalFiles when the report was cut
	// to fit a ConfigMap.
	Files []File `json:"files"`
	// TotalFiles and TotalBytes are the whole folder's.
	TotalFiles int64 `json:"totalFiles"`
	TotalBytes int64 `json:"totalBytes"`
}

// File is one file and where its blocks are.
type File struct {
	// Path is relative to the Dataset's root.
	Path string `json:"path"`
	Size int64  `json:"size"`
	// Blocks is how many blocks the file has, and CachedBlocks how many of them have a copy on
	// some node.
	Blocks       int64 `json:"blocks"`
	CachedBlocks int64 `json:"cachedBlocks"`
	// CachedBytes is the size of the cached blocks.
	CachedBytes int64 `json:"cachedBytes"`
	// Copies are the file's cached blocks by node and tier.
	Copies []Copy `json:"copies,omitempty"`
}

// Copy counts the blocks of a file that one node holds in one tier.
type Copy struct {
	Node   string `json:"node"`
	Tier   string `json:"tier"`
	Blocks int64  `json:"blocks"`
	Bytes  int64  `json:"bytes"`
}

// CleanDir is dir as reports name folders: relative to the Dataset's root, without leading or
// trailing slashes, "" for the root. A dir that climbs out of the tree is refused.
func CleanDir(dir string) (string, error) {
	if slices.Contains(strings.Split(dir, "/"), "..") {
		return "", fmt.Errorf("folder %q climbs out of the Dataset's tree: name a folder in it, relative to its root, such as raw/2024", dir)
	}
	return strings.Trim(path.Clean("/"+dir), "/"), nil
}

// InDir says whether the file at p (relative to the root) lies in dir (as CleanDir gives it).
func InDir(p, dir string) bool {
	return dir == "" || p == dir || strings.HasPrefix(p, dir+"/")
}

// Encode is the report as its ConfigMap holds it.
func (r *Report) Encode() (string, error) {
	b, err := json.Marshal(r)
	if err != nil {
		return "", fmt.Errorf("encoding the block report of %s: %w", r.Dataset, err)
	}
	return string(b), nil
}

// Decode reads a report from its ConfigMap's value.
func Decode(data string) (*Report, error) {
	r := &Report{}
	if err := json.Unmarshal([]byte(data), r); err != nil {
		return nil, fmt.Errorf("the block report does not decode (was it edited?): %w", err)
	}
	return r, nil
}

// Usage is what a set of files holds where: the sums `du` shows.
type Usage struct {
	Files, Bytes, CachedBytes int64
	// ByPlace are the cached bytes by node and tier, sorted by node then tier.
	ByPlace []Copy
}

// Sum adds up the files of r under dir.
func (r *Report) Sum(dir string) Usage {
	var u Usage
	var places copyTotals
	for _, f := range r.Files {
		if !InDir(f.Path, dir) {
			continue
		}
		u.Files++
		u.Bytes += f.Size
		u.CachedBytes += f.CachedBytes
		for _, c := range f.Copies {
			places.add(c.Node, c.Tier, c.Blocks, c.Bytes)
		}
	}
	u.ByPlace = places.sorted()
	return u
}

// copyTotals adds up blocks and bytes by node and tier.
type copyTotals map[[2]string]*Copy

func (t *copyTotals) add(node, tier string, blocks, bytes int64) {
	if *t == nil {
		*t = copyTotals{}
	}
	k := [2]string{node, tier}
	c, ok := (*t)[k]
	if !ok {
		c = &Copy{Node: node, Tier: tier}
		(*t)[k] = c
	}
	c.Blocks += blocks
	c.Bytes += bytes
}

// sorted are the totals by node, then tier; nil for none.
func (t copyTotals) sorted() []Copy {
	var out []Copy
	for _, c := range t {
		out = append(out, *c)
	}
	slices.SortFunc(out, func(a, b Copy) int {
		return cmp.Or(strings.Compare(a.Node, b.Node), strings.Compare(a.Tier, b.Tier))
	})
	return out
}

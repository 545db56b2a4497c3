// Package warmup reads the files of a mounted Dataset once, so that the worker of the node
// caches them before the first real reader comes: a Dataset's preload, and a DataLoad's run on
// one node. Reading through the mount (rather than asking a worker to fetch blocks) warms
// exactly what readers will use, through the same path, and needs no API of its own.
package warmup

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/lineage/kariz"
)

// LoaderUID is the user the load Jobs (a Dataset's preload, a DataLoad's runs) run as. The
// node's worker sees the user of every read of its mounts and takes this one's for loads:
// they give way to the pods' reads, and are counted apart (cacheworker/fusefs.Loads). It is
// no user a container image names, so that no tenant's pod is taken for a load by chance.
const LoaderUID = 65400

// Result is what a warm-up read.
type Result struct {
	Files int64 `json:"files"`
	Bytes int64 `json:"bytes"`
}

// Options shape a warm-up.
type Options struct {
	// Concurrency is how many files are read at once; below 1 means 1.
	Concurrency int
	// Paths selects the files, by their path relative to the folder (policy.Compile); none
	// selects every file.
	Paths []policy.Pattern
	// MetadataOnly looks the selected files up and reads no byte: the node's worker lists the
	// Dataset when it mounts it, and keeps that listing, so that later mounts need none.
	MetadataOnly bool
	// Percent, from 1 to 99, reads that share of each file's blocks of BlockSize bytes, spread
	// over the file (kariz.Share): what a DataLoad's percentOfEachFile loads. Otherwise every
	// byte is read.
	Percent   int
	BlockSize int64
	// Progress, if set, is given the running totals after each file.
	Progress func(Result)
}

// Run reads every selected regular file below dir and reports the totals. It stops at the
// first error, which names the file.
//
// Each file's pages are dropped from the page cache before it is read, so that every byte
// reaches the worker: the kernel keeps a mount's pages from one pod to the next, and they may
// still hold blocks that the worker's tiers have let go, which a read served from the page
// cache would never bring back. They are dropped again once read: a load fills the tiers,
// within the budget the worker keeps for them, not the node's page cache, which is the pods'.
func Run(ctx context.Context, dir string, opts Options) (Result, error) {
	var files, total atomic.Int64
	var mu sync.Mutex // serialises progress reports
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(opts.Concurrency, 1))
	walkErr := filepath.WalkDir(dir, func(path string, entry fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("walking %s: %w", path, err)
		}
		if gctx.Err() != nil {
			return gctx.Err()
		}
		if !entry.Type().IsRegular() || !selected(dir, path, opts.Paths) {
			return nil
		}
		g.Go(func() error {
			n, err := warm(path, opts)
			if err != nil {
				return err
			}
			r := Result{Files: files.Add(1), Bytes: total.Add(n)}
			if opts.Progress != nil {
				mu.Lock()
				opts.Progress(r)
				mu.Unlock()
			}
			return nil
		})
		return nil
	})
	err := g.Wait()
	if walkErr != nil && err == nil {
		err = walkErr
	}
	return Result{Files: files.Load(), Bytes: total.Load()}, err
}

// selected says whether the file at path, below dir, matches one of patterns (any, if none).
func selected(dir, path string, patterns []policy.Pattern) bool {
	if len(patterns) == 0 {
		return true
	}
	rel, err := filepath.Rel(dir, path)
	if err != nil {
		return false
	}
	rel = filepath.ToSlash(rel)
	return slices.ContainsFunc(patterns, func(p policy.Pattern) bool { return p.Match(rel) })
}

// warm reads the file at path (all of it, or its share of blocks) past the page cache, or only
// looks it up, and says how many bytes it read (or, looked up, how large it is).
func warm(path string, opts Options) (int64, error) {
	if opts.MetadataOnly {
		info, err := os.Stat(path)
		if err != nil {
			return 0, fmt.Errorf("looking up %s: %w", path, err)
		}
		return info.Size(), nil
	}
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
		return 0, fmt.Errorf("dropping the cached pages of %s: %w", path, err)
	}
	n, err := read(f, path, opts)
	if err == nil {
		if err = unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			err = fmt.Errorf("dropping the pages of %s read: %w", path, err)
		}
	}
	return n, err
}

// read reads file f (at path) whole, or its share of blocks.
func read(f *os.File, path string, opts Options) (int64, error) {
	if opts.Percent <= 0 || opts.Percent >= 100 || opts.BlockSize <= 0 {
		n, err := io.Copy(io.Discard, f)
		if err != nil {
			return n, fmt.Errorf("reading %s: %w", path, err)
		}
		return n, nil
	}
	info, err := f.Stat()
	if err != nil {
		return 0, fmt.Errorf("looking up %s: %w", path, err)
	}
	var read int64
	buf := make([]byte, min(opts.BlockSize, 1<<20))
	for _, i := range kariz.Share(int((info.Size()+opts.BlockSize-1)/opts.BlockSize), opts.Percent) {
		block := io.NewSectionReader(f, int64(i)*opts.BlockSize, opts.BlockSize)
		n, err := io.CopyBuffer(io.Discard, block, buf)
		read += n
		if err != nil {
			return read, fmt.Errorf("reading block %d of %s: %w", i, path, err)
		}
	}
	return read, nil
}

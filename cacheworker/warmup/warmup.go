// Package warmup reads every file of a mounted Dataset once, so that the worker of the node
// caches all of it before the first real reader comes: the Dataset's preload. Reading through
// the mount (rather than asking a worker to fetch blocks) warms exactly what readers will use,
// through the same path, and needs no API of its own.
package warmup

import (
	"context"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"

	"golang.org/x/sync/errgroup"
)

// Result is what a warm-up read.
type Result struct {
	Files int64 `json:"files"`
	Bytes int64 `json:"bytes"`
}

// Run reads every regular file below dir, concurrency files at a time, and reports the running
// totals to progress (which may be nil) after each file. It stops at the first error, which
// names the file.
func Run(ctx context.Context, dir string, concurrency int, progress func(Result)) (Result, error) {
	if concurrency < 1 {
		concurrency = 1
	}
	var files, total atomic.Int64
	var mu sync.Mutex // serialises progress reports
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(concurrency)
	walkErr := filepath.WalkDir(dir, func(path string, entry fs.DirEntry, err error) error {
		if err != nil {
			return fmt.Errorf("walking %s: %w", path, err)
		}
		if gctx.Err() != nil {
			return gctx.Err()
		}
		if !entry.Type().IsRegular() {
			return nil
		}
		g.Go(func() error {
			n, err := readAll(path)
			if err != nil {
				return err
			}
			r := Result{Files: files.Add(1), Bytes: total.Add(n)}
			if progress != nil {
				mu.Lock()
				progress(r)
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

func readAll(path string) (int64, error) {
	f, err := os.Open(path)
	if err != nil {
		return 0, fmt.Errorf("opening %s: %w", path, err)
	}
	defer func() { _ = f.Close() }()
	n, err := io.Copy(io.Discard, f)
	if err != nil {
		return n, fmt.Errorf("reading %s: %w", path, err)
	}
	return n, nil
}

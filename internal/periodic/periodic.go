// Package periodic runs background work at a fixed interval: the sweeps, checks and refills
// the worker, the master and the CSI plugin each keep doing while they run, and the reading of
// the files the operator keeps for them.
package periodic

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"os"
	"time"

	"github.com/go-logr/logr"
)

// Every calls fn with the time of each tick, every interval (the first after one interval, not
// at once), until ctx ends. A call that takes longer than interval delays the next rather than
// overlapping it.
func Every(ctx context.Context, interval time.Duration, fn func(ctx context.Context, now time.Time)) {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case now := <-t.C:
			fn(ctx, now)
		}
	}
}

// WatchFile reads the file at p at once and then every interval, and calls apply with its
// content whenever that changed, the first read included; a missing file reads as empty. The
// operator keeps such files up to date in ConfigMaps, which the kubelet rewrites in the running
// pods. It returns when ctx ends; see Watch.
func WatchFile(ctx context.Context, p string, interval time.Duration, log logr.Logger, apply func(raw []byte) error) {
	Watch(ctx, "file "+p, interval, log, func(context.Context) ([]byte, error) {
		raw, err := os.ReadFile(p)
		if errors.Is(err, fs.ErrNotExist) {
			return nil, nil
		}
		return raw, err
	}, apply)
}

// Watch reads what (a file, a URL the operator serves) with read at once and then every
// interval, and calls apply with it whenever it changed, the first successful read included. A
// read that fails, or a content that apply refuses, is logged, and what was applied before stays
// in force; a refused content is not tried again until it changes. It returns when ctx ends.
func Watch(ctx context.Context, what string, interval time.Duration, log logr.Logger,
	read func(context.Context) ([]byte, error), apply func(raw []byte) error) {
	var last []byte
	first := true
	once := func(ctx context.Context) {
		raw, err := read(ctx)
		switch {
		case err != nil:
			log.Error(err, "Cannot read what the operator keeps; keeping what it said before", "from", what)
		case first || !bytes.Equal(raw, last):
			if err := apply(raw); err != nil {
				log.Error(err, "Ignoring what does not apply; keeping what it said before", "from", what)
			}
			first, last = false, raw
		}
	}
	once(ctx)
	Every(ctx, interval, func(ctx context.Context, _ time.Time) { once(ctx) })
}

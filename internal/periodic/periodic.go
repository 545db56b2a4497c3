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
// operator keeps such files up to date in ConfigMaps and Secrets, which the kubelet rewrites in
// the running pods. A content that apply refuses is logged and not tried again until it
// changes: what was applied before stays in force. It returns when ctx ends.
func WatchFile(ctx context.Context, p string, interval time.Duration, log logr.Logger, apply func(raw []byte) error) {
	var last []byte
	first := true
	read := func() {
		raw, err := os.ReadFile(p)
		switch {
		case err != nil && !errors.Is(err, fs.ErrNotExist):
			log.Error(err, "Cannot read a file the operator keeps; keeping what it said before", "file", p)
		case first || !bytes.Equal(raw, last):
			if err := apply(raw); err != nil {
				log.Error(err, "Ignoring a file that does not apply; keeping what it said before", "file", p)
			}
			first, last = false, raw
		}
	}
	read()
	Every(ctx, interval, func(context.Context, time.Time) { read() })
}

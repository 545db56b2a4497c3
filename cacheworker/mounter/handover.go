package mounter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/fusefs"
	"github.com/strata-cache/strata/cacheworker/outputfs"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/fdstore"
	"github.com/strata-cache/strata/internal/periodic"
)

// Handovers keeps open files for the next worker process: the CSI node plugin's file
// descriptor store (fdstore.Client).
//
// Every mount is put there as it is made: an input's FUSE connection, state and open-file
// table (fusefs.Handover), an output's connection and journal (outputfs.Handover), under its
// UID, with the MountDatasetRequest that made it, credentials included, which is why the store
// keeps entries in memory only. Since the store holds the connection, the mounts pods hold
// stay up when the worker stops or dies; requests wait in the kernel meanwhile. At start,
// Recover takes every held mount over (fusefs.Resume, with its under-store and cache opened
// from the request as MountDataset would; outputfs.Resume, with the files being written). A mount that ends
// (unmounted, and no pod holds it) is dropped from the store. A store that restarted has lost
// its entries; RefillHandovers puts them back.
type Handovers interface {
	Put(ctx context.Context, key string, data []byte, files []*os.File) error
	Get(ctx context.Context, key string) ([]byte, []*os.File, error)
	Keys(ctx context.Context) ([]string, error)
	Drop(ctx context.Context, key string) error
}

var _ Handovers = (*fdstore.Client)(nil)

// handoverTimeout bounds one call to the store.
const handoverTimeout = 5 * time.Second

// hold puts mnt's connection in the store. A failure leaves the mount working, only not
// beyond this worker process, and says so.
func (m *Mounter) hold(ctx context.Context, mnt *mount) {
	if m.cfg.Handovers == nil {
		return
	}
	if err := m.put(ctx, mnt); err != nil {
		m.log.Error(err, "the file descriptor store does not hold this mount: pods lose it if the worker restarts before the store is back",
			"dataset", mnt.dataset(), "uid", mnt.uid)
	}
}

// put hands mnt's connection and the request that made it to the store, and marks it held.
func (m *Mounter) put(ctx context.Context, mnt *mount) error {
	if output, ok := mnt.fs.(*outputfs.Server); ok {
		// Through the mount, which calls putFiles in turn with the compactions of its journal.
		return output.HandOn()
	}
	files, err := handoverFiles(mnt.fs)
	if err != nil {
		return err
	}
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	return m.putFiles(ctx, mnt, files)
}

// putFiles hands the store files, mnt's handover, with the request that made mnt, and marks
// it held. The caller keeps files.
func (m *Mounter) putFiles(ctx context.Context, mnt *mount, files []*os.File) error {
	mnt.handoverMu.Lock()
	defer mnt.handoverMu.Unlock()
	data, err := proto.Marshal(mnt.handedOver())
	if err != nil {
		return fmt.Errorf("encoding the mount request: %w", err)
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), handoverTimeout)
	defer cancel()
	if err := m.cfg.Handovers.Put(ctx, mnt.uid, data, files); err != nil {
		return err
	}
	m.mu.Lock()
	mnt.held = true
	m.mu.Unlock()
	return nil
}

// handedOver is the request the next worker process resumes mnt with: the one that made it,
// and whether the Dataset is deleted; mnt.handoverMu is held.
func (mnt *mount) handedOver() *workerpb.MountDatasetRequest {
	if !mnt.deleted.Load() {
		return mnt.req
	}
	req := proto.Clone(mnt.req).(*workerpb.MountDatasetRequest)
	req.DatasetDeleted = true
	return req
}

// handoverFiles are what the next worker needs to take an input's fs over; the caller closes
// them.
func handoverFiles(fs fileSystem) ([]*os.File, error) {
	input, ok := fs.(*fusefs.Server)
	if !ok {
		return nil, fmt.Errorf("cannot hand over a %T", fs)
	}
	h, err := input.Handover()
	return h.Files(), err
}

// unhold drops an ended mount from the store.
func (m *Mounter) unhold(mnt *mount) {
	m.mu.Lock()
	held := mnt.held
	mnt.held = false
	m.mu.Unlock()
	if !held {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), handoverTimeout)
	defer cancel()
	if err := m.cfg.Handovers.Drop(ctx, mnt.uid); err != nil {
		m.log.Error(err, "dropping an ended mount from the file descriptor store", "uid", mnt.uid)
	}
}

// resumeHeld takes over every mount the store holds for this worker. A mount that cannot be
// taken over is dropped from the store, which ends it (pods see ENOTCONN, and their next
// publish mounts it afresh) rather than leaving its readers waiting forever.
func (m *Mounter) resumeHeld(ctx context.Context) error {
	if m.cfg.Handovers == nil {
		return nil
	}
	kctx, cancel := context.WithTimeout(ctx, handoverTimeout)
	keys, err := m.cfg.Handovers.Keys(kctx)
	cancel()
	if err != nil {
		// No store (yet): nothing to take over. Mounts left from before are dead; the caller
		// detaches them.
		m.log.Info("cannot reach the file descriptor store; mounts of an earlier worker cannot be taken over", "reason", err.Error())
		return nil
	}
	var errs []error
	for _, uid := range keys {
		if err := m.resumeOne(ctx, uid); err != nil {
			m.log.Error(err, "could not take over a mount of an earlier worker; ending it", "uid", uid)
			dctx, cancel := context.WithTimeout(ctx, handoverTimeout)
			if derr := m.cfg.Handovers.Drop(dctx, uid); derr != nil {
				errs = append(errs, derr)
			}
			cancel()
		}
	}
	return errors.Join(errs...)
}

func (m *Mounter) resumeOne(ctx context.Context, uid string) (err error) {
	gctx, cancel := context.WithTimeout(ctx, handoverTimeout)
	data, files, err := m.cfg.Handovers.Get(gctx, uid)
	cancel()
	if err != nil {
		return err
	}
	defer func() {
		for _, f := range files {
			_ = f.Close()
		}
	}()
	req := &workerpb.MountDatasetRequest{}
	if err := proto.Unmarshal(data, req); err != nil {
		return fmt.Errorf("decoding the held mount request: %w", err)
	}
	if err := validate(req); err != nil {
		return err
	}
	if req.GetUid() != uid {
		return fmt.Errorf("the held mount request is for uid %s, not %s", req.GetUid(), uid)
	}
	// The mark is the mount's, not part of the request a publish is compared with.
	deleted := req.GetDatasetDeleted()
	req.DatasetDeleted = false
	mnt := m.newMount(req)
	mnt.deleted.Store(deleted)
	log := m.log.WithValues("dataset", mnt.dataset(), "uid", uid)
	fs, err := m.resumeFileSystem(ctx, mnt, files, log)
	if err != nil {
		mnt.release(log)
		return err
	}
	mnt.fs, mnt.held = fs, true
	mounted, err := isMountPoint(mnt.path)
	m.mu.Lock()
	if err == nil && mounted && filepath.Clean(mnt.fs.Dir()) == mnt.path {
		m.mounts[uid] = mnt
		m.mu.Unlock()
		log.Info("took over the mount of an earlier worker", "path", mnt.path, "output", mnt.output)
		return nil
	}
	// Its folder was unmounted before the restart; pods still hold it.
	m.draining[mnt] = struct{}{}
	m.wg.Add(1)
	m.mu.Unlock()
	log.Info("took over a mount of an earlier worker that only pods still hold; serving it until they are gone")
	go m.drain(mnt, log)
	return nil
}

// resumeFileSystem takes over the file system of mnt from the files an earlier worker held.
func (m *Mounter) resumeFileSystem(ctx context.Context, mnt *mount, files []*os.File, log logr.Logger) (fileSystem, error) {
	if mnt.output {
		h, err := outputfs.HandoverFromFiles(files)
		if err != nil {
			return nil, err
		}
		cfg, err := m.outputConfig(mnt, log)
		if err != nil {
			return nil, err
		}
		srv, err := outputfs.Resume(ctx, h, cfg)
		if err != nil {
			return nil, err
		}
		return srv, nil
	}
	h, err := fusefs.HandoverFromFiles(files)
	if err != nil {
		return nil, err
	}
	if err := m.openCache(ctx, mnt, mnt.req, log); err != nil {
		return nil, err
	}
	srv, err := fusefs.Resume(ctx, h, m.fsConfig(mnt, log))
	if err != nil {
		return nil, err
	}
	return srv, nil
}

// RefillHandovers puts back, every interval until ctx ends, the mounts a restarted store
// lost, so that a CSI node plugin restart does not leave the mounts ending with the worker.
func (m *Mounter) RefillHandovers(ctx context.Context, interval time.Duration) {
	if m.cfg.Handovers == nil {
		return
	}
	periodic.Every(ctx, interval, func(ctx context.Context, _ time.Time) { m.refill(ctx, m.log) })
}

func (m *Mounter) refill(ctx context.Context, log logr.Logger) {
	kctx, cancel := context.WithTimeout(ctx, handoverTimeout)
	keys, err := m.cfg.Handovers.Keys(kctx)
	cancel()
	if err != nil {
		return // the store is away; try again later
	}
	have := map[string]bool{}
	for _, k := range keys {
		have[k] = true
	}
	m.mu.Lock()
	var missing []*mount
	for _, mnt := range m.mounts {
		if !have[mnt.uid] {
			missing = append(missing, mnt)
		}
	}
	for mnt := range m.draining {
		if !have[mnt.uid] {
			missing = append(missing, mnt)
		}
	}
	m.mu.Unlock()
	for _, mnt := range missing {
		if err := m.put(ctx, mnt); err != nil {
			log.Error(err, "putting a mount back in the file descriptor store", "uid", mnt.uid)
			continue
		}
		log.Info("put a mount back in the file descriptor store, which had restarted", "uid", mnt.uid)
	}
}

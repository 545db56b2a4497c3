package outputfs

import (
	"context"
	"errors"
	"fmt"
	"path"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"

	"github.com/strata-cache/strata/master/masterpb"
)

// A file whose blocks no live worker holds and no checkpoint has was lost with its node. When
// something will write it again (its Lineage recomputes it; the operator says so at the master,
// masterpb.DatasetRecovery), a read of it, or an open of it once the master forgot it, waits for
// the new version instead of failing, so that a reader needs no retry loop of its own; it fails
// with EIO when the recovery failed or its wait ran out, and with EINTR when the reader gives up.
// A recomputation writes the same bytes (Tachyon's steps are deterministic): a version of
// another size is EIO, since the reader may have read part of the old one.

// DefaultRecoveryPoll is Config.RecoveryPoll's default.
const DefaultRecoveryPoll = 2 * time.Second

// errRecoveryFailed ends a wait for a lost file: nothing will write it again.
var errRecoveryFailed = errors.New("the lost file will not be written again")

// errBlockLost says that no copy of a block could be read: it was lost with its node.
var errBlockLost = errors.New("lost with its node")

// errNoRecovery is why a read of a lost file did not wait: nothing recovers its Dataset's files.
var errNoRecovery = errors.New("nothing writes the Dataset's lost files again")

// recovering is one read's wait for a lost file at rel (its path in the Dataset when the read
// began, since a recomputation on this node replaces the node in the tree).
type recovering struct {
	fsys  *fileSystem
	n     *node
	rel   string
	start time.Time
}

// awaitRecovery waits until the lost file n is back, and returns the version to read then. lost
// is the version that could not be read (with cause); a read that has begun (sameSize) needs
// the new version to be of its size. It returns cause at once when nothing recovers the
// Dataset's files, with ErrNoRecovery. n.mu must not be held.
func (fsys *fileSystem) awaitRecovery(ctx context.Context, n *node, lost sealedVersion, sameSize bool, cause error) (sealedVersion, error) {
	o := fsys.o
	r := &recovering{fsys: fsys, n: n, rel: fsys.t.rel(n), start: time.Now()}
	if r.rel == "" {
		n.mu.Lock()
		r.rel = n.forgottenAs
		n.mu.Unlock()
	}
	if r.rel == "" {
		// Removed from the tree: nothing names it any more.
		return sealedVersion{}, fmt.Errorf("%w: %w", errNoRecovery, cause)
	}
	wait, err := o.recoveryWait(ctx)
	switch {
	case errors.Is(err, errRecoveryFailed):
		return sealedVersion{}, errors.Join(cause, err)
	case err != nil || wait == 0:
		return sealedVersion{}, fmt.Errorf("%w: %w", errNoRecovery, cause)
	}
	n.mu.Lock()
	inVain := n.waitedInVain == lost.token
	n.mu.Unlock()
	if inVain {
		// A read of this loss waited its whole wait already: look once, and wait no more.
		if v, back := r.current(ctx, lost.token); back {
			return r.recovered(v, lost, sameSize)
		}
		return sealedVersion{}, fmt.Errorf("%s is lost, and was not written again within the wait an earlier read waited: %w", r.rel, cause)
	}
	m := o.cfg.Metrics
	m.recoveryWaiting.Inc()
	defer m.recoveryWaiting.Dec()
	o.log.Info("a read waits for a lost file to be written again", "file", r.rel, "wait", wait.String(), "cause", cause.Error())
	poll := min(100*time.Millisecond, o.cfg.RecoveryPoll)
	timer := time.NewTimer(poll)
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			m.recoveryWaits.WithLabelValues("interrupted").Inc()
			return sealedVersion{}, ctx.Err()
		case <-timer.C:
		}
		if v, back := r.current(ctx, lost.token); back {
			v, err := r.recovered(v, lost, sameSize)
			if err != nil {
				m.recoveryWaits.WithLabelValues("failed").Inc()
				return v, err
			}
			m.recoveryWaits.WithLabelValues("recovered").Inc()
			o.log.Info("a lost file is back", "file", r.rel, "after", time.Since(r.start).Round(time.Millisecond).String())
			return v, nil
		}
		w, err := o.recoveryWait(ctx)
		switch {
		case errors.Is(err, errRecoveryFailed):
			m.recoveryWaits.WithLabelValues("failed").Inc()
			return sealedVersion{}, errors.Join(cause, err)
		case err == nil:
			wait = w
		}
		if time.Since(r.start) >= wait {
			m.recoveryWaits.WithLabelValues("timeout").Inc()
			n.mu.Lock()
			n.waitedInVain = lost.token
			n.mu.Unlock()
			return sealedVersion{}, fmt.Errorf("%s was not written again within %s: %w", r.rel, wait, cause)
		}
		poll = min(2*poll, o.cfg.RecoveryPoll)
		timer.Reset(poll)
	}
}

// recovered checks v, the version that is back, against the lost one: a read that has begun
// needs one of its size.
func (r *recovering) recovered(v, lost sealedVersion, sameSize bool) (sealedVersion, error) {
	if sameSize && v.size != lost.size {
		return sealedVersion{}, fmt.Errorf("%s was written again with %d bytes, not the %d of the version being read: open it again",
			r.rel, v.size, lost.size)
	}
	return v, nil
}

// current asks the master for the file's version: back when there is a version other than token
// (written again), or token's own blocks are readable again (their worker came back).
func (r *recovering) current(ctx context.Context, token string) (sealedVersion, bool) {
	o := r.fsys.o
	mctx, cancel := o.masterContext(ctx)
	f, err := o.cfg.Master.GetFile(mctx, &masterpb.GetFileRequest{Path: o.masterPath(r.rel), StaleOk: true})
	cancel()
	if err != nil || !validToken(f.GetClientToken()) {
		return sealedVersion{}, false // forgotten (being written again), or the master is away
	}
	v := sealedVersion{token: f.GetClientToken(), size: f.GetSize(), rel: func() string { return r.rel }}
	if v.token != token {
		r.fsys.adopt(r.n, f)
	}
	// The first block says whether the version is readable: the rest were written with it.
	if v.size > 0 {
		b, err := o.loadBlock(ctx, v, 0)
		if err != nil {
			return sealedVersion{}, false
		}
		b.close()
	}
	return v, true
}

// recoveryWait is how long a read of one of the Dataset's lost files waits, as the master says:
// 0 when nothing recovers them; errRecoveryFailed when their recovery failed.
func (o *output) recoveryWait(ctx context.Context) (time.Duration, error) {
	mctx, cancel := o.masterContext(ctx)
	defer cancel()
	ds, err := o.cfg.Master.GetDataset(mctx, &masterpb.GetDatasetRequest{Name: o.cfg.Dataset, StaleOk: true})
	switch {
	case status.Code(err) == codes.NotFound:
		// A recomputation made the master forget the Dataset, and the operator has not said
		// again how long to wait (it does within seconds): a CachePolicy's default.
		return datav1alpha1.DefaultRecoveryReadWait, nil
	case err != nil:
		return 0, fmt.Errorf("asking the master how long to wait for a lost file: %w", err)
	case ds.GetRecovery().GetFailed() != "":
		return 0, fmt.Errorf("%w: %s", errRecoveryFailed, ds.GetRecovery().GetFailed())
	}
	return time.Duration(ds.GetRecovery().GetWaitSeconds()) * time.Second, nil
}

// detachForgotten takes n, a sealed file the master forgot, out of the tree, as a removal does,
// remembering its path for the readers that hold it; n.mu is held.
func (fsys *fileSystem) detachForgotten(n *node) error {
	rel := fsys.t.rel(n)
	dir := fsys.t.get(fsys.t.parentOf(n))
	if rel == "" || dir == nil {
		return nil // out of the tree already
	}
	if err := fsys.t.remove(dir, path.Base(rel), n, 0); err != nil {
		return err
	}
	n.forgottenAs = rel
	return nil
}

// adopt makes n show f, a version of it sealed since (written again elsewhere, or recomputed),
// unless n shows f already.
func (fsys *fileSystem) adopt(n *node, f *masterpb.File) bool {
	n.mu.Lock()
	defer n.mu.Unlock()
	return fsys.adoptLocked(n, f)
}

// adoptLocked is adopt with n.mu held.
func (fsys *fileSystem) adoptLocked(n *node, f *masterpb.File) bool {
	if n.state.Token == f.GetClientToken() {
		return false
	}
	old := n.state
	n.state.Token, n.state.Size = f.GetClientToken(), f.GetSize()
	n.state.MtimeNs = f.GetModifiedUnixNano()
	if err := fsys.t.save(n, 0); err != nil {
		n.state = old
		fsys.o.log.Error(err, "recording a file sealed again elsewhere; showing the version this node knows")
		return false
	}
	n.size = f.GetSize()
	return true
}

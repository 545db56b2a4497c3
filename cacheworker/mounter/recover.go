package mounter

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"

	"github.com/go-logr/logr"
	"github.com/moby/sys/mountinfo"
	"golang.org/x/sys/unix"
)

// Recover takes over the mounts an earlier worker process left in the file descriptor store
// (see Handovers), so that pods holding them go on reading, then clears MountsDir of the rest:
// mount points whose FUSE server died with that process ("transport endpoint is not
// connected"), and empty folders. It detaches those lazily (MNT_DETACH), which needs no
// answer from the dead server and succeeds even if a process still has a file open there; the
// CSI plugin's next MountDataset then mounts the Dataset afresh. Call it once, before serving.
func (m *Mounter) Recover(ctx context.Context) error {
	if err := m.resumeHeld(ctx); err != nil {
		m.log.Error(err, "ending mounts that could not be taken over")
	}
	dir, err := filepath.EvalSymlinks(m.cfg.MountsDir)
	if err != nil {
		return fmt.Errorf("recovering the mounts folder: %w", err)
	}
	mounts, err := mountinfo.GetMounts(mountinfo.PrefixFilter(dir))
	if err != nil {
		return fmt.Errorf("reading the mount table: %w", err)
	}
	m.mu.Lock()
	live := map[string]bool{}
	for _, mnt := range m.mounts {
		live[mnt.path] = true
	}
	m.mu.Unlock()
	// Deepest first, so that nothing is left mounted under a detached mount.
	slices.SortFunc(mounts, func(a, b *mountinfo.Info) int { return len(b.Mountpoint) - len(a.Mountpoint) })
	var errs []error
	for _, mi := range mounts {
		if mi.Mountpoint == dir || live[mi.Mountpoint] {
			continue
		}
		if err := detach(mi.Mountpoint); err != nil {
			errs = append(errs, err)
			continue
		}
		m.log.Info("detached a mount left by an earlier worker", "path", mi.Mountpoint, "type", mi.FSType, "source", mi.Source)
	}
	entries, err := os.ReadDir(dir)
	if err != nil {
		return errors.Join(append(errs, fmt.Errorf("listing the mounts folder: %w", err))...)
	}
	for _, e := range entries {
		p := filepath.Join(dir, e.Name())
		if live[p] || !e.IsDir() {
			continue
		}
		// Only empty folders go: anything else in the mounts folder is not ours to delete.
		if err := os.Remove(p); err != nil {
			m.log.Info("left an entry of the mounts folder alone", "path", p, "reason", err.Error())
		}
	}
	return errors.Join(errs...)
}

// clearPath detaches whatever is mounted at p (a mount point an earlier worker left), so that
// a new mount can go there.
func (m *Mounter) clearPath(p string, log logr.Logger) error {
	mounted, err := isMountPoint(p)
	if err != nil || !mounted {
		return err
	}
	if err := detach(p); err != nil {
		return err
	}
	log.Info("detached a mount left by an earlier worker", "path", p)
	if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
		log.Info("left the old mount point in place", "path", p, "reason", err.Error())
	}
	return nil
}

// detach unmounts p lazily: at once from the tree, and for good once nothing uses it.
func detach(p string) error {
	if err := unix.Unmount(p, unix.MNT_DETACH); err != nil && !errors.Is(err, unix.EINVAL) && !errors.Is(err, unix.ENOENT) {
		return fmt.Errorf("detaching %s: %w", p, err)
	}
	return nil
}

// isMountPoint reads the mount table rather than the path, since a dead FUSE mount fails
// every access to it.
func isMountPoint(p string) (bool, error) {
	dir, err := filepath.EvalSymlinks(filepath.Dir(p))
	if errors.Is(err, os.ErrNotExist) {
		return false, nil
	}
	if err != nil {
		return false, err
	}
	mounts, err := mountinfo.GetMounts(mountinfo.SingleEntryFilter(filepath.Join(dir, filepath.Base(p))))
	if err != nil {
		return false, fmt.Errorf("reading the mount table: %w", err)
	}
	return len(mounts) > 0, nil
}

// Package bindmount mounts with system calls instead of the mount(8) and umount(8) programs
// that k8s.io/mount-utils runs, so that the node plugin's image holds one static binary and
// nothing else. The node plugin only ever makes bind mounts (of the worker's FUSE mount of a
// Dataset onto a pod's target path), which need no helper program.
package bindmount

import (
	"errors"
	"fmt"
	"slices"

	"golang.org/x/sys/unix"
	"k8s.io/mount-utils"
)

// Mounter is mount-utils' mounter with Mount and Unmount done by system calls. Mount makes bind
// mounts only; everything else (mount-point checks, listing) is mount-utils' own and reads
// /proc, which needs no program either.
type Mounter struct {
	mount.Interface
}

// New returns a Mounter.
func New() *Mounter { return &Mounter{Interface: mount.New("")} }

// flagOf are the options a bind mount may carry, each a flag of the read-only remount.
var flagOf = map[string]uintptr{
	"ro":      unix.MS_RDONLY,
	"nosuid":  unix.MS_NOSUID,
	"nodev":   unix.MS_NODEV,
	"noexec":  unix.MS_NOEXEC,
	"noatime": unix.MS_NOATIME,
}

// Mount bind-mounts source onto target. options must include "bind"; the others ("ro",
// "nosuid", "nodev", "noexec", "noatime") are applied by a remount, since the kernel ignores
// them on the bind itself. A failed remount undoes the bind, so a target is never left
// writable when it was asked to be read-only.
func (m *Mounter) Mount(source, target, fstype string, options []string) error {
	if !slices.Contains(options, "bind") {
		return fmt.Errorf("mounting %s on %s: only bind mounts are supported, got options %v", source, target, options)
	}
	if fstype != "" && fstype != "none" {
		return fmt.Errorf("mounting %s on %s: a bind mount has no file-system type, got %q", source, target, fstype)
	}
	var flags uintptr
	for _, o := range options {
		if o == "bind" {
			continue
		}
		f, ok := flagOf[o]
		if !ok {
			return fmt.Errorf("mounting %s on %s: unsupported option %q", source, target, o)
		}
		flags |= f
	}
	if err := unix.Mount(source, target, "", unix.MS_BIND, ""); err != nil {
		return fmt.Errorf("bind-mounting %s on %s: %w", source, target, err)
	}
	if flags == 0 {
		return nil
	}
	if err := unix.Mount(source, target, "", unix.MS_BIND|unix.MS_REMOUNT|flags, ""); err != nil {
		uerr := unix.Unmount(target, 0)
		return errors.Join(fmt.Errorf("remounting %s with %v: %w", target, options, err), uerr)
	}
	return nil
}

// MountSensitive refuses sensitive options, which a bind mount never has, and mounts.
func (m *Mounter) MountSensitive(source, target, fstype string, options, sensitive []string) error {
	if len(sensitive) > 0 {
		return fmt.Errorf("mounting %s on %s: a bind mount takes no sensitive options", source, target)
	}
	return m.Mount(source, target, fstype, options)
}

// Unmount unmounts target.
func (m *Mounter) Unmount(target string) error {
	if err := unix.Unmount(target, 0); err != nil {
		return fmt.Errorf("unmounting %s: %w", target, err)
	}
	return nil
}

// Package unixsock listens on Unix sockets in host folders shared between a node's Strata
// components (the worker's mount socket, the CSI plugin's sockets). A socket
// file left by a process that died must be replaced when its successor starts; one that a
// running process still serves must not be, or that process's clients would be cut off without
// a word (a second worker started by mistake, or the previous one still shutting down).
package unixsock

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"os"
	"path/filepath"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

const (
	// socketMode lets the owner and its group connect: access to a node's sockets is decided by
	// the folder they are in, which only Strata's own pods mount.
	socketMode = 0o660
	dirMode    = 0o750
)

// Listen listens on a Unix socket at path: it creates the missing folders, replaces a stale
// socket that nothing accepts on, refuses to touch anything else in the way (a live socket, a
// file), and makes the socket readable and writable by owner and group only.
func Listen(path string) (*net.UnixListener, error) {
	if err := os.MkdirAll(filepath.Dir(path), dirMode); err != nil {
		return nil, fmt.Errorf("creating the folder of socket %s: %w", path, err)
	}
	if err := removeStale(path); err != nil {
		return nil, err
	}
	lis, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	if err != nil {
		return nil, fmt.Errorf("listening on socket %s: %w", path, err)
	}
	if err := os.Chmod(path, socketMode); err != nil {
		_ = lis.Close()
		return nil, fmt.Errorf("setting the mode of socket %s: %w", path, err)
	}
	return lis, nil
}

// kind names what a file mode describes, for messages.
func kind(m fs.FileMode) string {
	switch {
	case m.IsDir():
		return "a folder"
	case m&fs.ModeSymlink != 0:
		return "a symbolic link"
	case m.IsRegular():
		return "a regular file"
	}
	return "a file of mode " + m.Type().String()
}

// removeStale removes a socket at path that nothing listens on any more.
func removeStale(path string) error {
	fi, err := os.Lstat(path)
	if errors.Is(err, fs.ErrNotExist) {
		return nil
	}
	if err != nil {
		return fmt.Errorf("looking at socket %s: %w", path, err)
	}
	if fi.Mode()&fs.ModeSocket == 0 {
		return fmt.Errorf("socket %s: %s is in the way; not removing it: remove it or choose another path", path, kind(fi.Mode()))
	}
	// Only a refused connection proves the socket is stale.
	c, err := net.DialTimeout("unix", path, time.Second)
	if err == nil {
		_ = c.Close()
		return fmt.Errorf("socket %s is in use by a running process", path)
	}
	if !errors.Is(err, syscall.ECONNREFUSED) {
		return fmt.Errorf("checking whether socket %s is in use: %w", path, err)
	}
	if err := os.Remove(path); err != nil && !errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("removing stale socket %s: %w", path, err)
	}
	return nil
}

// ParseRights returns every descriptor in the control messages of a received message, even
// when some message is not SCM_RIGHTS, so that the caller can close them all.
func ParseRights(oob []byte) ([]int, error) {
	msgs, err := unix.ParseSocketControlMessage(oob)
	if err != nil {
		// The kernel installed the descriptors whether or not their headers parse; without
		// the headers there is no knowing which numbers they are, so this cannot happen
		// without a kernel bug.
		return nil, fmt.Errorf("parsing control messages: %w", err)
	}
	var fds []int
	var errs []error
	for i := range msgs {
		if msgs[i].Header.Level != unix.SOL_SOCKET || msgs[i].Header.Type != unix.SCM_RIGHTS {
			errs = append(errs, fmt.Errorf("unexpected control message of level %d, type %d", msgs[i].Header.Level, msgs[i].Header.Type))
			continue
		}
		rights, err := unix.ParseUnixRights(&msgs[i])
		if err != nil {
			errs = append(errs, fmt.Errorf("parsing descriptors: %w", err))
			continue
		}
		fds = append(fds, rights...)
	}
	return fds, errors.Join(errs...)
}

// CloseFDs closes descriptors received and not kept.
func CloseFDs(fds []int) {
	for _, fd := range fds {
		_ = unix.Close(fd)
	}
}

// Package fusetest tells tests whether they may mount FUSE file systems here: as root (the
// worker runs privileged) with /dev/fuse. CI runs as root, so the tests that need FUSE run there.
package fusetest

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"testing"

	"golang.org/x/sys/unix"

	"github.com/strata-cache/strata/internal/fdstore"
	"github.com/strata-cache/strata/internal/testenv"
)

// Available returns nil when FUSE file systems can be mounted, or why not.
func Available() error {
	if os.Geteuid() != 0 {
		return errors.New("mounting FUSE needs root (CAP_SYS_ADMIN): run the tests as root, as the worker runs privileged")
	}
	if _, err := os.Stat("/dev/fuse"); err != nil {
		return fmt.Errorf("mounting FUSE needs /dev/fuse: %w", err)
	}
	return nil
}

// Require skips tb when FUSE file systems cannot be mounted (fails it where tests must run:
// see testenv).
func Require(tb testing.TB) {
	tb.Helper()
	if err := Available(); err != nil {
		testenv.Lacking(tb, err.Error())
	}
}

// MemoryFolder is a folder on /dev/shm for a benchmark's tiers, staging and mounts (FUSE is
// required), removed at its end: the tiers of a node's memory, as a worker's MEM tier is.
func MemoryFolder(tb testing.TB) string {
	tb.Helper()
	Require(tb)
	base, err := os.MkdirTemp("/dev/shm", "strata-bench-")
	if err != nil {
		testenv.Lacking(tb, fmt.Sprint("needs /dev/shm: ", err))
	}
	tb.Cleanup(func() { _ = os.RemoveAll(base) })
	return base
}

// ReadRest reads r to its end in the background and sends what it read, once: how a test holds
// a read open across something that stops the file system for a while. A read error fails the
// test, naming across what it was read.
func ReadRest(tb testing.TB, r io.Reader, across string) <-chan []byte {
	rest := make(chan []byte, 1)
	go func() {
		b, err := io.ReadAll(r)
		if err != nil {
			tb.Errorf("reading on across %s: %v", across, err)
		}
		rest <- b
	}()
	return rest
}

// StartChild runs the test binary again with env set (NAME=VALUE), as a process that serves a
// mount until the test kills it, and waits for it to print "ready". The child is killed when
// the test ends.
func StartChild(tb testing.TB, env string) *exec.Cmd {
	tb.Helper()
	child := exec.Command(os.Args[0], "-test.run=^$")
	child.Env = append(os.Environ(), env)
	child.Stderr = os.Stderr
	out, err := child.StdoutPipe()
	if err != nil {
		tb.Fatal(err)
	}
	if err := child.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = child.Process.Kill(); _ = child.Wait() })
	line, err := bufio.NewReader(out).ReadString('\n')
	if err != nil || line != "ready\n" {
		tb.Fatalf("the child serving the mount did not get ready: %q, %v", line, err)
	}
	return child
}

// ChildReady is the end of a child's start (see StartChild): it puts the files of its mount's
// handover in the file descriptor store at sock, under "mount", and says it is ready.
func ChildReady(sock string, files []*os.File) error {
	c, err := fdstore.NewClient(sock, "test")
	if err != nil {
		return err
	}
	if err := c.Put(context.Background(), "mount", nil, files); err != nil {
		return err
	}
	_, err = os.Stdout.WriteString("ready\n")
	return err
}

// ReadDroppedEachLoop reads the file at p, of size bytes, whole on every iteration of b, its
// pages dropped from the page cache first, so that every byte is a FUSE read.
func ReadDroppedEachLoop(b *testing.B, p string, size int64) {
	buf := make([]byte, 1<<20)
	b.SetBytes(size)
	for b.Loop() {
		f, err := os.Open(p)
		if err != nil {
			b.Fatal(err)
		}
		if err := unix.Fadvise(int(f.Fd()), 0, 0, unix.FADV_DONTNEED); err != nil {
			b.Fatal(err)
		}
		n, err := io.CopyBuffer(io.Discard, struct{ io.Reader }{f}, buf)
		if err != nil || n != size {
			b.Fatalf("read %d bytes: %v", n, err)
		}
		_ = f.Close()
	}
}

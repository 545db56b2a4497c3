// Package fusetest tells tests whether they may mount FUSE file systems here: as root (the
// worker runs privileged) with /dev/fuse. CI runs as root, so the tests that need FUSE run there.
package fusetest

import (
	"errors"
	"fmt"
	"io"
	"os"
	"testing"
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

// Require skips tb when FUSE file systems cannot be mounted.
func Require(tb testing.TB) {
	tb.Helper()
	if err := Available(); err != nil {
		tb.Skip(err.Error())
	}
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

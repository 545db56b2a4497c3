// Package fdstoretest runs a file descriptor store for tests, on a socket of its own that is
// gone when the test ends.
package fdstoretest

import (
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"

	"github.com/strata-cache/strata/internal/fdstore"
)

// Start serves an empty store on a socket in a temporary folder and returns it with the
// socket's path. It stops when the test ends.
func Start(tb testing.TB) (*fdstore.Server, string) {
	tb.Helper()
	path := filepath.Join(tb.TempDir(), "fdstore.sock")
	s := fdstore.NewServer(logr.Discard())
	if err := s.Start(path); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = s.Stop(); s.Close() })
	return s, path
}

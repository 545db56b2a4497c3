// Package durable makes changes to files survive a crash of the machine: a file replaced whole
// (a reader sees the old content or the new, never a mix, also after a power loss) and a rename
// made durable by syncing the folder that holds it.
package durable

import (
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
)

// SyncDir makes the renames, creations and removals in dir durable: they live in the folder,
// which a sync of the files in it does not write.
func SyncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return fmt.Errorf("opening folder %s to sync it: %w", dir, err)
	}
	defer func() { _ = d.Close() }() // opened read-only: the sync is what matters
	if err := d.Sync(); err != nil {
		return fmt.Errorf("syncing folder %s: %w", dir, err)
	}
	return nil
}

// ReplaceFile replaces path with data and mode perm. The data goes to a temporary file in the same
// folder (the same file system, so the rename is atomic), named "."+base+".*.tmp" so that a reader
// of the folder can tell it from the real one, which is synced and renamed over path, and the
// folder synced. The folder must exist.
func ReplaceFile(path string, data []byte, perm fs.FileMode) (err error) {
	dir := filepath.Dir(path)
	tmp, err := os.CreateTemp(dir, "."+filepath.Base(path)+".*.tmp")
	if err != nil {
		return fmt.Errorf("creating a temporary file in %s: %w", dir, err)
	}
	defer func() {
		if err != nil {
			_ = tmp.Close()
			_ = os.Remove(tmp.Name())
		}
	}()
	if _, err := tmp.Write(data); err != nil {
		return fmt.Errorf("writing %s: %w", tmp.Name(), err)
	}
	// CreateTemp makes the file 0600, whatever the umask.
	if err := tmp.Chmod(perm); err != nil {
		return fmt.Errorf("setting the mode of %s: %w", tmp.Name(), err)
	}
	if err := tmp.Sync(); err != nil {
		return fmt.Errorf("syncing %s: %w", tmp.Name(), err)
	}
	if err := tmp.Close(); err != nil {
		return fmt.Errorf("closing %s: %w", tmp.Name(), err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		return fmt.Errorf("renaming %s to %s: %w", tmp.Name(), path, err)
	}
	// The rename lives in the folder: without a sync of it a crash could bring the old file back.
	return SyncDir(dir)
}

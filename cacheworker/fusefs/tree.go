package fusefs

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/go-logr/logr"
)

// maxNameLen is the longest name a Linux file system may hold (NAME_MAX).
const maxNameLen = 255

// entry is a node of the tree built from a listing, before it becomes inodes.
type entry struct {
	// children is non-nil for folders.
	children map[string]*entry
	size     int64
	mtime    time.Time
}

func (e *entry) isDir() bool { return e.children != nil }

// tree is a Dataset's folder tree, built once from its listing.
type tree struct {
	root  *entry
	files int
	bytes int64
}

// buildTree lists every object of objects and arranges them in folders by their keys split
// on "/". A key ending in "/" is a folder marker: the folder exists even if empty. Keys that
// cannot be file names (empty, "." or ".." elements, longer than NAME_MAX, a NUL) are left
// out and logged, as is an object whose key is also a folder of other objects ("a" next to
// "a/b"): S3 allows both, a file system cannot show both, and the folder holds more.
func buildTree(ctx context.Context, objects Lister, log logr.Logger) (*tree, error) {
	t := &tree{root: &entry{children: map[string]*entry{}}}
	for info, err := range objects.List(ctx, "") {
		if err != nil {
			return nil, fmt.Errorf("listing the objects: %w", err)
		}
		key, marker := strings.CutSuffix(info.Path, "/")
		if key == "" {
			continue // a marker of the root itself
		}
		parts := strings.Split(key, "/")
		if bad := badName(parts); bad != "" {
			log.Info("leaving out an object whose key is not a valid path", "key", info.Path, "reason", bad)
			continue
		}
		if !marker && info.Size < 0 {
			log.Info("leaving out an object of unknown size", "key", info.Path)
			continue
		}
		dir := t.root
		for _, p := range parts[:len(parts)-1] {
			dir = t.folder(dir, p, key, log)
		}
		name := parts[len(parts)-1]
		if marker {
			d := t.folder(dir, name, key, log)
			d.mtime = later(d.mtime, info.ModTime)
			continue
		}
		if old, ok := dir.children[name]; ok {
			if old.isDir() {
				log.Info("leaving out an object hidden by a folder of the same name", "key", info.Path)
				continue
			}
			t.files--
			t.bytes -= old.size
		}
		dir.children[name] = &entry{size: info.Size, mtime: info.ModTime}
		t.files++
		t.bytes += info.Size
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("listing the objects: %w", err)
	}
	setFolderTimes(t.root)
	return t, nil
}

// folder returns the folder name in dir, making it if needed. A file of that name gives way.
func (t *tree) folder(dir *entry, name, key string, log logr.Logger) *entry {
	if e, ok := dir.children[name]; ok {
		if e.isDir() {
			return e
		}
		log.Info("an object is hidden by a folder of the same name", "folder", name, "under", key)
		t.files--
		t.bytes -= e.size
	}
	e := &entry{children: map[string]*entry{}}
	dir.children[name] = e
	return e
}

// badName says why a key split into parts cannot be a path, or "" if it can.
func badName(parts []string) string {
	for _, p := range parts {
		switch {
		case p == "":
			return "an empty element (two slashes in a row, or a leading slash)"
		case p == "." || p == "..":
			return "a '.' or '..' element"
		case len(p) > maxNameLen:
			return fmt.Sprintf("an element longer than %d bytes", maxNameLen)
		case strings.ContainsRune(p, 0):
			return "a NUL byte"
		}
	}
	return ""
}

// setFolderTimes gives every folder the newest time of what it holds (or of its marker, if
// newer), so that a folder's mtime says when its content last changed, as it would on disk.
func setFolderTimes(e *entry) time.Time {
	for _, c := range e.children {
		if c.isDir() {
			e.mtime = later(e.mtime, setFolderTimes(c))
		} else {
			e.mtime = later(e.mtime, c.mtime)
		}
	}
	return e.mtime
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

// sortedNames returns the names of a folder in order, so that inode numbers are the same
// for the same listing.
func sortedNames(e *entry) []string {
	names := make([]string, 0, len(e.children))
	for n := range e.children {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

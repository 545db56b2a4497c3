// Package objtree arranges a Dataset's objects in the folder tree that its mounts show, by
// their keys split on "/", and says which objects the tree leaves out and why: keys that cannot
// be paths, objects of unknown size, and an object whose key is also a folder of others ("a"
// next to "a/b", which S3 allows and a file system cannot show). The workers mount the tree
// (fusefs), and the operator builds the same one from its listing of the source, so that the
// Dataset's status counts what its mounts serve and names what they leave out.
package objtree

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/strata-cache/strata/cacheworker/understore"
)

// MaxNameLen is the longest name a Linux file system may hold (NAME_MAX).
const MaxNameLen = 255

// Entry is a folder or a file of the tree.
type Entry struct {
	// Children is non-nil for folders.
	Children map[string]*Entry
	Size     int64
	// MTime is a file's modification time, and a folder's newest of what it holds.
	MTime time.Time
	// ETag is a file's version as listed (understore.ObjectInfo.ETag).
	ETag string
}

// IsDir says whether e is a folder.
func (e *Entry) IsDir() bool { return e.Children != nil }

// SortedNames are the names in folder e in order, so that the same listing always numbers its
// nodes alike.
func (e *Entry) SortedNames() []string {
	names := make([]string, 0, len(e.Children))
	for n := range e.Children {
		names = append(names, n)
	}
	slices.Sort(names)
	return names
}

// LeftOut is an object the tree does not show.
type LeftOut struct {
	Key    string
	Reason string
}

// Tree is a Dataset's folder tree.
type Tree struct {
	Root *Entry
	// Files and Bytes count the files the tree shows.
	Files int
	Bytes int64
	// LeftOut are the objects it does not show, in the order they were met.
	LeftOut []LeftOut
}

// New returns an empty tree; Add puts objects in it, and Done finishes it.
func New() *Tree {
	return &Tree{Root: &Entry{Children: map[string]*Entry{}}}
}

// The reasons an object is left out.
const (
	ReasonUnknownSize    = "its size is unknown"
	ReasonHiddenByFolder = "a folder of the same name holds other objects"
)

// Add puts the object info in the tree. A key ending in "/" is a folder marker: the folder
// exists even if empty. A file that meets a folder of its name gives way to it.
func (t *Tree) Add(info understore.ObjectInfo) {
	key, marker := strings.CutSuffix(info.Path, "/")
	if key == "" {
		return // a marker of the root itself
	}
	parts := strings.Split(key, "/")
	if bad := badName(parts); bad != "" {
		t.leaveOut(info.Path, "its key is not a valid path: "+bad)
		return
	}
	if !marker && info.Size < 0 {
		t.leaveOut(info.Path, ReasonUnknownSize)
		return
	}
	dir := t.Root
	for i, p := range parts[:len(parts)-1] {
		dir = t.folder(dir, p, strings.Join(parts[:i+1], "/"))
	}
	name := parts[len(parts)-1]
	if marker {
		d := t.folder(dir, name, key)
		d.MTime = later(d.MTime, info.ModTime)
		return
	}
	if old, ok := dir.Children[name]; ok {
		if old.IsDir() {
			t.leaveOut(info.Path, ReasonHiddenByFolder)
			return
		}
		t.Files--
		t.Bytes -= old.Size
	}
	dir.Children[name] = &Entry{Size: info.Size, MTime: info.ModTime, ETag: info.ETag}
	t.Files++
	t.Bytes += info.Size
}

// Done gives every folder the newest time of what it holds (or of its marker, if newer), so
// that a folder's mtime says when its content last changed, as it would on disk.
func (t *Tree) Done() { setFolderTimes(t.Root) }

func (t *Tree) leaveOut(key, reason string) {
	t.LeftOut = append(t.LeftOut, LeftOut{Key: key, Reason: reason})
}

// folder returns the folder name in dir, whose key is key, making it if needed. A file of that
// name gives way.
func (t *Tree) folder(dir *Entry, name, key string) *Entry {
	if e, ok := dir.Children[name]; ok {
		if e.IsDir() {
			return e
		}
		t.leaveOut(key, ReasonHiddenByFolder)
		t.Files--
		t.Bytes -= e.Size
	}
	e := &Entry{Children: map[string]*Entry{}}
	dir.Children[name] = e
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
		case len(p) > MaxNameLen:
			return fmt.Sprintf("an element longer than %d bytes", MaxNameLen)
		case strings.ContainsRune(p, 0):
			return "a NUL byte"
		}
	}
	return ""
}

func setFolderTimes(e *Entry) time.Time {
	for _, c := range e.Children {
		if c.IsDir() {
			e.MTime = later(e.MTime, setFolderTimes(c))
		} else {
			e.MTime = later(e.MTime, c.MTime)
		}
	}
	return e.MTime
}

func later(a, b time.Time) time.Time {
	if b.After(a) {
		return b
	}
	return a
}

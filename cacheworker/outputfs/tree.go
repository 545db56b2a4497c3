package outputfs

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// rootID is the FUSE node id of the mount's root.
const rootID = fuse.FUSE_ROOT_ID

// node is a file or a folder of the mount. Its id is its FUSE node id and inode number. Ids
// are never reused and nodes never forgotten (FORGET is ignored), so that a process taking the
// mount over knows every id the kernel may still name; a removed node only leaves the tree.
//
// Locks: the tree's lock guards every node's place (parent, name, children), and is never
// held across a call to the master; a node's own lock guards its state and is held across a
// seal. A node's lock may be taken before the tree's, never after.
type node struct {
	id  uint64
	dir bool

	// Guarded by tree.mu.
	parent   uint64 // 0 once removed from the tree
	name     string
	children map[string]*node // a folder's

	// sealed mirrors state.Sealed, for the tree's walks, which may not take the node's lock.
	sealed atomic.Bool

	mu    sync.Mutex
	state nodeState
	// staged holds a file's bytes until it is sealed; nil once sealed or discarded.
	staged *stagedFile
	// size is a file's size: the sealed size, or the staging file's.
	size int64
	// inherited: an earlier process staged this file, and may have begun sealing it.
	inherited bool
	// waitedInVain is the token of the lost version a read waited for until its wait ran out:
	// the reads that follow (the kernel tries a failed read again at once) do not wait again.
	waitedInVain string
	// forgottenAs is the path of a sealed file the master forgot, taken out of the tree so that
	// its new version is a new node: readers that hold this one wait for that path.
	forgottenAs string
}

// tree is a mount's nodes, recorded in its journal as they change.
type tree struct {
	mu     sync.RWMutex
	nodes  map[uint64]*node
	nextID uint64
	j      *journal
	// done maps the requests an earlier process recorded to the node each made or changed,
	// so that a resent request is answered without making its change twice.
	done map[uint64]uint64
}

// get returns the node of id, or nil.
func (t *tree) get(id uint64) *node {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.nodes[id]
}

// child returns name in dir, or nil.
func (t *tree) child(dir *node, name string) *node {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return dir.children[name]
}

// rel is n's path in the Dataset ("" for the root, and for a node no longer in the tree).
func (t *tree) rel(n *node) string {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return t.relLocked(n)
}

func (t *tree) relLocked(n *node) string {
	var parts []string
	for n != nil && n.id != rootID {
		if n.parent == 0 {
			return ""
		}
		parts = append(parts, n.name)
		n = t.nodes[n.parent]
	}
	for i, j := 0, len(parts)-1; i < j; i, j = i+1, j-1 {
		parts[i], parts[j] = parts[j], parts[i]
	}
	return strings.Join(parts, "/")
}

// add makes a node named name in dir, with state st, unless dir has that name already: then
// it returns the node there and false. request is the FUSE request making it, or 0.
func (t *tree) add(dir *node, name string, isDir bool, st nodeState, staged *stagedFile, request uint64) (*node, bool, error) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if existing := dir.children[name]; existing != nil {
		return existing, false, nil
	}
	if dir.parent == 0 && dir.id != rootID {
		return nil, false, syscall.ENOENT // the folder was removed meanwhile
	}
	n := &node{id: t.nextID, dir: isDir, parent: dir.id, name: name, state: st, staged: staged, size: st.Size}
	if isDir {
		n.children = map[string]*node{}
	}
	n.sealed.Store(st.Sealed)
	if err := t.j.append(record{Kind: recAdd, Request: request, ID: n.id, Parent: dir.id, Name: name, Dir: isDir, State: &st}); err != nil {
		return nil, false, err
	}
	t.nextID++
	t.nodes[n.id] = n
	dir.children[name] = n
	return n, true, nil
}

// remove takes n out of the tree if it is still name in dir. request is the FUSE request
// removing it, or 0.
func (t *tree) remove(dir *node, name string, n *node, request uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if dir.children[name] != n {
		return nil
	}
	if err := t.j.append(record{Kind: recMove, Request: request, ID: n.id, Name: n.name}); err != nil {
		return err
	}
	delete(dir.children, name)
	n.parent = 0
	return nil
}

// move renames n to name in dir, taking the place of what was there (the caller removed it
// or made sure it may go).
func (t *tree) move(n, from *node, fromName string, to *node, toName string, request uint64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if from.children[fromName] != n {
		return syscall.ENOENT
	}
	if err := t.j.append(record{Kind: recMove, Request: request, ID: n.id, Parent: to.id, Name: toName}); err != nil {
		return err
	}
	if old := to.children[toName]; old != nil && old != n {
		old.parent = 0
	}
	delete(from.children, fromName)
	to.children[toName] = n
	n.parent, n.name = to.id, toName
	return nil
}

// save records n's state; n.mu is held. request is the FUSE request changing it, or 0.
func (t *tree) save(n *node, request uint64) error {
	st := n.state
	return t.j.append(record{Kind: recState, Request: request, ID: n.id, State: &st})
}

// parentOf is the id of n's folder (the root's own for the root).
func (t *tree) parentOf(n *node) uint64 {
	t.mu.RLock()
	defer t.mu.RUnlock()
	if n.parent == 0 {
		return n.id
	}
	return n.parent
}

// holdsSealed says whether n is a sealed file or a folder with one somewhere below.
func (t *tree) holdsSealed(n *node) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	var walk func(n *node) bool
	walk = func(n *node) bool {
		if !n.dir {
			return n.sealed.Load()
		}
		for _, c := range n.children {
			if walk(c) {
				return true
			}
		}
		return false
	}
	return walk(n)
}

// isEmpty says whether the folder n has no children.
func (t *tree) isEmpty(n *node) bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	return len(n.children) == 0
}

// newTree makes the tree of a new mount: its root, recorded after the mount record.
func newTree(j *journal, mount mountRecord, root nodeState) (*tree, error) {
	t := &tree{nodes: map[uint64]*node{}, nextID: rootID + 1, j: j}
	if err := j.append(record{Kind: recMount, Mount: &mount}); err != nil {
		return nil, err
	}
	if err := j.append(record{Kind: recAdd, ID: rootID, Dir: true, State: &root}); err != nil {
		return nil, err
	}
	t.nodes[rootID] = &node{id: rootID, dir: true, children: map[string]*node{}, state: root}
	return t, nil
}

// replay rebuilds a tree from the records of an earlier process, reopening the staging files
// of the files still being written.
func replay(j *journal, records []record, stagingDir string, blockSize int64, stored func(id string, length int64) string) (*tree, error) {
	// The requests the records name are those readJournal found: the journal's inherited.
	t := &tree{nodes: map[uint64]*node{}, nextID: rootID + 1, j: j, done: j.inherited}
	for i, r := range records[1:] {
		switch r.Kind {
		case recAdd:
			if r.State == nil || t.nodes[r.ID] != nil {
				return nil, fmt.Errorf("journal record %d adds node %d again, or without its state", i+1, r.ID)
			}
			n := &node{id: r.ID, dir: r.Dir, parent: r.Parent, name: r.Name, state: *r.State}
			if r.Dir {
				n.children = map[string]*node{}
			}
			if r.ID != rootID && r.Parent != 0 { // parent 0: detached, placed by a move (compaction)
				parent := t.nodes[r.Parent]
				if parent == nil || !parent.dir {
					return nil, fmt.Errorf("journal record %d adds node %d to %d, which is no folder", i+1, r.ID, r.Parent)
				}
				parent.children[r.Name] = n
			}
			t.nodes[r.ID] = n
			t.nextID = max(t.nextID, r.ID+1)
		case recMove:
			n := t.nodes[r.ID]
			if n == nil {
				return nil, fmt.Errorf("journal record %d moves node %d, which it never added", i+1, r.ID)
			}
			if old := t.nodes[n.parent]; old != nil && old.children[n.name] == n {
				delete(old.children, n.name)
			}
			n.parent, n.name = r.Parent, r.Name
			if r.Parent != 0 {
				to := t.nodes[r.Parent]
				if to == nil || !to.dir {
					return nil, fmt.Errorf("journal record %d moves node %d into %d, which is no folder", i+1, r.ID, r.Parent)
				}
				if old := to.children[r.Name]; old != nil {
					old.parent = 0
				}
				to.children[r.Name] = n
			}
		case recState:
			n := t.nodes[r.ID]
			if n == nil || r.State == nil {
				return nil, fmt.Errorf("journal record %d changes node %d, which it never added", i+1, r.ID)
			}
			n.state = *r.State
		case recStart, recMount, recDone:
		default:
			return nil, fmt.Errorf("journal record %d is of unknown kind %q", i+1, r.Kind)
		}
	}
	if t.nodes[rootID] == nil {
		return nil, errors.New("the output mount's journal has no root")
	}
	staging, err := readStagingFolder(stagingDir, blockSize, stored)
	if err != nil {
		return nil, err
	}
	for _, n := range t.nodes {
		n.sealed.Store(n.state.Sealed)
		if err := t.reopen(n, staging); err != nil {
			return nil, err
		}
	}
	return t, nil
}

// reopen gives a replayed file its bytes: a sealed file's size is recorded; a staged one's
// bytes, size and mtime are its staging files' in staging, unless nobody will ever seal it.
func (t *tree) reopen(n *node, staging stagingFolder) error {
	switch {
	case n.dir:
		return nil
	case n.state.Sealed:
		n.size = n.state.Size
		return nil
	case n.parent == 0 && n.state.Writers == 0:
		return nil // removed, and no writer left to close it: discarded
	}
	if len(staging.names[n.state.Token]) == 0 && n.state.Unlinked {
		return nil
	}
	staged, mtime, err := openStaged(staging, n.state.Token)
	if err != nil {
		return fmt.Errorf("reopening the staged bytes of %s: %w", n.name, err)
	}
	n.staged, n.size, n.inherited = staged, staged.Size(), true
	n.state.MtimeNs = mtime.UnixNano()
	return nil
}

// stagedTokens is the tokens of the files whose staging files the tree still needs.
func (t *tree) stagedTokens() map[string]bool {
	t.mu.RLock()
	defer t.mu.RUnlock()
	keep := map[string]bool{}
	for _, n := range t.nodes {
		if n.staged != nil {
			keep[n.staged.token] = true
		}
	}
	return keep
}

// fillAttr fills out with n's attributes; n.mu is held.
func (n *node) fillAttr(out *fuse.Attr) {
	st := &n.state
	mtime := time.Unix(0, st.MtimeNs)
	*out = fuse.Attr{Ino: n.id, Blksize: 1 << 20, Owner: fuse.Owner{Uid: st.UID, Gid: st.GID}}
	out.SetTimes(&mtime, &mtime, &mtime)
	if n.dir {
		out.Mode = syscall.S_IFDIR | st.Mode
		out.Nlink = 2
		return
	}
	out.Mode = syscall.S_IFREG | st.Mode
	out.Nlink = 1
	out.Size = uint64(n.size)
	out.Blocks = uint64((n.size + 511) / 512)
}

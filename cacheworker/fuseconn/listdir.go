package fuseconn

import (
	"syscall"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Entry is one name in a folder listing.
type Entry struct {
	Name string
	ID   uint64 // the node id, which is also the inode number
	Dir  bool
}

// ListDir answers a READDIR of the folder self, whose parent is parent, from position offset:
// "." and ".." first, then count entries in order, entry(i) giving the i-th. With fill set it
// answers a READDIRPLUS, each entry carrying the lookup answer fill gives for its id (the
// kernel ignores it for the dot entries). It stops when the kernel's buffer is full; the next
// READDIR goes on from there.
func ListDir(out *fuse.DirEntryList, offset, self, parent uint64, count int, entry func(i int) Entry, fill func(id uint64, out *fuse.EntryOut)) {
	for pos := offset; pos < uint64(count)+2; pos++ {
		e := fuse.DirEntry{Mode: syscall.S_IFDIR, Off: pos + 1}
		var id uint64
		switch pos {
		case 0:
			e.Name, e.Ino = ".", self
		case 1:
			e.Name, e.Ino = "..", parent
		default:
			de := entry(int(pos - 2))
			id = de.ID
			e.Name, e.Ino = de.Name, de.ID
			if !de.Dir {
				e.Mode = syscall.S_IFREG
			}
		}
		if fill == nil {
			if !out.AddDirEntry(e) {
				return
			}
			continue
		}
		lookup := out.AddDirLookupEntry(e)
		if lookup == nil {
			return
		}
		if id != 0 {
			fill(id, lookup)
		}
	}
}

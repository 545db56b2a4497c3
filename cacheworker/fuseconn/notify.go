package fuseconn

import (
	"errors"
	"fmt"
	"syscall"
	"unsafe"

	"github.com/hanwen/go-fuse/v2/fuse"
)

// Notification codes of linux/fuse.h: a message the server writes to /dev/fuse unasked, its
// code in the header's error field and a unique id of 0.
const (
	notifyInvalInode = 2
	notifyInvalEntry = 3
)

// invalInodeOut is struct fuse_notify_inval_inode_out.
type invalInodeOut struct {
	ino    uint64
	offset int64
	length int64
}

// invalEntryOut is struct fuse_notify_inval_entry_out; the name and a NUL follow it.
type invalEntryOut struct {
	parent  uint64
	nameLen uint32
	flags   uint32
}

// InvalidateEntry tells the kernel to forget what it cached of name in folder parent: the
// node it leads to, or that it does not exist. The next lookup of the name asks the server.
// A name the kernel holds nothing of is not an error.
//
// The kernel takes the folder's lock to do so, so this must not be called while answering a
// request of the same connection, nor while holding anything such a request waits for.
func (c *Conn) InvalidateEntry(parent uint64, name string) error {
	body := invalEntryOut{parent: parent, nameLen: uint32(len(name))}
	msg := make([]byte, 0, int(unsafe.Sizeof(fuse.OutHeader{}))+int(unsafe.Sizeof(body))+len(name)+1)
	msg = appendNotification(msg, notifyInvalEntry, unsafe.Slice((*byte)(unsafe.Pointer(&body)), unsafe.Sizeof(body)), []byte(name), []byte{0})
	return c.notify(msg, fmt.Sprintf("name %q of node %d", name, parent))
}

// InvalidateInode tells the kernel to forget the attributes of node ino and the pages it
// cached of its content (for a folder, the listing it kept with FOPEN_CACHE_DIR). A node the
// kernel holds nothing of is not an error.
func (c *Conn) InvalidateInode(ino uint64) error {
	body := invalInodeOut{ino: ino} // offset 0 and length 0: every page
	msg := make([]byte, 0, int(unsafe.Sizeof(fuse.OutHeader{}))+int(unsafe.Sizeof(body)))
	msg = appendNotification(msg, notifyInvalInode, unsafe.Slice((*byte)(unsafe.Pointer(&body)), unsafe.Sizeof(body)))
	return c.notify(msg, fmt.Sprintf("node %d", ino))
}

// appendNotification appends a notification's header, for a message of the given parts, and
// the parts.
func appendNotification(msg []byte, code int32, parts ...[]byte) []byte {
	h := fuse.OutHeader{Length: uint32(unsafe.Sizeof(fuse.OutHeader{})), Status: code}
	for _, p := range parts {
		h.Length += uint32(len(p))
	}
	msg = append(msg, unsafe.Slice((*byte)(unsafe.Pointer(&h)), unsafe.Sizeof(h))...)
	for _, p := range parts {
		msg = append(msg, p...)
	}
	return msg
}

// notify writes a notification. ENOENT means the kernel caches nothing of what it names.
func (c *Conn) notify(msg []byte, what string) error {
	if _, err := c.file.Write(msg); err != nil && !errors.Is(err, syscall.ENOENT) {
		return fmt.Errorf("telling the kernel that %s changed: %w", what, err)
	}
	return nil
}

package fsm

import (
	"encoding/binary"
	"path"
	"strings"
)

// The key space. Each kind of record has a one-letter prefix so that Snapshot can stream the
// whole database and lists can scan one kind.
const (
	prefixMeta        = "m/"
	prefixDataset     = "d/"
	prefixFile        = "f/" // f/<absolute path>
	prefixFileID      = "i/" // i/<file id, big endian> -> path
	prefixBlock       = "b/" // b/<block id, big endian>
	prefixWorker      = "w/"
	prefixWorkerBlock = "x/" // x/<worker>\x00<block id> -> "", live copies only
	prefixPeer        = "p/"
)

var (
	keyApplied    = []byte(prefixMeta + "applied")
	keyNextFileID = []byte(prefixMeta + "next-file-id")
	// keyRestoredFrom names the backup the state was restored from (SnapshotInfo.ID).
	keyRestoredFrom = []byte(prefixMeta + "restored-from")
)

// Limits that keep one command inside one Badger transaction (see MemTableSize). They are
// constants, not options, because replicas must agree on every outcome.
const (
	// MaxBlocksPerFile bounds a file so that deleting it fits one transaction.
	MaxBlocksPerFile = 4096
	// MaxSealBlocks bounds the blocks of a file sealed in one command (SealFile), whose
	// transaction rewrites the file's record once per block.
	MaxSealBlocks = 64
	// MaxLocationsPerBlock bounds the copies of a block, for the same reason.
	MaxLocationsPerBlock = 8
	// MaxPathLength bounds a path, as PATH_MAX does on Linux.
	MaxPathLength = 4096
	// maxIDLength bounds worker, dataset and peer names; DNS names are shorter.
	maxIDLength = 253
)

func u64(v uint64) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], v)
	return b[:]
}

func datasetKey(name string) []byte { return []byte(prefixDataset + name) }
func fileKey(p string) []byte       { return []byte(prefixFile + p) }
func fileIDKey(id uint64) []byte    { return append([]byte(prefixFileID), u64(id)...) }
func blockKey(id uint64) []byte     { return append([]byte(prefixBlock), u64(id)...) }
func workerKey(id string) []byte    { return []byte(prefixWorker + id) }
func peerKey(id string) []byte      { return []byte(prefixPeer + id) }

func workerBlockPrefix(worker string) []byte { return []byte(prefixWorkerBlock + worker + "\x00") }
func workerBlockKey(worker string, block uint64) []byte {
	return append(workerBlockPrefix(worker), u64(block)...)
}

// dirPrefix is the key prefix of everything below directory dir.
func dirPrefix(dir string) []byte {
	if dir == "/" {
		return []byte(prefixFile + "/")
	}
	return []byte(prefixFile + dir + "/")
}

// validPath accepts absolute, clean paths other than the root.
func validPath(p string) error {
	switch {
	case p == "":
		return invalid("empty path")
	case len(p) > MaxPathLength:
		return invalid("path longer than %d bytes", MaxPathLength)
	case !strings.HasPrefix(p, "/"):
		return invalid("path %q is not absolute", p)
	case p == "/":
		return invalid("the root is a directory, not a file")
	case path.Clean(p) != p:
		return invalid("path %q is not clean (want %q)", p, path.Clean(p))
	case strings.ContainsRune(p, 0):
		return invalid("path %q contains a NUL byte", p)
	}
	return nil
}

// validDir accepts "/" and what validPath accepts.
func validDir(dir string) error {
	if dir == "/" {
		return nil
	}
	return validPath(dir)
}

// validID accepts names of workers, datasets and peers.
func validID(what, id string) error {
	switch {
	case id == "":
		return invalid("empty %s", what)
	case len(id) > maxIDLength:
		return invalid("%s longer than %d bytes", what, maxIDLength)
	case strings.ContainsRune(id, 0):
		return invalid("%s %q contains a NUL byte", what, id)
	}
	return nil
}

// under reports whether p is strictly below directory root.
func under(p, root string) bool {
	if root == "/" {
		return p != "/"
	}
	return strings.HasPrefix(p, root+"/")
}

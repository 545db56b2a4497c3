package blockindex

import (
	"errors"
	"fmt"
	"hash"
	"hash/crc32"
	"path/filepath"
	"strconv"
	"strings"
)

// TempPrefix starts the name of every file that is still being written. Block ids may not
// start with a dot, so a temporary file is never mistaken for a block.
const TempPrefix = ".tmp-"

// MaxIDLength bounds block ids so that an id plus the temporary-file affixes stays well under
// the 255-byte file-name limit of the usual Linux file systems.
const MaxIDLength = 200

// ErrInvalidID is returned for a block id that could not be used as a file name safely.
var ErrInvalidID = errors.New("invalid block id")

// ValidateID checks that id can be used as a file name inside a tier directory and nothing
// else: letters, digits, '-', '_' and '.', not starting with '.', at most MaxIDLength bytes.
// Separators, "..", NUL and the like never reach the file system.
func ValidateID(id string) error {
	if id == "" {
		return fmt.Errorf("%w: empty", ErrInvalidID)
	}
	if len(id) > MaxIDLength {
		return fmt.Errorf("%w: %d bytes, at most %d allowed", ErrInvalidID, len(id), MaxIDLength)
	}
	if id[0] == '.' {
		return fmt.Errorf("%w %q: must not start with '.'", ErrInvalidID, id)
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '-', c == '_', c == '.':
		default:
			return fmt.Errorf("%w %q: byte %q at %d; only letters, digits, '-', '_' and '.' are allowed", ErrInvalidID, id, c, i)
		}
	}
	return nil
}

// OutputBlockID names block index of an output file whose version's token is token (written
// through an output mount): a file's blocks are found by their ids from its token.
func OutputBlockID(token string, index int64) string {
	return token + "-" + strconv.FormatInt(index, 10)
}

// BlockPath is where block id lives in dir. The id must have passed ValidateID.
func BlockPath(dir, id string) string { return filepath.Join(dir, id) }

// IsTempName reports whether a file name is a temporary file of this layout.
func IsTempName(name string) bool { return strings.HasPrefix(name, TempPrefix) }

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// NewHash returns the checksum every block is stored with: CRC-32C, which x86 and arm64 compute
// in hardware, so verifying a block costs far less than reading it.
func NewHash() hash.Hash32 { return crc32.New(castagnoli) }

// Checksum is the CRC-32C of b.
func Checksum(b []byte) uint32 { return crc32.Checksum(b, castagnoli) }

// UpdateChecksum is the CRC-32C of bytes whose first part had sum crc, followed by b.
func UpdateChecksum(crc uint32, b []byte) uint32 { return crc32.Update(crc, castagnoli, b) }

package tierstore

import (
	"errors"
	"fmt"
)

// Sentinel errors that callers act on; test for them with errors.Is.
var (
	// ErrNotFound: the store holds no block of that id.
	ErrNotFound = errors.New("block not found")
	// ErrExists: a block of that id is stored or being stored; blocks are immutable.
	ErrExists = errors.New("block already exists")
	// ErrTierFull: no room could be made in a tier without losing data. The error is a
	// *TierFullError that says which tier and why.
	ErrTierFull = errors.New("tier full")
	// ErrCorrupt: a block's bytes do not match its checksum. The block has been removed.
	ErrCorrupt = errors.New("block corrupt")
	// ErrClosed: the store has been closed.
	ErrClosed = errors.New("tier store closed")
)

// errGone is what a move or drop finds when the block was deleted while it worked on it: the
// space it wanted is free anyway, so the caller carries on.
var errGone = errors.New("block deleted meanwhile")

// TierFullError says why a tier could not take Need more bytes.
type TierFullError struct {
	// Tier is the tier's name.
	Tier string
	// Need is the number of bytes asked for.
	Need int64
	// Used and Quota are the tier's bytes in use (reservations included) and its quota.
	Used, Quota int64
	// Reason says why nothing (more) could be freed.
	Reason string
}

func (e *TierFullError) Error() string {
	return fmt.Sprintf("tier %s full: %d bytes needed, %d of %d in use: %s", e.Tier, e.Need, e.Used, e.Quota, e.Reason)
}

// Unwrap makes errors.Is(err, ErrTierFull) true.
func (e *TierFullError) Unwrap() error { return ErrTierFull }

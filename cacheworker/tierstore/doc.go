// Package tierstore keeps a worker's blocks on its tiers: directories of one medium each (MEM on
// tmpfs, PMEM, NVMe, SSD, HDD), fastest first, each with a quota and high/low watermarks.
//
// A block is a file named by its id in one of its tier's directories. New blocks go to the top
// tier. When a tier would pass its high watermark, the eviction policy picks blocks to move
// down a tier until it is back at the low watermark; the last tier (or any tier whose lower
// tiers are full) drops blocks instead, but only those a callback says are safe to drop, and
// only after a synchronous persist callback succeeded for the others. If no room can be made,
// the write fails with ErrTierFull and nothing is lost. Blocks read often in a lower tier are
// queued for promotion, which Run carries out in the background.
//
// Every write and move is atomic (temporary file, fsync, rename, directory fsync) and its
// BadgerDB index entry (see blockindex) is the commit point. Every block carries a CRC-32C,
// checked when the store starts, on every Get, and while a block is copied between tiers, so
// a corrupt block is removed and reported rather than served or propagated.
//
// See cacheworker/DESIGN.md for why the data path looks like this.
package tierstore

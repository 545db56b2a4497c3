// Package statefile keeps a small piece of state as a JSON file that survives a crash at any
// instant: a write goes to a temporary file in the same folder, is synced, and replaces the
// old file by rename, and the folder is synced so the rename itself is durable. A reader sees
// the old state or the new one, never a torn mix.
package statefile

package understore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"slices"
	"strings"
)

// Mounted is a store shown at a folder of a Union.
type Mounted struct {
	// Path is the folder, slash-separated and relative to the Union's root, such as
	// "raw/2024": one or more elements, none of them empty, "." or "..".
	Path  string
	Store Store
}

// Union shows several stores as one tree, each under its own folder (a Dataset's spec.mounts,
// as Alluxio's unified namespace does): the object k of the store mounted at folder f is f/k
// in the Union. No folder is inside another, so every path belongs to at most one store.
type Union struct {
	// mounts are sorted by path, so that List yields mount after mount in a stable order.
	mounts []Mounted
}

var _ Store = (*Union)(nil)

// MountError is a failure of one store of a Union: the folder it is mounted at, and its error
// (usually an *Error naming the store). errors.Is and errors.As see through it.
type MountError struct {
	Path string
	Err  error
}

func (e *MountError) Error() string { return fmt.Sprintf("mount /%s: %v", e.Path, e.Err) }

func (e *MountError) Unwrap() error { return e.Err }

// CheckMountLayout says what is wrong with a set of mount folders, if anything: a folder that
// is not a clean relative path, the root (which would hold every other), two mounts at one
// folder, or one inside another. Each would hide objects of one store behind another's.
func CheckMountLayout(paths []string) error {
	if len(paths) == 0 {
		return errors.New("no mounts")
	}
	sorted := slices.Clone(paths)
	slices.Sort(sorted)
	for i, p := range sorted {
		if p == "" {
			return errors.New("a mount at the root (/) would hold every other: give each mount a folder of its own, or use a single source")
		}
		if err := checkPath(p); err != nil {
			return fmt.Errorf("mount path /%s: %w", p, err)
		}
		if i == 0 {
			continue
		}
		// Sorted, a folder's descendants follow it, though not always at once ("a", "a-b",
		// "a/b"): compare with every earlier one that is a prefix.
		for _, q := range sorted[:i] {
			switch {
			case q == p:
				return fmt.Errorf("two mounts at /%s: give each its own folder", p)
			case strings.HasPrefix(p, q+"/"):
				return fmt.Errorf("mount /%s is inside mount /%s: mounts may not nest; move one beside the other", p, q)
			}
		}
	}
	return nil
}

// NewUnion returns the Union of mounts, or an error saying which layout is refused (see
// CheckMountLayout).
func NewUnion(mounts []Mounted) (*Union, error) {
	paths := make([]string, len(mounts))
	for i, m := range mounts {
		if m.Store == nil {
			return nil, fmt.Errorf("mount /%s has no store", m.Path)
		}
		paths[i] = m.Path
	}
	if err := CheckMountLayout(paths); err != nil {
		return nil, err
	}
	sorted := slices.Clone(mounts)
	slices.SortFunc(sorted, func(a, b Mounted) int { return strings.Compare(a.Path, b.Path) })
	return &Union{mounts: sorted}, nil
}

// route finds the store that holds p: the mount whose folder p lies in, and p within it.
func (u *Union) route(op, p string) (Mounted, string, error) {
	for _, m := range u.mounts {
		if rest, ok := strings.CutPrefix(p, m.Path+"/"); ok && rest != "" {
			return m, rest, nil
		}
	}
	return Mounted{}, "", &Error{Op: op, Store: u.String(), Path: p, Kind: ErrNotFound,
		Err: fmt.Errorf("no mount holds it: the mounts are %s", strings.Join(u.folders(), ", "))}
}

func (u *Union) folders() []string {
	out := make([]string, len(u.mounts))
	for i, m := range u.mounts {
		out[i] = "/" + m.Path
	}
	return out
}

func (m Mounted) fail(err error) error {
	if err == nil {
		return nil
	}
	return &MountError{Path: m.Path, Err: err}
}

// Stat implements Store.
func (u *Union) Stat(ctx context.Context, p string) (ObjectInfo, error) {
	m, rest, err := u.route("stat", p)
	if err != nil {
		return ObjectInfo{}, err
	}
	info, err := m.Store.Stat(ctx, rest)
	if err != nil {
		return ObjectInfo{}, m.fail(err)
	}
	info.Path = m.Path + "/" + info.Path
	return info, nil
}

// List implements Store: each mount's objects under prefix, mount after mount in the order of
// their folders, and the first error of any, naming its mount.
func (u *Union) List(ctx context.Context, prefix string) iter.Seq2[ObjectInfo, error] {
	return func(yield func(ObjectInfo, error) bool) {
		for _, m := range u.mounts {
			folder := m.Path + "/"
			var inner string
			switch {
			case strings.HasPrefix(folder, prefix):
				inner = "" // every object of the mount starts with prefix
			case strings.HasPrefix(prefix, folder):
				inner = prefix[len(folder):]
			default:
				continue
			}
			for info, err := range m.Store.List(ctx, inner) {
				if err != nil {
					yield(ObjectInfo{}, m.fail(err))
					return
				}
				info.Path = folder + info.Path
				if !yield(info, nil) {
					return
				}
			}
		}
	}
}

// ReadAt implements Store.
func (u *Union) ReadAt(ctx context.Context, p string, buf []byte, off int64) (int, error) {
	m, rest, err := u.route("read", p)
	if err != nil {
		return 0, err
	}
	n, err := m.Store.ReadAt(ctx, rest, buf, off)
	if errors.Is(err, io.EOF) {
		return n, err // io.EOF is not a failure: it must reach the caller as itself
	}
	return n, m.fail(err)
}

// ReadVersionAt implements Store.
func (u *Union) ReadVersionAt(ctx context.Context, p, etag string, buf []byte, off int64) (int, error) {
	m, rest, err := u.route("read", p)
	if err != nil {
		return 0, err
	}
	n, err := m.Store.ReadVersionAt(ctx, rest, etag, buf, off)
	if errors.Is(err, io.EOF) {
		return n, err
	}
	return n, m.fail(err)
}

// Open implements Store.
func (u *Union) Open(ctx context.Context, p string) (io.ReadCloser, error) {
	m, rest, err := u.route("open", p)
	if err != nil {
		return nil, err
	}
	r, err := m.Store.Open(ctx, rest)
	if err != nil {
		return nil, m.fail(err)
	}
	return r, nil
}

// Write implements Store.
func (u *Union) Write(ctx context.Context, p string, r io.Reader, size int64, pre Precondition) (string, error) {
	m, rest, err := u.route("write", p)
	if err != nil {
		return "", err
	}
	etag, err := m.Store.Write(ctx, rest, r, size, pre)
	return etag, m.fail(err)
}

// Close closes the stores that hold resources, and returns their errors joined.
func (u *Union) Close() error {
	var errs []error
	for _, m := range u.mounts {
		if c, ok := m.Store.(io.Closer); ok {
			if err := c.Close(); err != nil {
				errs = append(errs, m.fail(err))
			}
		}
	}
	return errors.Join(errs...)
}

// String names the Union by its mounts: "/raw=s3://bucket/raw, /ref=https://host/ref".
func (u *Union) String() string {
	parts := make([]string, len(u.mounts))
	for i, m := range u.mounts {
		parts[i] = "/" + m.Path + "=" + m.Store.String()
	}
	return strings.Join(parts, ", ")
}

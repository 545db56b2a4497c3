package understore

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"os"
	"path"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
)

// LocalConfig is a directory on the node (a host path or an NFS mount) served as an under-store.
type LocalConfig struct {
	// Dir is the store's root, an absolute path.
	Dir string
	// AllowedRoots are the directories under which Dir must lie, after symlinks are resolved
	// (the TierPool's fileSourceRoots). Empty allows nothing, so no tenant can read an
	// arbitrary host path by default.
	AllowedRoots []string
}

// Local is an under-store on a local or NFS path. Every access goes through an os.Root, which
// refuses any path that leaves Dir, by ".." or through a symlink, at the moment of the access:
// checking a path first and opening it afterwards would leave room to swap in a symlink.
type Local struct {
	dir  string
	root *os.Root
	name string
	// escapes is the error os.Root gives for a path that leaves the root. The standard
	// library does not export it, so NewLocal provokes it once to learn it.
	escapes error
	// landing holds a Write from its check of what it expects to its rename, so that the
	// writers of this process land one at a time (a path is a node's own directory, and one
	// worker writes it; writers on several hosts of one NFS share are not ordered).
	landing sync.Mutex
}

var _ Store = (*Local)(nil)

// NewLocal opens cfg.Dir if it lies under one of cfg.AllowedRoots.
func NewLocal(cfg LocalConfig) (*Local, error) {
	name := "file://" + cfg.Dir
	connectErr := func(kind, err error) error { return &Error{Op: "connect", Store: name, Kind: kind, Err: err} }
	if !filepath.IsAbs(cfg.Dir) {
		return nil, connectErr(ErrInvalidPath, fmt.Errorf("%q is not an absolute path", cfg.Dir))
	}
	real, err := filepath.EvalSymlinks(cfg.Dir)
	if err != nil {
		return nil, connectErr(localKind(err), err)
	}
	allowed := false
	for _, r := range cfg.AllowedRoots {
		rr, err := filepath.EvalSymlinks(r)
		if err == nil && within(rr, real) {
			allowed = true
			break
		}
	}
	if !allowed {
		return nil, connectErr(ErrOutsideRoots, fmt.Errorf("%s resolves to %s, which is under none of the allowed roots %v", cfg.Dir, real, cfg.AllowedRoots))
	}
	root, err := os.OpenRoot(real)
	if err != nil {
		return nil, connectErr(localKind(err), err)
	}
	l := &Local{dir: real, root: root, name: name}
	var pe *fs.PathError
	if _, err := root.Stat(".."); errors.As(err, &pe) {
		l.escapes = pe.Err
	}
	return l, nil
}

// within reports whether p is root or lies under it.
func within(root, p string) bool {
	rel, err := filepath.Rel(root, p)
	return err == nil && (rel == "." || filepath.IsLocal(rel))
}

// Close releases the root directory.
func (l *Local) Close() error { return l.root.Close() }

func (l *Local) String() string { return l.name }

func localKind(err error) error {
	switch {
	case errors.Is(err, fs.ErrNotExist):
		return ErrNotFound
	case errors.Is(err, fs.ErrPermission):
		return ErrAccessDenied
	case errors.Is(err, ErrOutsideRoots):
		return ErrOutsideRoots
	case errors.Is(err, ErrInvalidPath):
		return ErrInvalidPath
	}
	return nil
}

func (l *Local) fail(op, p string, err error) error {
	kind := localKind(err)
	if l.escapes != nil && errors.Is(err, l.escapes) {
		kind = ErrOutsideRoots
	}
	return &Error{Op: op, Store: l.name, Path: p, Kind: kind, Err: err}
}

// open opens a regular file at p inside the root.
func (l *Local) open(p string) (*os.File, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	f, err := l.root.Open(filepath.FromSlash(p))
	if err != nil {
		return nil, err
	}
	st, err := f.Stat()
	if err != nil {
		_ = f.Close()
		return nil, err
	}
	if !st.Mode().IsRegular() {
		_ = f.Close()
		return nil, fmt.Errorf("%s is not a regular file: %w", p, fs.ErrNotExist)
	}
	return f, nil
}

// Stat implements Store.
func (l *Local) Stat(ctx context.Context, p string) (ObjectInfo, error) {
	if err := ctx.Err(); err != nil {
		return ObjectInfo{}, l.fail("stat", p, err)
	}
	if err := checkPath(p); err != nil {
		return ObjectInfo{}, l.fail("stat", p, err)
	}
	st, err := l.root.Stat(filepath.FromSlash(p))
	if err == nil && !st.Mode().IsRegular() {
		err = fmt.Errorf("%s is not a regular file: %w", p, fs.ErrNotExist)
	}
	if err != nil {
		return ObjectInfo{}, l.fail("stat", p, err)
	}
	return fileInfo(p, st), nil
}

// fileInfo describes the file at p.
func fileInfo(p string, st fs.FileInfo) ObjectInfo {
	return ObjectInfo{Path: p, Size: st.Size(), ModTime: st.ModTime(), ETag: fileETag(st)}
}

// fileETag names a file's version by its size and modification time to the nanosecond: a
// file rewritten in place changes both or at least its time, as NFS and local file systems
// keep it. (A writer that sets the time back by hand defeats it; nothing cheaper than reading
// the whole file would not.)
func fileETag(st fs.FileInfo) string {
	return strconv.FormatInt(st.Size(), 16) + "-" + strconv.FormatInt(st.ModTime().UnixNano(), 16)
}

// List implements Store. Symlinks are followed only where they stay inside the root.
func (l *Local) List(ctx context.Context, prefix string) iter.Seq2[ObjectInfo, error] {
	if err := checkPrefix(prefix); err != nil {
		return errorSeq(l.fail("list", prefix, err))
	}
	// Walk the deepest directory the prefix names completely; filter the rest by prefix.
	start := "."
	if i := strings.LastIndex(prefix, "/"); i >= 0 {
		start = prefix[:i]
	}
	return func(yield func(ObjectInfo, error) bool) {
		fsys := l.root.FS()
		err := fs.WalkDir(fsys, start, func(p string, d fs.DirEntry, err error) error {
			if err != nil {
				if p == start && errors.Is(err, fs.ErrNotExist) {
					return fs.SkipAll // an empty listing, as for a prefix that matches nothing in S3
				}
				return err
			}
			if cerr := ctx.Err(); cerr != nil {
				return cerr
			}
			if d.IsDir() {
				// Skip directories the prefix rules out; "a/b" may still match "a/bc/...".
				if p != "." && !strings.HasPrefix(p+"/", prefix) && !strings.HasPrefix(prefix, p+"/") {
					return fs.SkipDir
				}
				return nil
			}
			if !strings.HasPrefix(p, prefix) {
				return nil
			}
			st, err := fs.Stat(fsys, p)
			if err != nil || !st.Mode().IsRegular() {
				return nil // a symlink leading out of the root, or to something that is not a file
			}
			if !yield(fileInfo(p, st), nil) {
				return errStop
			}
			return nil
		})
		if err != nil && !errors.Is(err, errStop) {
			yield(ObjectInfo{}, l.fail("list", prefix, err))
		}
	}
}

var errStop = errors.New("listing stopped by the caller")

// ReadAt implements Store.
func (l *Local) ReadAt(ctx context.Context, p string, buf []byte, off int64) (int, error) {
	return l.ReadVersionAt(ctx, p, "", buf, off)
}

// ReadVersionAt implements Store: the file opened is checked to be of version etag (any
// version when etag is empty) before it is read.
func (l *Local) ReadVersionAt(ctx context.Context, p, etag string, buf []byte, off int64) (int, error) {
	if err := ctx.Err(); err != nil {
		return 0, l.fail("read", p, err)
	}
	f, err := l.open(p)
	if err != nil {
		return 0, l.fail("read", p, err)
	}
	defer func() { _ = f.Close() }() // read-only: a failed close loses nothing
	// Checked before and after: a file written in place while it is read changes its time.
	if err := l.checkVersion(f, p, etag); err != nil {
		return 0, err
	}
	n, err := f.ReadAt(buf, off)
	if verr := l.checkVersion(f, p, etag); verr != nil {
		return 0, verr
	}
	if err != nil && !errors.Is(err, io.EOF) {
		return n, l.fail("read", p, err)
	}
	return n, err
}

// checkVersion fails with ErrChanged if the open file f is not of version etag.
func (l *Local) checkVersion(f *os.File, p, etag string) error {
	if etag == "" {
		return nil
	}
	st, err := f.Stat()
	if err != nil {
		return l.fail("read", p, err)
	}
	if got := fileETag(st); got != etag {
		return &Error{Op: "read", Store: l.name, Path: p, Kind: ErrChanged,
			Err: fmt.Errorf("the file is version %s (size and modification time), not %s", got, etag)}
	}
	return nil
}

// Open implements Store.
func (l *Local) Open(ctx context.Context, p string) (io.ReadCloser, error) {
	if err := ctx.Err(); err != nil {
		return nil, l.fail("open", p, err)
	}
	f, err := l.open(p)
	if err != nil {
		return nil, l.fail("open", p, err)
	}
	return f, nil
}

// Write implements Store atomically: a temporary file in the target directory, synced and
// renamed over the path if the path is still what pre says, then the directory synced, so a
// checkpoint is whole or absent.
func (l *Local) Write(ctx context.Context, p string, r io.Reader, _ int64, pre Precondition) (etag string, err error) {
	if err := checkPath(p); err != nil {
		return "", l.fail("write", p, err)
	}
	dir, base := path.Split(p)
	dir = path.Clean(dir)
	if err := l.root.MkdirAll(filepath.FromSlash(dir), 0o750); err != nil {
		return "", l.fail("write", p, err)
	}
	var rnd [8]byte
	_, _ = rand.Read(rnd[:])
	tmp := path.Join(dir, ".strata-tmp-"+base+"-"+hex.EncodeToString(rnd[:]))
	f, err := l.root.OpenFile(filepath.FromSlash(tmp), os.O_WRONLY|os.O_CREATE|os.O_EXCL, 0o640)
	if err != nil {
		return "", l.fail("write", p, err)
	}
	defer func() {
		if err != nil {
			_ = f.Close()
			_ = l.root.Remove(filepath.FromSlash(tmp))
		}
	}()
	if _, err = io.Copy(f, ctxReader{ctx, r}); err != nil {
		return "", l.fail("write", p, err)
	}
	if err = f.Sync(); err != nil {
		return "", l.fail("write", p, err)
	}
	if err = f.Close(); err != nil {
		return "", l.fail("write", p, err)
	}
	if etag, err = l.land(tmp, p, pre); err != nil {
		return "", err
	}
	d, err := l.root.Open(filepath.FromSlash(dir))
	if err != nil {
		return "", l.fail("write", p, err)
	}
	defer func() { _ = d.Close() }() // the sync above is what matters
	if err = d.Sync(); err != nil {
		return "", l.fail("write", p, err)
	}
	return etag, nil
}

// land renames the written file tmp to p if p is what pre says, and returns the version
// written.
func (l *Local) land(tmp, p string, pre Precondition) (string, error) {
	l.landing.Lock()
	defer l.landing.Unlock()
	st, err := l.root.Lstat(filepath.FromSlash(p))
	switch {
	case err != nil && !errors.Is(err, fs.ErrNotExist):
		return "", l.fail("write", p, err)
	case pre.Absent && err == nil:
		return "", &Error{Op: "write", Store: l.name, Path: p, Kind: ErrChanged, Err: errors.New("the file exists, and the write expected none")}
	case pre.ETag != "" && err != nil:
		return "", &Error{Op: "write", Store: l.name, Path: p, Kind: ErrChanged, Err: fmt.Errorf("the file is gone, and the write expected version %s", pre.ETag)}
	case pre.ETag != "" && fileETag(st) != pre.ETag:
		return "", &Error{Op: "write", Store: l.name, Path: p, Kind: ErrChanged,
			Err: fmt.Errorf("the file is version %s (size and modification time), and the write expected %s", fileETag(st), pre.ETag)}
	}
	if err := l.root.Rename(filepath.FromSlash(tmp), filepath.FromSlash(p)); err != nil {
		return "", l.fail("write", p, err)
	}
	st, err = l.root.Lstat(filepath.FromSlash(p))
	if err != nil {
		return "", l.fail("write", p, err)
	}
	return fileETag(st), nil
}

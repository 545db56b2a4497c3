package understore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"iter"
	"strings"
	"time"
)

// Store is an under-store. Paths are slash-separated and relative to the store's root (its
// bucket and prefix, directory or base URL), such as "2024/01/part-0001.parquet".
type Store interface {
	// Stat describes one object.
	Stat(ctx context.Context, path string) (ObjectInfo, error)
	// List yields the objects whose paths start with prefix (in key order for S3, in
	// directory-walk order for paths) and stops at the first error, which it yields.
	List(ctx context.Context, prefix string) iter.Seq2[ObjectInfo, error]
	// ReadAt reads len(p) bytes at off, like io.ReaderAt: fewer only at the end of the object,
	// with io.EOF.
	ReadAt(ctx context.Context, path string, p []byte, off int64) (int, error)
	// ReadVersionAt is ReadAt of the version of the object whose ETag is etag, as Stat and
	// List gave it: ErrChanged if the object is another version now.
	ReadVersionAt(ctx context.Context, path, etag string, p []byte, off int64) (int, error)
	// Open streams a whole object. The caller closes it.
	Open(ctx context.Context, path string) (io.ReadCloser, error)
	// Write stores size bytes from r as path (size -1 when unknown) if the object of that path
	// is still what pre says when the write lands, and fails with ErrChanged otherwise; it
	// returns the version written (its ETag). Checkpoints are written this way.
	Write(ctx context.Context, path string, r io.Reader, size int64, pre Precondition) (etag string, err error)
	// String names the store in messages, such as s3://bucket/prefix.
	String() string
}

// Precondition is what a Write expects the object at its path to be when the write lands. Of two
// writers that looked at the same object, only the first to finish lands; the other fails with
// ErrChanged and looks again. The zero Precondition expects nothing: the write replaces whatever is
// there.
type Precondition struct {
	// Absent: no object of that path.
	Absent bool
	// ETag: this version of the object, as Stat gave it.
	ETag string
}

// Current is what a Write of path may replace: the object s holds there now, or none.
func Current(ctx context.Context, s Store, path string) (Precondition, error) {
	info, err := s.Stat(ctx, path)
	switch {
	case errors.Is(err, ErrNotFound):
		return Precondition{Absent: true}, nil
	case err != nil:
		return Precondition{}, err
	case info.ETag == "":
		return Precondition{}, fmt.Errorf("%s/%s has no version (ETag) that a write could be made conditional on", s, path)
	}
	return Precondition{ETag: info.ETag}, nil
}

// ObjectInfo describes an object.
type ObjectInfo struct {
	// Path relative to the store's root.
	Path string
	// Size in bytes; -1 if the store did not say.
	Size    int64
	ModTime time.Time
	// ETag names the object's version, without quotes: S3's ETag, an HTTP server's, and for
	// files their size and modification time (see fileETag). Bytes of two versions are never
	// mixed: a block of a file is named by the version it was read from, and read only from it
	// (ReadVersionAt). Empty only for an HTTP server that sends none.
	ETag string
}

// The kinds of failure callers act on.
var (
	ErrNotFound           = errors.New("not found")
	ErrAccessDenied       = errors.New("access denied")
	ErrMissingCredentials = errors.New("missing credentials")
	ErrUnreachable        = errors.New("unreachable")
	ErrOutsideRoots       = errors.New("outside the allowed roots")
	ErrInvalidPath        = errors.New("invalid path")
	// ErrReadOnly also matches errors.ErrUnsupported.
	ErrReadOnly = fmt.Errorf("read-only under-store: %w", errors.ErrUnsupported)
	// ErrChanged is a read of a version the object no longer is: it was replaced since it was
	// listed.
	ErrChanged = errors.New("changed since it was listed")
)

// Error is a failed under-store operation: which store and object, what was being done, what
// kind of failure it is (one of the sentinels above, or nil if none fits) and the cause.
type Error struct {
	// Op is what was being done: connect, stat, list, read, open or write.
	Op string
	// Store names the store, such as s3://bucket/prefix/.
	Store string
	// Endpoint is the server the store talks to, where that is not part of Store.
	Endpoint string
	// Path is the object's path, or the prefix for list; empty for connect.
	Path string
	// Kind is the sentinel that classifies the failure; nil when none fits.
	Kind error
	// Err is the cause, as the store's client reported it.
	Err error
}

// Error reads like "read s3://bucket/prefix/dir/file.csv (at http://host:9000): access denied: <cause>".
func (e *Error) Error() string {
	var b strings.Builder
	b.WriteString(e.Op)
	b.WriteString(" ")
	b.WriteString(e.Store)
	if e.Path != "" {
		if !strings.HasSuffix(e.Store, "/") {
			b.WriteString("/")
		}
		b.WriteString(e.Path)
	}
	if e.Endpoint != "" {
		b.WriteString(" (at ")
		b.WriteString(e.Endpoint)
		b.WriteString(")")
	}
	if e.Kind != nil {
		b.WriteString(": ")
		b.WriteString(e.Kind.Error())
	}
	if e.Err != nil {
		b.WriteString(": ")
		b.WriteString(e.Err.Error())
	}
	return b.String()
}

// Unwrap gives errors.Is and errors.As both the kind and the cause.
func (e *Error) Unwrap() []error {
	var out []error
	if e.Kind != nil {
		out = append(out, e.Kind)
	}
	if e.Err != nil {
		out = append(out, e.Err)
	}
	return out
}

// checkPath accepts slash-separated relative paths without "." or ".." elements. A ".." is
// reported as ErrOutsideRoots, since that is what it tries.
func checkPath(p string) error {
	if fs.ValidPath(p) && p != "." {
		return nil
	}
	for _, el := range strings.Split(p, "/") {
		if el == ".." {
			return fmt.Errorf("%q: %w", p, ErrOutsideRoots)
		}
	}
	return fmt.Errorf("%q: %w: want a relative path such as dir/file.csv, without empty, '.' or '..' elements", p, ErrInvalidPath)
}

// checkPrefix accepts what checkPath accepts, the empty prefix, and a prefix ending in "/".
func checkPrefix(prefix string) error {
	p := strings.TrimSuffix(prefix, "/")
	if p == "" && prefix != "/" {
		return nil
	}
	return checkPath(p)
}

// errorSeq is a List result that yields only err.
func errorSeq(err error) iter.Seq2[ObjectInfo, error] {
	return func(yield func(ObjectInfo, error) bool) { yield(ObjectInfo{}, err) }
}

// ctxReader stops a copy when its context ends.
type ctxReader struct {
	ctx context.Context
	r   io.Reader
}

func (c ctxReader) Read(p []byte) (int, error) {
	if err := c.ctx.Err(); err != nil {
		return 0, err
	}
	return c.r.Read(p)
}

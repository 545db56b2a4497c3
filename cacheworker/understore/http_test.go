package understore

import (
	"bytes"
	"context"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

var httpObject = []byte("the quick brown fox jumps over the lazy dog")

// fileServer serves httpObject under /data/ with Range support (http.ServeContent), a private
// object that wants "Bearer good", and a forbidden one. It counts the ranged requests.
func fileServer(t *testing.T, honourRanges bool) (*httptest.Server, *atomic.Int32) {
	var ranged atomic.Int32
	mux := http.NewServeMux()
	mux.HandleFunc("/data/", func(w http.ResponseWriter, r *http.Request) {
		name := strings.TrimPrefix(r.URL.Path, "/data/")
		switch name {
		case "fox.txt", "dir with space/fox.txt":
		case "private/fox.txt":
			if r.Header.Get("Authorization") != "Bearer good" {
				http.Error(w, "who are you", http.StatusUnauthorized)
				return
			}
		case "forbidden/fox.txt":
			http.Error(w, "not for you", http.StatusForbidden)
			return
		default:
			http.NotFound(w, r)
			return
		}
		if r.Header.Get("Range") != "" {
			ranged.Add(1)
		}
		if !honourRanges {
			r.Header.Del("Range")
		}
		http.ServeContent(w, r, name, time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC), bytes.NewReader(httpObject))
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)
	return srv, &ranged
}

func TestHTTPReads(t *testing.T) {
	cases := map[string]struct {
		honourRanges bool
		off          int64
		size         int
		want         string
		wantEOF      bool
	}{
		"a ranged read returns the bytes asked for":                      {honourRanges: true, off: 4, size: 5, want: "quick"},
		"a range past the end returns what there is":                     {honourRanges: true, off: 40, size: 10, want: "dog", wantEOF: true},
		"a range starting at the end returns nothing":                    {honourRanges: true, off: 43, size: 4, want: "", wantEOF: true},
		"a server that ignores ranges still gives the right bytes":       {off: 10, size: 5, want: "brown"},
		"a server that ignores ranges, read past the end, is short":      {off: 40, size: 10, want: "dog", wantEOF: true},
		"a server that ignores ranges, read from past the end, is empty": {off: 50, size: 10, want: "", wantEOF: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			srv, ranged := fileServer(t, tc.honourRanges)
			h, err := NewHTTP(HTTPConfig{BaseURL: srv.URL + "/data"})
			g.Expect(err).NotTo(HaveOccurred())
			buf := make([]byte, tc.size)
			n, err := h.ReadAt(context.Background(), "fox.txt", buf, tc.off)
			g.Expect(string(buf[:n])).To(Equal(tc.want))
			if tc.wantEOF {
				g.Expect(err).To(MatchError(io.EOF))
			} else {
				g.Expect(err).NotTo(HaveOccurred())
			}
			g.Expect(ranged.Load()).To(BeEquivalentTo(1), "one ranged GET per read")
		})
	}
}

func TestHTTPStatAndOpen(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	srv, _ := fileServer(t, true)
	h, err := NewHTTP(HTTPConfig{BaseURL: srv.URL + "/data/"})
	g.Expect(err).NotTo(HaveOccurred())

	info, err := h.Stat(ctx, "dir with space/fox.txt")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(info.Size).To(BeEquivalentTo(len(httpObject)))
	g.Expect(info.ModTime).To(BeTemporally("==", time.Date(2025, 3, 1, 12, 0, 0, 0, time.UTC)))

	rc, err := h.Open(ctx, "fox.txt")
	g.Expect(err).NotTo(HaveOccurred())
	b, err := io.ReadAll(rc)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(rc.Close()).To(Succeed())
	g.Expect(b).To(Equal(httpObject))
}

func TestHTTPErrorsSayWhichObjectAndWhy(t *testing.T) {
	srv, _ := fileServer(t, true)
	closed := httptest.NewServer(http.NotFoundHandler())
	closedURL := closed.URL
	closed.Close()

	cases := map[string]struct {
		base   string
		header http.Header
		path   string
		kind   error
	}{
		"a missing object is not found":                        {path: "nothing.txt", kind: ErrNotFound},
		"a private object without credentials is missing them": {path: "private/fox.txt", kind: ErrMissingCredentials},
		"a private object with wrong credentials is denied": {
			path: "private/fox.txt", header: http.Header{"Authorization": {"Bearer bad"}}, kind: ErrAccessDenied,
		},
		"a forbidden object is denied":               {path: "forbidden/fox.txt", kind: ErrAccessDenied},
		"a server that is not there is unreachable":  {base: closedURL, path: "fox.txt", kind: ErrUnreachable},
		"a path climbing out of the base is refused": {path: "../secret", kind: ErrOutsideRoots},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			ctx := context.Background()
			base := tc.base
			if base == "" {
				base = srv.URL
			}
			h, err := NewHTTP(HTTPConfig{BaseURL: base + "/data", Header: tc.header})
			g.Expect(err).NotTo(HaveOccurred())
			_, statErr := h.Stat(ctx, tc.path)
			_, readErr := h.ReadAt(ctx, tc.path, make([]byte, 3), 0)
			_, openErr := h.Open(ctx, tc.path)
			for _, err := range []error{statErr, readErr, openErr} {
				g.Expect(err).To(MatchError(tc.kind))
				var e *Error
				g.Expect(errors.As(err, &e)).To(BeTrue())
				g.Expect(e.Path).To(Equal(tc.path))
				g.Expect(err.Error()).To(ContainSubstring(tc.path))
			}
		})
	}

	t.Run("the private object reads with the right credentials", func(t *testing.T) {
		g := NewWithT(t)
		h, err := NewHTTP(HTTPConfig{BaseURL: srv.URL + "/data", Header: http.Header{"Authorization": {"Bearer good"}}})
		g.Expect(err).NotTo(HaveOccurred())
		buf := make([]byte, 3)
		_, err = h.ReadAt(context.Background(), "private/fox.txt", buf, 40)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(string(buf)).To(Equal("dog"))
	})
}

func TestHTTPIsReadOnly(t *testing.T) {
	g := NewWithT(t)
	h, err := NewHTTP(HTTPConfig{BaseURL: "https://data.example.com/sets"})
	g.Expect(err).NotTo(HaveOccurred())
	_, err = h.Write(context.Background(), "out/part-0", strings.NewReader("x"), 1, Precondition{})
	g.Expect(err).To(MatchError(ErrReadOnly))
	g.Expect(err).To(MatchError(errors.ErrUnsupported))
}

func TestNewHTTPRefusesBadBaseURLs(t *testing.T) {
	cases := map[string]string{
		"another scheme is refused":     "ftp://data.example.com/sets",
		"a URL without host is refused": "https:///sets",
		"a query is refused":            "https://data.example.com/sets?token=x",
		"garbage is refused":            "://",
	}
	for name, base := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			_, err := NewHTTP(HTTPConfig{BaseURL: base})
			g.Expect(err).To(MatchError(ErrInvalidPath))
		})
	}
}

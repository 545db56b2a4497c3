package understore

import (
	"context"
	"crypto/subtle"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/go-logr/logr"

	"github.com/strata-cache/strata/internal/pki"
)

// The claim server is how workers read a pvc:// source. A PersistentVolumeClaim can only be
// mounted by pods of its own namespace, and workers run in Strata's, so the operator runs a
// small server in the Dataset's namespace that mounts the claim read-only and serves it over
// HTTPS to Strata's workers and operator alone: mutual TLS with certificates of Strata's CA
// (the server's is for its Service's name), and a bearer token from a Secret of that namespace.
//
// The protocol is HTTP's own where it has one:
//
//	GET|HEAD /objects/<path>  the object, with Range, Last-Modified and Content-Length
//	GET /list?prefix=<p>      the listing, one JSON listEntry per line, ending with {"end":true}
//
// A listing that breaks off has no end line, so the client tells a cut connection from a
// complete listing. Failures are plain HTTP statuses whose body says what failed.

// ClaimServerPort is the port the claim server serves HTTPS on.
const ClaimServerPort = 8480

// ClaimServerHealthPort is the port of the claim server's health and metrics, in plain HTTP for
// the kubelet's probe, which has no client certificate. Nothing of the claim is served there.
const ClaimServerHealthPort = 8481

const (
	objectsPath = "/objects/"
	listPath    = "/list"
)

// listEntry is one line of a listing: an object, the end, or the error that ended it.
type listEntry struct {
	Path    string    `json:"path,omitempty"`
	Size    int64     `json:"size,omitempty"`
	ModTime time.Time `json:"modTime,omitzero"`
	ETag    string    `json:"etag,omitempty"`
	End     bool      `json:"end,omitempty"`
	// Error ends a listing that failed; Kind is the Error() of its kind sentinel, if any.
	Error string `json:"error,omitempty"`
	Kind  string `json:"kind,omitempty"`
}

// ClaimServerTLS is the TLS configuration of a claim server with creds: only Strata's workers
// and its operator are served. A claim server's own certificate, whose key the namespace's users
// can read, does not let one claim server read another.
func ClaimServerTLS(creds *pki.Credentials) *tls.Config {
	return creds.ServerConfig(pki.RoleWorker, pki.RoleOperator)
}

// ClaimClientTLS is the TLS configuration a worker or the operator with creds reads claim
// servers with (Source.ClaimServerTLS): the server must be a claim server, for the name the
// store sets.
func ClaimClientTLS(creds *pki.Credentials) *tls.Config {
	return creds.ClientConfig(pki.RoleClaimServer)
}

// NewClaimServer serves store read-only to clients that send token as a bearer token.
func NewClaimServer(store Store, token string, log logr.Logger) (http.Handler, error) {
	if len(token) < 16 {
		return nil, errors.New("the claim server's token is shorter than 16 characters")
	}
	s := &claimServer{store: store, token: []byte("Bearer " + token), log: log}
	mux := http.NewServeMux()
	mux.Handle("GET "+objectsPath, s.authorized(s.serveObject)) // GET also matches HEAD
	mux.Handle("GET "+listPath, s.authorized(s.serveList))
	return mux, nil
}

type claimServer struct {
	store Store
	token []byte
	log   logr.Logger
}

func (s *claimServer) authorized(next http.HandlerFunc) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got := r.Header.Get("Authorization")
		if got == "" {
			http.Error(w, "no bearer token: the worker sends the token of the Dataset's claim-server Secret", http.StatusUnauthorized)
			return
		}
		if subtle.ConstantTimeCompare([]byte(got), s.token) != 1 {
			http.Error(w, "wrong bearer token", http.StatusForbidden)
			return
		}
		next(w, r)
	})
}

// serveObject answers GET and HEAD of one object, ranges included, through http.ServeContent.
// It reads from one open of the object when the store's Open can seek (a Local store's
// files can), and otherwise through the store's ReadAt, which copying in small chunks would
// call once per chunk.
func (s *claimServer) serveObject(w http.ResponseWriter, r *http.Request) {
	p := strings.TrimPrefix(r.URL.Path, objectsPath)
	info, err := s.store.Stat(r.Context(), p)
	if err != nil {
		s.fail(w, "stat", p, err)
		return
	}
	if info.ETag != "" {
		// http.ServeContent answers If-Match against it, so a client reads only the version
		// it listed.
		w.Header().Set("ETag", quoteETag(info.ETag))
	}
	w.Header().Set("Content-Type", "application/octet-stream")
	var content io.ReadSeeker = io.NewSectionReader(storeReaderAt{r.Context(), s.store, p}, 0, info.Size)
	if r.Method == http.MethodGet {
		rc, err := s.store.Open(r.Context(), p)
		if err != nil {
			s.fail(w, "open", p, err)
			return
		}
		defer func() { _ = rc.Close() }()
		if rs, ok := rc.(io.ReadSeeker); ok {
			content = rs
		}
	}
	http.ServeContent(w, r, "", info.ModTime, content)
}

// storeReaderAt reads one object of a store as an io.ReaderAt.
type storeReaderAt struct {
	ctx   context.Context
	store Store
	path  string
}

func (a storeReaderAt) ReadAt(p []byte, off int64) (int, error) {
	return a.store.ReadAt(a.ctx, a.path, p, off)
}

func (s *claimServer) serveList(w http.ResponseWriter, r *http.Request) {
	prefix := r.URL.Query().Get("prefix")
	w.Header().Set("Content-Type", "application/jsonl")
	enc := json.NewEncoder(w)
	for obj, err := range s.store.List(r.Context(), prefix) {
		if err != nil {
			s.log.Error(err, "Listing failed", "prefix", prefix)
			entry := listEntry{Error: err.Error()}
			if kind := kindOf(err); kind != nil {
				entry.Kind = kind.Error()
			}
			_ = enc.Encode(entry)
			return
		}
		if err := enc.Encode(listEntry{Path: obj.Path, Size: obj.Size, ModTime: obj.ModTime, ETag: obj.ETag}); err != nil {
			return // the client went away
		}
	}
	_ = enc.Encode(listEntry{End: true})
}

// fail answers with the status that matches err's kind.
func (s *claimServer) fail(w http.ResponseWriter, op, p string, err error) {
	code := http.StatusInternalServerError
	switch {
	case errors.Is(err, ErrNotFound), errors.Is(err, ErrOutsideRoots), errors.Is(err, ErrInvalidPath):
		// A path leaving the claim is answered as absent, so nothing outside it can be probed.
		code = http.StatusNotFound
	case errors.Is(err, ErrAccessDenied):
		code = http.StatusForbidden
	default:
		s.log.Error(err, "Serving an object failed", "op", op, "path", p)
	}
	http.Error(w, err.Error(), code)
}

// kinds are the sentinels a listing error's kind is sent as, by name.
var kinds = []error{ErrNotFound, ErrAccessDenied, ErrMissingCredentials, ErrUnreachable, ErrOutsideRoots, ErrInvalidPath, ErrReadOnly}

func kindOf(err error) error {
	for _, k := range kinds {
		if errors.Is(err, k) {
			return k
		}
	}
	return nil
}

func kindNamed(name string) error {
	for _, k := range kinds {
		if k.Error() == name {
			return k
		}
	}
	return nil
}

// ClaimStore reads a pvc:// source from its claim server. Objects are read with the HTTP
// store's GET, HEAD and ranged GET; listings come from the server's /list.
type ClaimStore struct {
	*HTTP
	base string
	name string
}

var _ Store = (*ClaimStore)(nil)

// NewClaimStore reads the claim server at endpoint (https://host:port) for the source named
// uri, over mutual TLS with tlsConfig, verifying that the server's certificate is for
// serverName (the endpoint's host when empty).
//
// Claim servers speak only HTTPS. The PersistentVolumes of Datasets made before they did name
// their endpoint http://, and a volume's attributes cannot change, so such an endpoint is read
// as https:// at the same host and port.
func NewClaimStore(uri, endpoint, token, serverName string, tlsConfig *tls.Config) (*ClaimStore, error) {
	u, err := url.Parse(strings.TrimSuffix(endpoint, "/"))
	if err != nil || u.Host == "" || u.Scheme != "http" && u.Scheme != "https" {
		return nil, invalidSource(uri, "claim server endpoint %q: want https://host:port", endpoint)
	}
	u.Scheme = "https"
	if serverName == "" {
		serverName = u.Hostname()
	}
	cfg := tlsConfig.Clone()
	cfg.ServerName = serverName
	header := http.Header{}
	header.Set("Authorization", "Bearer "+token)
	base := u.String()
	h, err := NewHTTP(HTTPConfig{BaseURL: base + objectsPath, Header: header, TLS: cfg})
	if err != nil {
		return nil, invalidSource(uri, "claim server endpoint %q: %w", endpoint, err)
	}
	h.name = uri
	return &ClaimStore{HTTP: h, base: base, name: uri}, nil
}

func (c *ClaimStore) String() string { return c.name }

// List implements Store.
func (c *ClaimStore) List(ctx context.Context, prefix string) iter.Seq2[ObjectInfo, error] {
	return func(yield func(ObjectInfo, error) bool) {
		if err := checkPrefix(prefix); err != nil {
			yield(ObjectInfo{}, c.fail("list", prefix, ErrInvalidPath, err))
			return
		}
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, c.base+listPath+"?prefix="+url.QueryEscape(prefix), nil)
		if err != nil {
			yield(ObjectInfo{}, c.fail("list", prefix, ErrInvalidPath, err))
			return
		}
		for k, vs := range c.header {
			req.Header[k] = vs
		}
		resp, err := c.client.Do(req)
		if err != nil {
			yield(ObjectInfo{}, c.fail("list", prefix, nil, err))
			return
		}
		defer func() { _ = resp.Body.Close() }()
		if resp.StatusCode != http.StatusOK {
			yield(ObjectInfo{}, c.fail("list", prefix, c.statusKind(resp.StatusCode), statusError(resp)))
			return
		}
		dec := json.NewDecoder(ctxReader{ctx, resp.Body})
		for {
			var e listEntry
			if err := dec.Decode(&e); err != nil {
				if errors.Is(err, io.EOF) {
					err = errors.New("the listing ended without its end line: the claim server stopped or the connection broke")
				}
				yield(ObjectInfo{}, c.fail("list", prefix, nil, err))
				return
			}
			switch {
			case e.End:
				return
			case e.Error != "":
				yield(ObjectInfo{}, c.fail("list", prefix, kindNamed(e.Kind), fmt.Errorf("claim server: %s", e.Error)))
				return
			}
			if !yield(ObjectInfo{Path: e.Path, Size: e.Size, ModTime: e.ModTime, ETag: e.ETag}, nil) {
				return
			}
		}
	}
}

// Write implements Store: claims are served read-only.
func (c *ClaimStore) Write(_ context.Context, p string, _ io.Reader, _ int64, _ Precondition) (string, error) {
	return "", c.fail("write", p, ErrReadOnly, errors.New("the claim of a pvc:// source is mounted read-only"))
}

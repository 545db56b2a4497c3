package understore

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// HTTPConfig is a read-only under-store served over HTTP(S).
type HTTPConfig struct {
	// BaseURL is the URL paths are resolved under, such as https://data.example.com/sets/v1.
	BaseURL string
	// Client sends the requests; nil means a client with connect and header timeouts but no
	// overall timeout, since bodies are streamed for as long as they take.
	Client *http.Client
	// Header is sent with every request, such as Authorization from the credentials Secret.
	Header http.Header
	// TLS configures the default client's HTTPS connections; nil means the system's roots.
	TLS *tls.Config
}

// HTTP is a read-only under-store that reads with GET and HEAD, and ranged GETs for ReadAt.
type HTTP struct {
	base   *url.URL
	client *http.Client
	header http.Header
	name   string
}

var _ Store = (*HTTP)(nil)

// NewHTTP returns a store for cfg. It does not contact the server.
func NewHTTP(cfg HTTPConfig) (*HTTP, error) {
	u, err := url.Parse(cfg.BaseURL)
	if err == nil && (u.Scheme != "http" && u.Scheme != "https" || u.Host == "") {
		err = errors.New("want an http:// or https:// URL with a host")
	}
	if err == nil && (u.RawQuery != "" || u.Fragment != "") {
		err = errors.New("a base URL takes no query or fragment")
	}
	if err != nil {
		return nil, &Error{Op: "connect", Store: cfg.BaseURL, Kind: ErrInvalidPath, Err: err}
	}
	client := cfg.Client
	if client == nil {
		client = &http.Client{Transport: &http.Transport{
			Proxy:                 http.ProxyFromEnvironment,
			DialContext:           (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
			TLSClientConfig:       cfg.TLS,
			TLSHandshakeTimeout:   10 * time.Second,
			ResponseHeaderTimeout: 30 * time.Second,
			MaxIdleConnsPerHost:   16,
			IdleConnTimeout:       90 * time.Second,
		}}
	}
	return &HTTP{base: u, client: client, header: cfg.Header.Clone(), name: strings.TrimSuffix(u.String(), "/")}, nil
}

func (h *HTTP) String() string { return h.name }

func (h *HTTP) fail(op, p string, kind, err error) error {
	if kind == nil && unreachable(err) {
		kind = ErrUnreachable
	}
	return &Error{Op: op, Store: h.name, Path: p, Kind: kind, Err: err}
}

// statusKind classifies an HTTP status. A 401 with no credentials configured means the
// credentials are missing rather than wrong.
func (h *HTTP) statusKind(code int) error {
	switch code {
	case http.StatusNotFound, http.StatusGone:
		return ErrNotFound
	case http.StatusUnauthorized:
		if h.header.Get("Authorization") == "" {
			return ErrMissingCredentials
		}
		return ErrAccessDenied
	case http.StatusForbidden:
		return ErrAccessDenied
	}
	return nil
}

// do sends method for p, with a Range header if rng is not empty and an If-Match header if
// etag is not.
func (h *HTTP) do(ctx context.Context, method, p, rng, etag string) (*http.Response, error) {
	if err := checkPath(p); err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, method, h.base.JoinPath(strings.Split(p, "/")...).String(), nil)
	if err != nil {
		return nil, err
	}
	for k, vs := range h.header {
		req.Header[k] = vs
	}
	if rng != "" {
		req.Header.Set("Range", rng)
	}
	if etag != "" {
		req.Header.Set("If-Match", quoteETag(etag))
	}
	return h.client.Do(req)
}

// statusError reads a little of an error response's body to say what the server said.
func statusError(resp *http.Response) error {
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	msg := strings.TrimSpace(string(body))
	if msg == "" {
		return fmt.Errorf("HTTP %s", resp.Status)
	}
	return fmt.Errorf("HTTP %s: %s", resp.Status, msg)
}

// Stat implements Store with HEAD.
func (h *HTTP) Stat(ctx context.Context, p string) (ObjectInfo, error) {
	resp, err := h.do(ctx, http.MethodHead, p, "", "")
	if err != nil {
		return ObjectInfo{}, h.fail("stat", p, localKind(err), err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return ObjectInfo{}, h.fail("stat", p, h.statusKind(resp.StatusCode), fmt.Errorf("HTTP %s", resp.Status))
	}
	info := ObjectInfo{Path: p, Size: resp.ContentLength, ETag: unquoteETag(resp.Header.Get("ETag"))}
	if t, err := http.ParseTime(resp.Header.Get("Last-Modified")); err == nil {
		info.ModTime = t
	}
	return info, nil
}

// ReadAt implements Store with a ranged GET. A server that ignores ranges answers 200 with the
// whole object; the bytes before off are then skipped, which is correct but slow.
func (h *HTTP) ReadAt(ctx context.Context, p string, buf []byte, off int64) (int, error) {
	return h.ReadVersionAt(ctx, p, "", buf, off)
}

// ReadVersionAt implements Store with a ranged GET that the server answers only if the
// object's ETag is etag (If-Match); any version when etag is empty.
func (h *HTTP) ReadVersionAt(ctx context.Context, p, etag string, buf []byte, off int64) (int, error) {
	if off < 0 {
		return 0, h.fail("read", p, ErrInvalidPath, fmt.Errorf("negative offset %d", off))
	}
	if len(buf) == 0 {
		return 0, nil
	}
	resp, err := h.do(ctx, http.MethodGet, p, "bytes="+strconv.FormatInt(off, 10)+"-"+strconv.FormatInt(off+int64(len(buf))-1, 10), etag)
	if err != nil {
		return 0, h.fail("read", p, localKind(err), err)
	}
	defer func() { _ = resp.Body.Close() }()
	var body io.Reader = resp.Body
	switch resp.StatusCode {
	case http.StatusPartialContent:
	case http.StatusRequestedRangeNotSatisfiable:
		return 0, io.EOF // the range starts at or past the end
	case http.StatusPreconditionFailed:
		return 0, h.fail("read", p, ErrChanged, fmt.Errorf("the server's ETag is %s, not %q", resp.Header.Get("ETag"), etag))
	case http.StatusOK:
		if _, err := io.CopyN(io.Discard, ctxReader{ctx, resp.Body}, off); err != nil {
			if errors.Is(err, io.EOF) {
				return 0, io.EOF
			}
			return 0, h.fail("read", p, nil, err)
		}
	default:
		return 0, h.fail("read", p, h.statusKind(resp.StatusCode), statusError(resp))
	}
	n, err := io.ReadFull(ctxReader{ctx, body}, buf)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return n, io.EOF
	}
	if err != nil {
		return n, h.fail("read", p, nil, err)
	}
	return n, nil
}

// Open implements Store with GET.
func (h *HTTP) Open(ctx context.Context, p string) (io.ReadCloser, error) {
	resp, err := h.do(ctx, http.MethodGet, p, "", "")
	if err != nil {
		return nil, h.fail("open", p, localKind(err), err)
	}
	if resp.StatusCode != http.StatusOK {
		defer func() { _ = resp.Body.Close() }()
		return nil, h.fail("open", p, h.statusKind(resp.StatusCode), statusError(resp))
	}
	return resp.Body, nil
}

// quoteETag is an ETag as HTTP headers carry it: quoted, and weak ones with W/.
func quoteETag(etag string) string {
	if weak, ok := strings.CutPrefix(etag, "W/"); ok {
		return `W/"` + weak + `"`
	}
	return `"` + etag + `"`
}

// unquoteETag is an ETag header as ObjectInfo holds it, as S3 clients do: without quotes.
func unquoteETag(header string) string {
	if weak, ok := strings.CutPrefix(header, "W/"); ok {
		return "W/" + strings.Trim(weak, `"`)
	}
	return strings.Trim(header, `"`)
}

// Write implements Store: HTTP under-stores are read-only.
func (h *HTTP) Write(_ context.Context, p string, _ io.Reader, _ int64, _ Precondition) (string, error) {
	return "", h.fail("write", p, ErrReadOnly, errors.New("checkpoints need a writable under-store such as S3 or a path"))
}

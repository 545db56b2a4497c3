package understore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"net/http"
	"strings"

	"github.com/minio/minio-go/v7"
	"github.com/minio/minio-go/v7/pkg/credentials"
)

// Defaults of S3Config.
const (
	DefaultS3Region = "us-east-1"
	// DefaultS3MaxRetries keeps minio-go's retries (with backoff) short: the cache falls back
	// or reports an unreachable store rather than stall a reader for many seconds.
	DefaultS3MaxRetries = 3
)

// S3Config is where an S3-compatible store is and how to sign requests to it.
type S3Config struct {
	// Endpoint is host[:port], without scheme.
	Endpoint string
	// Secure selects HTTPS.
	Secure bool
	// Bucket holds the objects.
	Bucket string
	// Prefix is prepended to every path; a trailing "/" is added if missing.
	Prefix string
	// Region to sign for; empty means DefaultS3Region, which also spares a location lookup.
	Region string
	// AccessKey, SecretKey and SessionToken sign requests.
	AccessKey, SecretKey, SessionToken string
	// WebIdentity, when set, signs requests with temporary credentials of a role assumed with
	// a token instead of the keys above.
	WebIdentity *WebIdentity
	// Anonymous sends unsigned requests, for public buckets; without it, missing keys are an error.
	Anonymous bool
	// MaxRetries per request; 0 means DefaultS3MaxRetries, 1 means no retry.
	MaxRetries int
	// Transport replaces the HTTP transport, for custom CAs or proxies.
	Transport http.RoundTripper
}

// WebIdentity is a role an S3 store is read as: the STS endpoint trades Token for the role's
// temporary credentials (AssumeRoleWithWebIdentity), again whenever they expire.
type WebIdentity struct {
	// Token is the JWT traded, such as a Kubernetes ServiceAccount's token.
	Token string
	// RoleARN is the role to assume.
	RoleARN string
	// STSEndpoint is the STS service's URL, http(s)://host[:port].
	STSEndpoint string
}

// S3 is an S3-compatible under-store.
type S3 struct {
	cfg      S3Config
	core     minio.Core
	name     string // s3://bucket/prefix/
	endpoint string // http(s)://host:port
}

var _ Store = (*S3)(nil)

// NewS3 returns a store for cfg. It does not contact the endpoint.
func NewS3(cfg S3Config) (*S3, error) {
	if cfg.Prefix = strings.TrimPrefix(cfg.Prefix, "/"); cfg.Prefix != "" && !strings.HasSuffix(cfg.Prefix, "/") {
		cfg.Prefix += "/"
	}
	name := "s3://" + cfg.Bucket + "/" + cfg.Prefix
	connectErr := func(kind error, format string, args ...any) error {
		return &Error{Op: "connect", Store: name, Endpoint: cfg.Endpoint, Kind: kind, Err: fmt.Errorf(format, args...)}
	}
	if cfg.Endpoint == "" || strings.Contains(cfg.Endpoint, "://") {
		return nil, connectErr(ErrInvalidPath, "endpoint %q must be host[:port] without a scheme; set Secure for HTTPS", cfg.Endpoint)
	}
	if cfg.Bucket == "" {
		return nil, connectErr(ErrInvalidPath, "no bucket given")
	}
	if w := cfg.WebIdentity; w != nil {
		if w.Token == "" || w.RoleARN == "" || w.STSEndpoint == "" {
			return nil, connectErr(ErrMissingCredentials, "a web identity needs a token, a role ARN and an STS endpoint")
		}
	} else if !cfg.Anonymous {
		var missing []string
		if cfg.AccessKey == "" {
			missing = append(missing, "accessKey")
		}
		if cfg.SecretKey == "" {
			missing = append(missing, "secretKey")
		}
		if len(missing) > 0 {
			return nil, connectErr(ErrMissingCredentials, "%s empty: put them in the credentials Secret, or ask for anonymous access to a public bucket",
				strings.Join(missing, " and "))
		}
	}
	if cfg.Region == "" {
		cfg.Region = DefaultS3Region
	}
	if cfg.MaxRetries == 0 {
		cfg.MaxRetries = DefaultS3MaxRetries
	}
	var creds *credentials.Credentials
	switch {
	case cfg.WebIdentity != nil:
		creds = credentials.New(newAssumedRole(*cfg.WebIdentity, cfg.Transport))
	case cfg.Anonymous:
		// minio-go leaves requests unsigned when the access key is empty.
		creds = credentials.NewStaticV4("", "", "")
	default:
		creds = credentials.NewStaticV4(cfg.AccessKey, cfg.SecretKey, cfg.SessionToken)
	}
	client, err := minio.New(cfg.Endpoint, &minio.Options{
		Creds:      creds,
		Secure:     cfg.Secure,
		Region:     cfg.Region,
		MaxRetries: cfg.MaxRetries,
		Transport:  cfg.Transport,
	})
	if err != nil {
		return nil, connectErr(ErrInvalidPath, "%w", err)
	}
	scheme := "http"
	if cfg.Secure {
		scheme = "https"
	}
	return &S3{cfg: cfg, core: minio.Core{Client: client}, name: name, endpoint: scheme + "://" + cfg.Endpoint}, nil
}

func (s *S3) String() string { return s.name + " at " + s.endpoint }

func (s *S3) key(p string) string { return s.cfg.Prefix + p }

// fail wraps err from minio-go with the object and the kind of failure.
func (s *S3) fail(op, p string, err error) error {
	return &Error{Op: op, Store: s.name, Endpoint: s.endpoint, Path: p, Kind: s3Kind(err), Err: err}
}

// s3Kind classifies an error from minio-go by the S3 error code, then by the HTTP status
// (HEAD responses carry no code), then by the network error beneath.
func s3Kind(err error) error {
	var refused *roleRefusedError
	if errors.As(err, &refused) {
		if unreachable(refused.Err) {
			return ErrUnreachable
		}
		return ErrAccessDenied
	}
	resp := minio.ToErrorResponse(err)
	switch resp.Code {
	case "NoSuchKey", "NoSuchBucket", "NotFound", "NoSuchVersion":
		return ErrNotFound
	case "PreconditionFailed":
		return ErrChanged
	case "AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch", "InvalidToken", "ExpiredToken",
		"AllAccessDisabled", "AccountProblem", "InvalidSecurity":
		return ErrAccessDenied
	}
	switch resp.StatusCode {
	case http.StatusNotFound:
		return ErrNotFound
	case http.StatusPreconditionFailed:
		return ErrChanged
	case http.StatusUnauthorized, http.StatusForbidden:
		return ErrAccessDenied
	}
	if unreachable(err) {
		return ErrUnreachable
	}
	return nil
}

// Stat implements Store.
func (s *S3) Stat(ctx context.Context, p string) (ObjectInfo, error) {
	if err := checkPath(p); err != nil {
		return ObjectInfo{}, s.fail("stat", p, err)
	}
	oi, err := s.core.StatObject(ctx, s.cfg.Bucket, s.key(p), minio.StatObjectOptions{})
	if err != nil {
		return ObjectInfo{}, s.fail("stat", p, err)
	}
	return ObjectInfo{Path: p, Size: oi.Size, ModTime: oi.LastModified, ETag: oi.ETag}, nil
}

// List implements Store.
func (s *S3) List(ctx context.Context, prefix string) iter.Seq2[ObjectInfo, error] {
	if err := checkPrefix(prefix); err != nil {
		return errorSeq(s.fail("list", prefix, err))
	}
	return func(yield func(ObjectInfo, error) bool) {
		// Cancelling stops minio-go's listing goroutine when the caller stops early.
		ctx, cancel := context.WithCancel(ctx)
		defer cancel()
		for oi := range s.core.Client.ListObjects(ctx, s.cfg.Bucket, minio.ListObjectsOptions{Prefix: s.key(prefix), Recursive: true}) {
			if oi.Err != nil {
				yield(ObjectInfo{}, s.fail("list", prefix, oi.Err))
				return
			}
			info := ObjectInfo{Path: strings.TrimPrefix(oi.Key, s.cfg.Prefix), Size: oi.Size, ModTime: oi.LastModified, ETag: oi.ETag}
			if !yield(info, nil) {
				return
			}
		}
		if err := ctx.Err(); err != nil {
			yield(ObjectInfo{}, s.fail("list", prefix, err))
		}
	}
}

// ReadAt implements Store with one ranged GET.
func (s *S3) ReadAt(ctx context.Context, p string, buf []byte, off int64) (int, error) {
	return s.ReadVersionAt(ctx, p, "", buf, off)
}

// ReadVersionAt implements Store with one ranged GET that S3 answers only if the object's ETag
// is etag (If-Match); any ETag when etag is empty.
func (s *S3) ReadVersionAt(ctx context.Context, p, etag string, buf []byte, off int64) (int, error) {
	if err := checkPath(p); err != nil {
		return 0, s.fail("read", p, err)
	}
	if off < 0 {
		return 0, s.fail("read", p, fmt.Errorf("negative offset %d", off))
	}
	if len(buf) == 0 {
		return 0, nil
	}
	var opts minio.GetObjectOptions
	if err := opts.SetRange(off, off+int64(len(buf))-1); err != nil {
		return 0, s.fail("read", p, err)
	}
	if etag != "" {
		if err := opts.SetMatchETag(etag); err != nil {
			return 0, s.fail("read", p, err)
		}
	}
	body, _, _, err := s.core.GetObject(ctx, s.cfg.Bucket, s.key(p), opts)
	if err != nil {
		if minio.ToErrorResponse(err).Code == "InvalidRange" {
			return 0, io.EOF // the range starts at or past the end
		}
		return 0, s.fail("read", p, err)
	}
	defer func() { _ = body.Close() }() // read-only: a failed close loses nothing
	n, err := io.ReadFull(ctxReader{ctx, body}, buf)
	if errors.Is(err, io.ErrUnexpectedEOF) || errors.Is(err, io.EOF) {
		return n, io.EOF
	}
	if err != nil {
		return n, s.fail("read", p, err)
	}
	return n, nil
}

// Open implements Store.
func (s *S3) Open(ctx context.Context, p string) (io.ReadCloser, error) {
	if err := checkPath(p); err != nil {
		return nil, s.fail("open", p, err)
	}
	body, _, _, err := s.core.GetObject(ctx, s.cfg.Bucket, s.key(p), minio.GetObjectOptions{})
	if err != nil {
		return nil, s.fail("open", p, err)
	}
	return body, nil
}

// Write implements Store.
func (s *S3) Write(ctx context.Context, p string, r io.Reader, size int64, pre Precondition) (string, error) {
	if err := checkPath(p); err != nil {
		return "", s.fail("write", p, err)
	}
	// S3's conditional writes (If-Match, If-None-Match): the server checks them when the object
	// lands, at the PUT or at the completion of a multipart upload.
	var opts minio.PutObjectOptions
	switch {
	case pre.Absent:
		opts.SetMatchETagExcept("*")
	case pre.ETag != "":
		opts.SetMatchETag(pre.ETag)
	}
	info, err := s.core.Client.PutObject(ctx, s.cfg.Bucket, s.key(p), r, size, opts)
	if err != nil {
		return "", s.fail("write", p, err)
	}
	return info.ETag, nil
}

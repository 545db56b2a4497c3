package understore

import (
	"context"
	"crypto/tls"
	"errors"
	"io"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/internal/miniotest"
)

// listAll lists a store from its root.
func listAll(ctx context.Context, s Store) ([]string, error) { return collect(s.List(ctx, "")) }

func readAll(ctx context.Context, s Store, p string) (string, error) {
	r, err := s.Open(ctx, p)
	if err != nil {
		return "", err
	}
	defer func() { _ = r.Close() }()
	b, err := io.ReadAll(r)
	return string(b), err
}

// isNilStore is true only for a nil interface: a nil *Local in a Store is not nil.
func isNilStore(s Store) bool { return s == nil }

func TestOpenPicksTheStoreOfTheSourceURI(t *testing.T) {
	ctx := context.Background()
	keys := map[string]string{CredentialAccessKeyID: "id", CredentialSecretAccessKey: "secret"}

	roots := t.TempDir()
	dataset := filepath.Join(roots, "sets", "v1")
	must(t, os.MkdirAll(filepath.Join(dataset, "dir"), 0o750))
	must(t, os.WriteFile(filepath.Join(dataset, "dir", "a.txt"), []byte("local bytes"), 0o640))

	var gotAuth string
	web := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotAuth = r.Header.Get("Authorization")
		if r.URL.Path != "/sets/v1/a.txt" {
			http.NotFound(w, r)
			return
		}
		_, _ = io.WriteString(w, "web bytes")
	}))
	t.Cleanup(web.Close)

	cases := map[string]struct {
		src Source
		// name is what the store's String must contain; kind the error it must fail with.
		name    string
		kind    error
		message []string
		// check runs against the opened store.
		check func(g *WithT, s Store)
	}{
		"an s3 source with an http endpoint talks plain HTTP to host:port": {
			src:  Source{URI: "s3://bucket/some/prefix", Endpoint: "http://minio.storage:9000", Credentials: keys},
			name: "s3://bucket/some/prefix/ at http://minio.storage:9000",
		},
		"an s3 source with an https endpoint uses TLS": {
			src:  Source{URI: "s3://bucket", Endpoint: "https://objects.example.com/", Credentials: keys},
			name: "s3://bucket/ at https://objects.example.com",
		},
		"an s3 source without an endpoint reads AWS S3 over TLS": {
			src:  Source{URI: "s3://bucket/p", Region: "eu-west-1", Credentials: keys},
			name: "s3://bucket/p/ at https://s3.amazonaws.com",
		},
		"an s3 source keeps its prefix as written, spaces and all": {
			src:  Source{URI: "s3://bucket/my data/été", Endpoint: "http://h:1", Credentials: keys},
			name: "s3://bucket/my data/été/ at http://h:1",
		},
		"an s3 source without credentials is a public bucket, read anonymously": {
			src:  Source{URI: "s3://bucket/p", Endpoint: "http://h:1"},
			name: "s3://bucket/p/ at http://h:1",
		},
		"an s3 source with only an access key id names the missing secret key": {
			src:     Source{URI: "s3://bucket/p", Credentials: map[string]string{CredentialAccessKeyID: "id"}},
			kind:    ErrMissingCredentials,
			message: []string{"no secretAccessKey", "spec.source.secretRef"},
		},
		"an s3 source with only a session token names both keys": {
			src:     Source{URI: "s3://bucket/p", Credentials: map[string]string{CredentialSessionToken: "t"}},
			kind:    ErrMissingCredentials,
			message: []string{"no accessKeyID or secretAccessKey"},
		},
		"an s3 source with a web identity is read as the role": {
			src: Source{URI: "s3://bucket/p", Endpoint: "http://h:1", Credentials: map[string]string{
				CredentialWebIdentityToken: "jwt", CredentialRoleARN: "arn:aws:iam::1:role/r"}},
			name: "s3://bucket/p/ at http://h:1",
		},
		"a web identity without a role names the missing key": {
			src:     Source{URI: "s3://bucket/p", Credentials: map[string]string{CredentialWebIdentityToken: "jwt"}},
			kind:    ErrMissingCredentials,
			message: []string{"needs both webIdentityToken and roleARN"},
		},
		"a web identity beside keys is refused": {
			src: Source{URI: "s3://bucket/p", Credentials: map[string]string{
				CredentialWebIdentityToken: "jwt", CredentialRoleARN: "arn:aws:iam::1:role/r", CredentialAccessKeyID: "id"}},
			kind:    ErrInvalidPath,
			message: []string{"both keys (accessKeyID) and a web identity", "keep one"},
		},
		"a web identity with an STS endpoint that is not a URL is refused": {
			src: Source{URI: "s3://bucket/p", Credentials: map[string]string{
				CredentialWebIdentityToken: "jwt", CredentialRoleARN: "arn:aws:iam::1:role/r", CredentialSTSEndpoint: "sts.example.com"}},
			kind:    ErrInvalidPath,
			message: []string{`STS endpoint "sts.example.com"`},
		},
		"an s3 source without a bucket is refused": {
			src:     Source{URI: "s3:///p", Credentials: keys},
			kind:    ErrInvalidPath,
			message: []string{"no bucket"},
		},
		"an endpoint with a path is refused": {
			src:     Source{URI: "s3://bucket", Endpoint: "http://h:9000/base", Credentials: keys},
			kind:    ErrInvalidPath,
			message: []string{"take no path"},
		},
		"an endpoint without a scheme is refused": {
			src:     Source{URI: "s3://bucket", Endpoint: "h:9000", Credentials: keys},
			kind:    ErrInvalidPath,
			message: []string{"want http://host:port"},
		},
		"an endpoint on a source that is not s3 is refused": {
			src:     Source{URI: "https://example.com/x", Endpoint: "http://h:9000"},
			kind:    ErrInvalidPath,
			message: []string{"only applies to s3://"},
		},
		"a file source under the allowed roots lists and reads its files": {
			src:  Source{URI: "file://" + dataset, FileRoots: []string{roots}},
			name: "file://" + dataset,
			check: func(g *WithT, s Store) {
				g.Expect(listAll(ctx, s)).To(Equal([]string{"dir/a.txt"}))
				g.Expect(readAll(ctx, s, "dir/a.txt")).To(Equal("local bytes"))
				c, ok := s.(io.Closer)
				g.Expect(ok).To(BeTrue(), "a local store holds a directory open and says how to release it")
				g.Expect(c.Close()).To(Succeed())
			},
		},
		"a file source outside the allowed roots is refused": {
			src:     Source{URI: "file://" + dataset, FileRoots: []string{filepath.Join(roots, "elsewhere")}},
			kind:    ErrOutsideRoots,
			message: []string{dataset},
		},
		"a file source with a host is refused": {
			src:     Source{URI: "file://node-1/data", FileRoots: []string{"/"}},
			kind:    ErrInvalidPath,
			message: []string{"file:///path"},
		},
		"an https source sends a bearer token": {
			src:  Source{URI: web.URL + "/sets/v1", Credentials: map[string]string{CredentialToken: "t0k"}},
			name: web.URL + "/sets/v1",
			check: func(g *WithT, s Store) {
				g.Expect(readAll(ctx, s, "a.txt")).To(Equal("web bytes"))
				g.Expect(gotAuth).To(Equal("Bearer t0k"))
			},
		},
		"an http source sends basic credentials": {
			src: Source{URI: web.URL + "/sets/v1", Credentials: map[string]string{CredentialUsername: "ann", CredentialPassword: "pw"}},
			check: func(g *WithT, s Store) {
				g.Expect(readAll(ctx, s, "a.txt")).To(Equal("web bytes"))
				g.Expect(gotAuth).To(Equal("Basic YW5uOnB3"))
			},
		},
		"an http source with a user name and no password names the password": {
			src:     Source{URI: web.URL, Credentials: map[string]string{CredentialUsername: "ann"}},
			kind:    ErrMissingCredentials,
			message: []string{"no password"},
		},
		"an http source with both a token and a password is refused": {
			src:     Source{URI: web.URL, Credentials: map[string]string{CredentialToken: "t", CredentialUsername: "ann", CredentialPassword: "pw"}},
			kind:    ErrInvalidPath,
			message: []string{"keep one"},
		},
		"a pvc source without a claim server says where the server comes from": {
			src:     Source{URI: "pvc://claim/path", Credentials: map[string]string{CredentialToken: "t"}},
			kind:    ErrInvalidPath,
			message: []string{"no claim server", "PersistentVolume"},
		},
		"a pvc source without the claim server's token is refused": {
			src:     Source{URI: "pvc://claim/path", Endpoint: "http://claim.ns.svc:8480"},
			kind:    ErrMissingCredentials,
			message: []string{"no token", "pvc://claim/path"},
		},
		"a pvc source without a certificate to show its claim server is refused": {
			src:     Source{URI: "pvc://claim/path", Endpoint: "https://claim.ns.svc:8480", Credentials: map[string]string{CredentialToken: "t"}},
			kind:    ErrMissingCredentials,
			message: []string{"mutual TLS"},
		},
		"a pvc source reads through its claim server": {
			src: Source{
				URI: "pvc://claim/path", Endpoint: "https://claim.ns.svc:8480", Credentials: map[string]string{CredentialToken: "t"},
				ClaimServerTLS: &tls.Config{MinVersion: tls.VersionTLS13},
			},
			name: "pvc://claim/path",
		},
		"a URI without a scheme says what it wants": {
			src:     Source{URI: "bucket/prefix"},
			kind:    ErrInvalidPath,
			message: []string{"want s3://bucket/prefix"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			s, err := Open(ctx, tc.src)
			if tc.kind != nil {
				g.Expect(err).To(MatchError(tc.kind))
				g.Expect(isNilStore(s)).To(BeTrue(), "a failed Open returns a nil Store, not a typed nil in it")
				var uerr *Error
				g.Expect(errors.As(err, &uerr)).To(BeTrue(), "failures are *understore.Error")
				for _, m := range tc.message {
					g.Expect(err.Error()).To(ContainSubstring(m))
				}
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(s.String()).To(ContainSubstring(tc.name))
			if tc.check != nil {
				tc.check(g, s)
			}
		})
	}
}

func TestOpenS3SourceListsAndReadsFromMinIO(t *testing.T) {
	srv := miniotest.Start(t)
	srv.MakeBucket(t, "datasets")
	srv.Put(t, "datasets", "train/v1/données/été 2024.csv", []byte("a,b\n1,2\n"))
	srv.Put(t, "datasets", "train/v1/labels.txt", []byte("cat\n"))
	srv.Put(t, "datasets", "train/v2/labels.txt", []byte("not in the prefix"))
	ctx := context.Background()
	src := Source{
		URI:      "s3://datasets/train/v1",
		Endpoint: "http://" + srv.Endpoint,
		Credentials: map[string]string{
			CredentialAccessKeyID:     miniotest.AccessKey,
			CredentialSecretAccessKey: miniotest.SecretKey,
		},
	}

	t.Run("the store lists and reads the objects under the prefix", func(t *testing.T) {
		g := NewWithT(t)
		s, err := Open(ctx, src)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(listAll(ctx, s)).To(Equal([]string{"données/été 2024.csv", "labels.txt"}))
		g.Expect(readAll(ctx, s, "données/été 2024.csv")).To(Equal("a,b\n1,2\n"))
	})

	t.Run("a wrong secret key fails the first request as access denied, naming the bucket", func(t *testing.T) {
		g := NewWithT(t)
		bad := src
		bad.Credentials = map[string]string{CredentialAccessKeyID: miniotest.AccessKey, CredentialSecretAccessKey: "wrong"}
		s, err := Open(ctx, bad)
		g.Expect(err).NotTo(HaveOccurred(), "opening does not contact the store")
		_, err = listAll(ctx, s)
		g.Expect(err).To(MatchError(ErrAccessDenied))
		g.Expect(strings.Contains(err.Error(), "s3://datasets/train/v1/")).To(BeTrue(), err.Error())
	})
}

package understore

import (
	"bytes"
	"context"
	"crypto/rand"
	"crypto/tls"
	"errors"
	"io"
	"iter"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"testing"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
)

const claimToken = "0123456789abcdef0123"

// claimServerIdentity is the test claim server's; its certificate is for "localhost".
var claimServerIdentity = pki.ClaimServer("team-a", "raw-claim-server")

// serveClaim serves store as a claim server over mutual TLS with a certificate of ca (a new CA
// when nil), and opens the pvc:// store that reads it as a worker, sending token.
func serveClaim(t *testing.T, ca *pkitest.Authority, store Store, token string) (*httptest.Server, Store) {
	t.Helper()
	if ca == nil {
		ca = pkitest.New(t)
	}
	srv := startClaimServer(t, ClaimServerTLS(ca.Credentials(t, claimServerIdentity)), store)
	c, err := Open(context.Background(), claimSource(srv.URL, token, ClaimClientTLS(ca.Credentials(t, pki.Worker("pool", "node-a")))))
	if err != nil {
		t.Fatal(err)
	}
	return srv, c
}

func startClaimServer(t *testing.T, tlsConfig *tls.Config, store Store) *httptest.Server {
	t.Helper()
	h, err := NewClaimServer(store, claimToken, logr.Discard())
	if err != nil {
		t.Fatal(err)
	}
	return startTLS(t, tlsConfig, h)
}

// startTLS serves h over tlsConfig until the test ends.
func startTLS(t *testing.T, tlsConfig *tls.Config, h http.Handler) *httptest.Server {
	t.Helper()
	srv := httptest.NewUnstartedServer(h)
	srv.TLS = tlsConfig
	srv.StartTLS()
	t.Cleanup(srv.Close)
	return srv
}

func claimSource(endpoint, token string, tlsConfig *tls.Config) Source {
	return Source{
		URI: "pvc://claim/dataset", Endpoint: endpoint, ClaimServerTLS: tlsConfig, ClaimServerName: "localhost",
		Credentials: map[string]string{CredentialToken: token},
	}
}

func TestAClaimIsReadThroughItsServerAsIfLocal(t *testing.T) {
	ctx := context.Background()
	f := newLocalFixture(t)
	big := make([]byte, 3<<20+17)
	_, _ = rand.Read(big)
	must(t, os.MkdirAll(filepath.Join(f.dataset, "données", "été 2024"), 0o750))
	must(t, os.WriteFile(filepath.Join(f.dataset, "données", "été 2024", "big file.bin"), big, 0o640))
	local, err := NewLocal(LocalConfig{Dir: f.dataset, AllowedRoots: []string{f.allowed}})
	must(t, err)
	t.Cleanup(func() { _ = local.Close() })
	_, claim := serveClaim(t, nil, local, claimToken)

	t.Run("it lists what the claim holds, prefixes included", func(t *testing.T) {
		g := NewWithT(t)
		for _, prefix := range []string{"", "dir/", "dir", "données/", "nothing/"} {
			want, wantErr := collect(local.List(ctx, prefix))
			got, err := collect(claim.List(ctx, prefix))
			g.Expect(wantErr).NotTo(HaveOccurred())
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(want), "prefix %q", prefix)
		}
	})

	t.Run("stat, ranged reads and whole reads give the claim's bytes", func(t *testing.T) {
		g := NewWithT(t)
		p := "données/été 2024/big file.bin"
		info, err := claim.Stat(ctx, p)
		g.Expect(err).NotTo(HaveOccurred())
		want, _ := local.Stat(ctx, p)
		g.Expect(info.Size).To(Equal(int64(len(big))))
		g.Expect(info.ModTime.Unix()).To(Equal(want.ModTime.Unix()))
		for _, rng := range [][2]int64{{0, 1}, {1 << 20, 1 << 20}, {int64(len(big)) - 5, 5}} {
			buf := make([]byte, rng[1])
			n, err := claim.ReadAt(ctx, p, buf, rng[0])
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(buf[:n]).To(Equal(big[rng[0] : rng[0]+rng[1]]))
		}
		buf := make([]byte, 10)
		n, err := claim.ReadAt(ctx, p, buf, int64(len(big))-3)
		g.Expect(err).To(MatchError(io.EOF), "a read past the end is short, with io.EOF")
		g.Expect(buf[:n]).To(Equal(big[len(big)-3:]))
		whole, err := readAll(ctx, claim, p)
		g.Expect(err).NotTo(HaveOccurred())
		g.Expect(bytes.Equal([]byte(whole), big)).To(BeTrue())
	})

	t.Run("nothing outside the claim's folder can be read, by link or by path", func(t *testing.T) {
		g := NewWithT(t)
		for _, p := range []string{"file-out", "relative-out", "dir-out/key"} {
			_, err := claim.Stat(ctx, p)
			g.Expect(err).To(MatchError(ErrNotFound), p)
		}
		_, err := claim.Stat(ctx, "../secret/key")
		g.Expect(err).To(MatchError(ErrOutsideRoots), "the client refuses a path with ..")
	})

	t.Run("a missing object is not found and names the source", func(t *testing.T) {
		g := NewWithT(t)
		_, err := claim.Open(ctx, "dir/missing.txt")
		g.Expect(err).To(MatchError(ErrNotFound))
		g.Expect(err.Error()).To(ContainSubstring("pvc://claim/dataset/dir/missing.txt"))
	})

	t.Run("the claim is read-only", func(t *testing.T) {
		g := NewWithT(t)
		_, err := claim.Write(ctx, "new.txt", bytes.NewReader([]byte("x")), 1, Precondition{})
		g.Expect(err).To(MatchError(ErrReadOnly))
	})
}

func TestAClaimServerServesOnlyItsToken(t *testing.T) {
	ctx := context.Background()
	f := newLocalFixture(t)
	local, err := NewLocal(LocalConfig{Dir: f.dataset, AllowedRoots: []string{f.allowed}})
	must(t, err)
	t.Cleanup(func() { _ = local.Close() })
	ca := pkitest.New(t)
	srv, wrong := serveClaim(t, ca, local, "not-the-token-at-all")

	g := NewWithT(t)
	_, err = wrong.Stat(ctx, "a.txt")
	g.Expect(err).To(MatchError(ErrAccessDenied))
	_, err = collect(wrong.List(ctx, ""))
	g.Expect(err).To(MatchError(ErrAccessDenied))

	worker := ClaimClientTLS(ca.Credentials(t, pki.Worker("pool", "node-a")))
	worker.ServerName = "localhost"
	resp, err := (&http.Client{Transport: &http.Transport{TLSClientConfig: worker}}).Get(srv.URL + "/objects/a.txt")
	g.Expect(err).NotTo(HaveOccurred())
	_ = resp.Body.Close()
	g.Expect(resp.StatusCode).To(Equal(http.StatusUnauthorized), "a worker's request without a token")

	_, err = NewClaimServer(local, "short", logr.Discard())
	g.Expect(err).To(MatchError(ContainSubstring("shorter than 16")))
}

func TestAClaimServerServesStrataWorkersAndOperatorAlone(t *testing.T) {
	ctx := context.Background()
	f := newLocalFixture(t)
	local, err := NewLocal(LocalConfig{Dir: f.dataset, AllowedRoots: []string{f.allowed}})
	must(t, err)
	t.Cleanup(func() { _ = local.Close() })
	ca, otherCA := pkitest.New(t), pkitest.New(t)
	srv := startClaimServer(t, ClaimServerTLS(ca.Credentials(t, claimServerIdentity)), local)

	for name, tc := range map[string]struct {
		client *tls.Config
		// serverName is the name the client expects; the server's certificate is for localhost.
		serverName string
		served     bool
	}{
		"a worker":     {client: ClaimClientTLS(ca.Credentials(t, pki.Worker("pool", "node-a"))), served: true},
		"the operator": {client: ClaimClientTLS(ca.Credentials(t, pki.Operator())), served: true},
		"a CSI node plugin, which has no business with sources": {
			client: ClaimClientTLS(ca.Credentials(t, pki.CSINode("node-a"))),
		},
		"another namespace's claim server, whose key its namespace can read": {
			client: ClaimClientTLS(ca.Credentials(t, pki.ClaimServer("team-b", "raw-claim-server"))),
		},
		"a worker of another CA":         {client: ClaimClientTLS(otherCA.CredentialsTrusting(t, pki.Worker("pool", "node-a"), ca))},
		"a client without a certificate": {client: &tls.Config{RootCAs: ca.CA.Pool(), MinVersion: tls.VersionTLS13}},
		"a worker that expects another claim server": {
			client: ClaimClientTLS(ca.Credentials(t, pki.Worker("pool", "node-a"))), serverName: "raw-claim-server.team-b.svc",
		},
	} {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			src := claimSource(srv.URL, claimToken, tc.client)
			if tc.serverName != "" {
				src.ClaimServerName = tc.serverName
			}
			claim, err := Open(ctx, src)
			g.Expect(err).NotTo(HaveOccurred())
			_, err = claim.Stat(ctx, "a.txt")
			if tc.served {
				g.Expect(err).NotTo(HaveOccurred())
				return
			}
			g.Expect(err).To(HaveOccurred())
			g.Expect(err).NotTo(MatchError(ErrNotFound))
		})
	}

	t.Run("a server that is not a claim server is not read from", func(t *testing.T) {
		g := NewWithT(t)
		impostor := startClaimServer(t, ClaimServerTLS(ca.Credentials(t, pki.Worker("pool", "node-b"))), local)
		claim, err := Open(ctx, claimSource(impostor.URL, claimToken, ClaimClientTLS(ca.Credentials(t, pki.Worker("pool", "node-a")))))
		g.Expect(err).NotTo(HaveOccurred())
		_, err = claim.Stat(ctx, "a.txt")
		g.Expect(err).To(MatchError(ContainSubstring("claim-server")))
	})

	t.Run("plain HTTP gets no object", func(t *testing.T) {
		g := NewWithT(t)
		resp, err := http.Get("http://" + srv.Listener.Addr().String() + "/objects/a.txt")
		if err == nil {
			_ = resp.Body.Close()
			g.Expect(resp.StatusCode).To(Equal(http.StatusBadRequest), "Go's TLS server answers plain HTTP with 400")
		}
	})

	t.Run("an endpoint of a volume made before claim servers spoke TLS is read over TLS", func(t *testing.T) {
		g := NewWithT(t)
		claim, err := Open(ctx, claimSource("http://"+srv.Listener.Addr().String(), claimToken,
			ClaimClientTLS(ca.Credentials(t, pki.Worker("pool", "node-a")))))
		g.Expect(err).NotTo(HaveOccurred())
		_, err = claim.Stat(ctx, "a.txt")
		g.Expect(err).NotTo(HaveOccurred())
	})
}

// failingList lists two objects and then fails as kind.
type failingList struct {
	Store
	kind error
}

func (f failingList) List(context.Context, string) iter.Seq2[ObjectInfo, error] {
	return func(yield func(ObjectInfo, error) bool) {
		if yield(ObjectInfo{Path: "a", Size: 1}, nil) && yield(ObjectInfo{Path: "b", Size: 2}, nil) {
			yield(ObjectInfo{}, &Error{Op: "list", Store: "file:///claim", Kind: f.kind, Err: errors.New("boom")})
		}
	}
}

func TestAClaimListingThatFailsOrBreaksOffIsAnError(t *testing.T) {
	ctx := context.Background()
	g := NewWithT(t)
	ca := pkitest.New(t)
	_, claim := serveClaim(t, ca, failingList{kind: ErrAccessDenied}, claimToken)
	got, err := collect(claim.List(ctx, ""))
	g.Expect(got).To(Equal([]string{"a", "b"}))
	g.Expect(err).To(MatchError(ErrAccessDenied), "the kind crosses the wire")
	g.Expect(err.Error()).To(ContainSubstring("boom"))

	cut := startTLS(t, ClaimServerTLS(ca.Credentials(t, claimServerIdentity)), http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = io.WriteString(w, `{"path":"a","size":1}`+"\n")
	}))
	broken, err := Open(ctx, claimSource(cut.URL, claimToken, ClaimClientTLS(ca.Credentials(t, pki.Worker("pool", "node-a")))))
	g.Expect(err).NotTo(HaveOccurred())
	got, err = collect(broken.List(ctx, ""))
	g.Expect(got).To(Equal([]string{"a"}))
	g.Expect(err).To(MatchError(ContainSubstring("without its end line")))
}

func collect(seq iter.Seq2[ObjectInfo, error]) ([]string, error) {
	var out []string
	for info, err := range seq {
		if err != nil {
			return out, err
		}
		out = append(out, info.Path)
	}
	return out, nil
}

// streamOnly is a store whose Open cannot seek, as an object store's stream cannot.
type streamOnly struct{ Store }

func (s streamOnly) Open(ctx context.Context, p string) (io.ReadCloser, error) {
	rc, err := s.Store.Open(ctx, p)
	if err != nil {
		return nil, err
	}
	return struct{ io.ReadCloser }{rc}, nil
}

func TestAClaimServerOverAStoreThatCannotSeekServesRangesThroughReadAt(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	f := newLocalFixture(t)
	local, err := NewLocal(LocalConfig{Dir: f.dataset, AllowedRoots: []string{f.allowed}})
	must(t, err)
	t.Cleanup(func() { _ = local.Close() })
	_, claim := serveClaim(t, nil, streamOnly{local}, claimToken)
	buf := make([]byte, 4)
	n, err := claim.ReadAt(ctx, "a.txt", buf, 3)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(string(buf[:n])).To(Equal("3456"))
	whole, err := readAll(ctx, claim, "a.txt")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(whole).To(Equal("0123456789"))
}

package main

import (
	"context"
	"crypto/tls"
	"errors"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/internal/miniotest"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
)

// claimServerFiles writes what the operator's Secrets hold for a claim server into dir: the
// token, and a certificate for id with Strata's CA.
func claimServerFiles(t *testing.T, ca *pkitest.Authority, dir string, id pki.Identity) {
	t.Helper()
	cert, key, err := ca.CA.IssueKeyPair(pki.Leaf{Identity: id, DNSNames: []string{"localhost"}}, time.Now())
	if err != nil {
		t.Fatal(err)
	}
	for name, data := range map[string][]byte{claimTLSCert: cert, claimTLSKey: key, claimTLSCA: ca.CA.CertPEM} {
		// As the kubelet updates a Secret volume: the new file replaces the old at once.
		tmp := filepath.Join(dir, "."+name)
		if err := os.WriteFile(tmp, data, 0o600); err != nil {
			t.Fatal(err)
		}
		if err := os.Rename(tmp, filepath.Join(dir, name)); err != nil {
			t.Fatal(err)
		}
	}
}

func TestTheClaimServerSpeaksMutualTLSAndTakesRenewedCertificates(t *testing.T) {
	g := NewWithT(t)
	ctx, cancel := context.WithCancel(context.Background())
	ca := pkitest.New(t)
	claim, tlsDir := t.TempDir(), t.TempDir()
	g.Expect(os.MkdirAll(filepath.Join(claim, "sets"), 0o750)).To(Succeed())
	g.Expect(os.WriteFile(filepath.Join(claim, "sets", "a.bin"), []byte("hello"), 0o640)).To(Succeed())
	token := filepath.Join(t.TempDir(), "token")
	g.Expect(os.WriteFile(token, []byte("0123456789abcdef0123\n"), 0o600)).To(Succeed())
	id := pki.ClaimServer("team-a", "raw-claim-server")
	claimServerFiles(t, ca, tlsDir, id)
	opts := claimServerOptions{
		claim: claim, sub: "sets", tokenFile: token, tlsDir: tlsDir,
		listen: miniotest.ClosedAddr(t), healthListen: miniotest.ClosedAddr(t), refresh: 10 * time.Millisecond,
	}
	done := make(chan error, 1)
	go func() { done <- runClaimServer(ctx, opts, logr.Discard()) }()
	t.Cleanup(func() {
		cancel()
		if err := <-done; err != nil {
			t.Errorf("the claim server stopped with %v", err)
		}
	})

	g.Eventually(func() (int, error) {
		resp, err := http.Get("http://" + opts.healthListen + "/healthz")
		if err != nil {
			return 0, err
		}
		_ = resp.Body.Close()
		return resp.StatusCode, nil
	}).Should(Equal(http.StatusOK), "the kubelet's probe is answered in plain HTTP")

	worker := understore.ClaimClientTLS(ca.Credentials(t, pki.Worker("pool", "node-a")))
	src := understore.Source{
		URI: "pvc://raw/sets", Endpoint: "https://" + opts.listen, ClaimServerTLS: worker, ClaimServerName: "localhost",
		Credentials: map[string]string{understore.CredentialToken: "0123456789abcdef0123"},
	}
	store, err := understore.Open(ctx, src)
	g.Expect(err).NotTo(HaveOccurred())
	info, err := store.Stat(ctx, "a.bin")
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(info.Size).To(BeEquivalentTo(5))

	csiNode := understore.ClaimClientTLS(ca.Credentials(t, pki.CSINode("node-a")))
	refused := src
	refused.ClaimServerTLS = csiNode
	store, err = understore.Open(ctx, refused)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = store.Stat(ctx, "a.bin")
	g.Expect(err).To(HaveOccurred(), "a CSI node plugin is no reader of claims")

	serverSerial := func() (string, error) {
		cfg := worker.Clone()
		cfg.ServerName = "localhost"
		conn, err := tls.Dial("tcp", opts.listen, cfg)
		if err != nil {
			return "", err
		}
		defer func() { _ = conn.Close() }()
		if err := conn.Handshake(); err != nil {
			return "", err
		}
		return conn.ConnectionState().PeerCertificates[0].SerialNumber.String(), nil
	}
	before, err := serverSerial()
	g.Expect(err).NotTo(HaveOccurred())
	claimServerFiles(t, ca, tlsDir, id)
	g.Eventually(serverSerial).ShouldNot(Equal(before), "the renewed certificate is served without a restart")
}

func TestTheClaimServerRefusesACertificateThatIsNotAClaimServers(t *testing.T) {
	g := NewWithT(t)
	ca := pkitest.New(t)
	tlsDir := t.TempDir()
	claimServerFiles(t, ca, tlsDir, pki.Worker("pool", "node-a"))
	_, err := claimServerCredentials(tlsDir)
	g.Expect(err).To(MatchError(ContainSubstring("not a claim server")))
	_, err = claimServerCredentials(t.TempDir())
	g.Expect(err).To(MatchError(ContainSubstring("reading Strata's CA")))
	g.Expect(errors.Is(err, os.ErrNotExist)).To(BeTrue())
}

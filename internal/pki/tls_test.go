package pki_test

import (
	"context"
	"crypto/tls"
	"io"
	"net"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
)

// serve accepts TLS connections with cfg and echoes one line of each, until the test ends.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	lis, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = lis.Close() })
	go func() {
		for {
			c, err := lis.Accept()
			if err != nil {
				return
			}
			go func() {
				defer func() { _ = c.Close() }()
				_, _ = io.CopyN(c, c, 5)
			}()
		}
	}()
	return lis.Addr().String()
}

// roundTrip dials addr with cfg and sends five bytes back and forth.
func roundTrip(addr string, cfg *tls.Config) error {
	cfg = cfg.Clone()
	cfg.ServerName = "localhost"
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()
	if _, err := c.Write([]byte("hello")); err != nil {
		return err
	}
	_, err = io.ReadFull(c, make([]byte, 5))
	return err
}

func TestMutualTLS(t *testing.T) {
	ca, other := pkitest.New(t), pkitest.New(t)
	master := ca.Credentials(t, pki.Master("m-0"))
	addr := serve(t, master.ServerConfig())
	raftAddr := serve(t, master.ServerConfig(pki.RoleMaster))

	noCert := pki.NewCredentials(ca.CA.Pool()).ClientConfig(pki.RoleMaster)
	cases := map[string]struct {
		addr    string
		client  *tls.Config
		refused bool
	}{
		"a worker of the same CA is served":                       {addr: addr, client: ca.Credentials(t, pki.Worker("p", "n")).ClientConfig(pki.RoleMaster)},
		"a client with no certificate is refused":                 {addr: addr, client: noCert, refused: true},
		"a certificate of another CA is refused":                  {addr: addr, client: other.CredentialsTrusting(t, pki.Operator(), ca).ClientConfig(), refused: true},
		"a client that expects a worker refuses the master":       {addr: addr, client: ca.Credentials(t, pki.Operator()).ClientConfig(pki.RoleWorker), refused: true},
		"the Raft port serves a master":                           {addr: raftAddr, client: ca.Credentials(t, pki.Master("m-1")).ClientConfig(pki.RoleMaster)},
		"the Raft port refuses a worker with a valid certificate": {addr: raftAddr, client: ca.Credentials(t, pki.Worker("p", "n")).ClientConfig(pki.RoleMaster), refused: true},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			err := roundTrip(tc.addr, tc.client)
			if tc.refused {
				NewWithT(t).Expect(err).To(HaveOccurred())
			} else {
				NewWithT(t).Expect(err).NotTo(HaveOccurred())
			}
		})
	}
}

func TestServerRefusesTLSBelow13(t *testing.T) {
	ca := pkitest.New(t)
	addr := serve(t, ca.Credentials(t, pki.Master("m-0")).ServerConfig())
	cfg := ca.Credentials(t, pki.Worker("p", "n")).ClientConfig()
	cfg.MinVersion, cfg.MaxVersion = tls.VersionTLS12, tls.VersionTLS12
	NewWithT(t).Expect(roundTrip(addr, cfg)).To(HaveOccurred())
}

// countingObtainer certifies with a local CA and counts how often it was asked.
type countingObtainer struct {
	pki.LocalObtainer
	asked chan struct{}
}

func (o countingObtainer) Obtain(ctx context.Context, csr []byte) ([]byte, error) {
	o.asked <- struct{}{}
	return o.LocalObtainer.Obtain(ctx, csr)
}

func TestRenewerReplacesTheCertificateWithoutDroppingTheServer(t *testing.T) {
	g := NewWithT(t)
	ca := pkitest.New(t)
	creds := pki.NewCredentials(ca.CA.Pool())
	src := countingObtainer{LocalObtainer: pki.LocalObtainer{CA: ca.CA, Leaf: pki.Leaf{
		Identity: pki.Master("m-0"), DNSNames: []string{"localhost"},
	}}, asked: make(chan struct{}, 4)}
	waits := make(chan time.Duration, 4)
	fire := make(chan time.Time)
	r := &pki.Renewer{Credentials: creds, Source: src, Log: logr.Discard(), After: func(d time.Duration) <-chan time.Time {
		waits <- d
		return fire
	}}
	g.Expect(r.First(context.Background())).To(Succeed())
	<-src.asked
	addr := serve(t, creds.ServerConfig())
	client := ca.Credentials(t, pki.Worker("p", "n")).ClientConfig(pki.RoleMaster)
	g.Expect(roundTrip(addr, client)).To(Succeed())
	serial := func() string {
		cert, err := creds.ServerConfig().GetCertificate(nil)
		g.Expect(err).NotTo(HaveOccurred())
		return cert.Leaf.SerialNumber.String()
	}
	first := serial()

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() { r.Run(ctx); close(done) }()
	defer func() { cancel(); <-done }()
	wait := <-waits
	g.Expect(wait).To(BeNumerically("~", pki.LeafValidity*2/3, 10*time.Minute), "renewal after two thirds of the lifetime (and the skew)")

	fire <- time.Now()
	<-src.asked
	<-waits // the next renewal is scheduled once the new certificate is in
	g.Expect(serial()).NotTo(Equal(first), "a new certificate is in place")
	g.Expect(roundTrip(addr, client)).To(Succeed(), "the server serves the renewed certificate with no restart")
}

func TestCredentialsRefuseACertificateOfAnotherIdentity(t *testing.T) {
	ca := pkitest.New(t)
	creds := ca.Credentials(t, pki.Worker("p", "n"))
	cert, key := ca.Issue(t, pki.Worker("p", "other"))
	NewWithT(t).Expect(creds.Set(cert, key)).To(MatchError(ContainSubstring("not spiffe://strata.dev/worker/p/n")))
}

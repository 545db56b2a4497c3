package store_test

import (
	"crypto/tls"
	"net"
	"testing"
	"time"

	. "github.com/onsi/gomega"

	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
	"github.com/strata-cache/strata/master/mastertest"
	"github.com/strata-cache/strata/master/store"
)

// TestRaftOverMutualTLS runs three replicas whose Raft transport speaks mutual TLS with their
// masters' certificates, and checks that a peer without a master's certificate from the CA
// cannot even finish a handshake, while the replicas replicate on.
func TestRaftOverMutualTLS(t *testing.T) {
	g := NewWithT(t)
	ctx := deadline(t, time.Minute)
	ca, other := pkitest.New(t), pkitest.New(t)
	c := mastertest.New(t, 3, mastertest.Options{Transport: mastertest.TCP, Tune: func(cfg *store.Config) {
		creds := ca.Credentials(t, pki.Master(cfg.ID))
		cfg.RaftTLS = &store.RaftTLS{Server: creds.ServerConfig(pki.RoleMaster), Client: creds.ClientConfig(pki.RoleMaster)}
	}})
	createFiles(ctx, t, c, "tls", 20)
	leader, err := c.Leader(ctx)
	g.Expect(err).NotTo(HaveOccurred())

	handshake := func(cfg *tls.Config) error {
		cfg = cfg.Clone()
		cfg.ServerName = "127.0.0.1"
		conn, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", leader.RaftAddr, cfg)
		if err != nil {
			return err
		}
		defer func() { _ = conn.Close() }()
		// In TLS 1.3 the server checks the client's certificate after the client's side of
		// the handshake is done: its refusal arrives on the first read.
		_ = conn.SetReadDeadline(time.Now().Add(5 * time.Second))
		_, err = conn.Read(make([]byte, 1))
		return err
	}
	for name, cfg := range map[string]*tls.Config{
		"no certificate":                {MinVersion: tls.VersionTLS13, RootCAs: ca.CA.Pool()},
		"a master's of another CA":      other.CredentialsTrusting(t, pki.Master("master-9"), ca).ClientConfig(pki.RoleMaster),
		"a worker's of the same CA":     ca.Credentials(t, pki.Worker("p", "n")).ClientConfig(pki.RoleMaster),
		"the operator's of the same CA": ca.Credentials(t, pki.Operator()).ClientConfig(pki.RoleMaster),
	} {
		err := handshake(cfg)
		g.Expect(err).To(HaveOccurred(), "a Raft peer with %s was let in", name)
		g.Expect(err.Error()).To(ContainSubstring("tls"), "a Raft peer with %s: %v", name, err)
	}

	createFiles(ctx, t, c, "after", 20)
	g.Expect(c.WaitConverged(ctx)).To(Succeed())
	for _, n := range c.Nodes {
		checkFiles(ctx, t, n, "tls", 20)
		checkFiles(ctx, t, n, "after", 20)
	}
}

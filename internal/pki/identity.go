package pki

import (
	"crypto/x509"
	"errors"
	"fmt"
	"net/url"
	"strings"
)

// TrustDomain is the authority of every identity URI Strata issues.
const TrustDomain = "strata.dev"

// Role is what a component is to the others; authorization decides on it.
type Role string

// The roles of Strata's components.
const (
	RoleOperator Role = "operator"
	RoleMaster   Role = "master"
	RoleWorker   Role = "worker"
	RoleCSINode  Role = "csi-node"
	// RoleClaimServer is the server of a pvc:// Dataset's claim, in the Dataset's namespace. Its
	// key lives in a Secret of that namespace, which the namespace's users can read, so it is
	// trusted as a server of that one name and for nothing else: no RPC of another component
	// names the role.
	RoleClaimServer Role = "claim-server"
)

// ErrNoIdentity is returned for a certificate (or a caller) that names no Strata identity.
var ErrNoIdentity = errors.New("no Strata identity")

// Identity is who a certificate speaks for.
type Identity struct {
	Role Role
	// Pool is the TierPool of a worker; empty for other roles.
	Pool string
	// Namespace is the namespace of a claim server; empty for other roles.
	Namespace string
	// Name is the pod of a master, the node of a worker or CSI node plugin, the Service of a
	// claim server; empty for the operator.
	Name string
}

// Operator is the operator's identity.
func Operator() Identity { return Identity{Role: RoleOperator} }

// Master is the identity of the master replica in pod.
func Master(pod string) Identity { return Identity{Role: RoleMaster, Name: pod} }

// Worker is the identity of pool's worker on node.
func Worker(pool, node string) Identity { return Identity{Role: RoleWorker, Pool: pool, Name: node} }

// CSINode is the identity of the CSI node plugin on node.
func CSINode(node string) Identity { return Identity{Role: RoleCSINode, Name: node} }

// ClaimServer is the identity of the claim server behind Service service of namespace.
func ClaimServer(namespace, service string) Identity {
	return Identity{Role: RoleClaimServer, Namespace: namespace, Name: service}
}

// ServiceDNSName is the name pods of any namespace reach Service service of namespace by, and the
// name a claim server's certificate is for.
func ServiceDNSName(namespace, service string) string { return service + "." + namespace + ".svc" }

// WorkerID is the id a worker registers with at the master (<pool>/<node>), the only one it may
// speak for; empty for other roles.
func (id Identity) WorkerID() string {
	if id.Role != RoleWorker {
		return ""
	}
	return id.Pool + "/" + id.Name
}

// Self is the id a component acts for at the master: a worker's WorkerID, a master's Raft id
// (its pod); empty for the others.
func (id Identity) Self() string {
	switch id.Role {
	case RoleWorker:
		return id.WorkerID()
	case RoleMaster:
		return id.Name
	}
	return ""
}

// URI is the identity as the URI SAN of its certificate.
func (id Identity) URI() *url.URL {
	segs := []string{string(id.Role)}
	if id.Pool != "" {
		segs = append(segs, id.Pool)
	}
	if id.Namespace != "" {
		segs = append(segs, id.Namespace)
	}
	if id.Name != "" {
		segs = append(segs, id.Name)
	}
	return &url.URL{Scheme: "spiffe", Host: TrustDomain, Path: "/" + strings.Join(segs, "/")}
}

func (id Identity) String() string { return id.URI().String() }

// Validate checks that the identity has exactly the parts its role needs, each a DNS label or
// subdomain (the names of pods, nodes and TierPools), so that no two identities share a URI.
func (id Identity) Validate() error {
	need := map[Role][3]bool{ // role: {pool, namespace, name}
		RoleOperator:    {false, false, false},
		RoleMaster:      {false, false, true},
		RoleWorker:      {true, false, true},
		RoleCSINode:     {false, false, true},
		RoleClaimServer: {false, true, true},
	}
	parts, ok := need[id.Role]
	if !ok {
		return fmt.Errorf("unknown role %q", id.Role)
	}
	for _, p := range []struct {
		what  string
		value string
		want  bool
	}{{"pool", id.Pool, parts[0]}, {"namespace", id.Namespace, parts[1]}, {"name", id.Name, parts[2]}} {
		switch {
		case p.want && p.value == "":
			return fmt.Errorf("a %s identity needs a %s", id.Role, p.what)
		case !p.want && p.value != "":
			return fmt.Errorf("a %s identity has no %s, got %q", id.Role, p.what, p.value)
		case p.value != "" && !validName(p.value):
			return fmt.Errorf("%s %q of a %s identity is not a lowercase DNS name", p.what, p.value, id.Role)
		}
	}
	return nil
}

func validName(s string) bool {
	if len(s) > 253 || strings.HasPrefix(s, ".") || strings.HasSuffix(s, ".") || strings.HasPrefix(s, "-") {
		return false
	}
	for _, r := range s {
		if (r < 'a' || r > 'z') && (r < '0' || r > '9') && r != '-' && r != '.' {
			return false
		}
	}
	return true
}

// ParseURI reads an identity URI; anything not of Strata's trust domain, or not a valid
// identity, is an error.
func ParseURI(u *url.URL) (Identity, error) {
	if u.Scheme != "spiffe" || u.Host != TrustDomain || u.User != nil || u.RawQuery != "" || u.Fragment != "" {
		return Identity{}, fmt.Errorf("%w: %q is not a spiffe://%s/ URI", ErrNoIdentity, u, TrustDomain)
	}
	segs := strings.Split(strings.TrimPrefix(u.Path, "/"), "/")
	id := Identity{Role: Role(segs[0])}
	switch len(segs) {
	case 1:
	case 2:
		id.Name = segs[1]
	case 3:
		if id.Role == RoleClaimServer {
			id.Namespace, id.Name = segs[1], segs[2]
		} else {
			id.Pool, id.Name = segs[1], segs[2]
		}
	default:
		return Identity{}, fmt.Errorf("%w: %q has too many path segments", ErrNoIdentity, u)
	}
	if err := id.Validate(); err != nil {
		return Identity{}, fmt.Errorf("%w: %q: %w", ErrNoIdentity, u, err)
	}
	return id, nil
}

// FromCertificate is the identity of a verified certificate: its one Strata URI SAN.
func FromCertificate(cert *x509.Certificate) (Identity, error) {
	var found []Identity
	for _, u := range cert.URIs {
		if u.Scheme != "spiffe" || u.Host != TrustDomain {
			continue
		}
		id, err := ParseURI(u)
		if err != nil {
			return Identity{}, err
		}
		found = append(found, id)
	}
	switch len(found) {
	case 0:
		return Identity{}, fmt.Errorf("%w: certificate %q has no spiffe://%s/ URI", ErrNoIdentity, cert.Subject, TrustDomain)
	case 1:
		return found[0], nil
	}
	return Identity{}, fmt.Errorf("%w: certificate %q names %d identities", ErrNoIdentity, cert.Subject, len(found))
}

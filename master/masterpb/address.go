package masterpb

import (
	"net"
	"strings"
)

// SameReplica reports whether two gRPC addresses name the same replica: equal, or the same
// port on a host name and its completion by a DNS search domain, such as
// "strata-master-0.strata-master.strata-system.svc:7001" and the same name followed by
// ".cluster.local". The operator gives clients the short names (their pods' search domains
// complete them) while replicas advertise fully qualified ones (--cluster-domain): a client
// that took the two for different replicas would follow a follower's stale word back to the
// leader it just saw fail, and a follower would send it there.
func SameReplica(a, b string) bool {
	if a == b {
		return true
	}
	hostA, portA, errA := net.SplitHostPort(a)
	hostB, portB, errB := net.SplitHostPort(b)
	if errA != nil || errB != nil || portA != portB || hostA == "" || hostB == "" {
		return false
	}
	hostA, hostB = strings.TrimSuffix(hostA, "."), strings.TrimSuffix(hostB, ".")
	if net.ParseIP(hostA) != nil || net.ParseIP(hostB) != nil {
		return hostA == hostB
	}
	return hostA == hostB || strings.HasPrefix(hostA, hostB+".") || strings.HasPrefix(hostB, hostA+".")
}

package masterpb

import "testing"

func TestSameReplica(t *testing.T) {
	const short = "strata-master-0.strata-master.strata-system.svc:7001"
	tests := []struct {
		a, b string
		want bool
	}{
		{short, short, true},
		{short, "strata-master-0.strata-master.strata-system.svc.cluster.local:7001", true},
		{"strata-master-0.strata-master.strata-system.svc.cluster.local.:7001", short, true},
		{"strata-master-0:7001", short, true},
		{short, "strata-master-0.strata-master.strata-system.svc:7002", false},
		{short, "strata-master-1.strata-master.strata-system.svc.cluster.local:7001", false},
		// A label is a whole label: master-1 is not the start of master-10.
		{"strata-master-1:7001", "strata-master-10.strata-master:7001", false},
		{"10.0.0.1:7001", "10.0.0.1:7001", true},
		{"10.0.0.1:7001", "10.0.0.1.example:7001", false},
		{"[::1]:7001", "::1:7001", false}, // the second is no host:port
		{"", short, false},
		{":7001", short, false},
	}
	for _, tc := range tests {
		if got := SameReplica(tc.a, tc.b); got != tc.want {
			t.Errorf("SameReplica(%q, %q) = %v, want %v", tc.a, tc.b, got, tc.want)
		}
		if got := SameReplica(tc.b, tc.a); got != tc.want {
			t.Errorf("SameReplica(%q, %q) = %v, want %v", tc.b, tc.a, got, tc.want)
		}
	}
}

package main

import (
	"fmt"
	"testing"
)

func TestResolve(t *testing.T) {
	base := func() options {
		return options{
			id: "strata-master-1", dataDir: "/data", raftAddr: ":7000", grpcAddr: ":7001",
			service: "strata-master", namespace: "strata-system", replicas: 3, clusterDomain: "cluster.local",
		}
	}
	tests := map[string]struct {
		mutate  func(*options)
		want    topology
		wantErr bool
	}{
		"a StatefulSet pod derives its addresses and peers from its name": {
			mutate: func(o *options) { o.statefulSet = true },
			want: topology{
				raftAdvertise: "strata-master-1.strata-master.strata-system.svc.cluster.local:7000",
				grpcAdvertise: "strata-master-1.strata-master.strata-system.svc.cluster.local:7001",
				peers: []string{
					"strata-master-0.strata-master.strata-system.svc.cluster.local:7001",
					"strata-master-2.strata-master.strata-system.svc.cluster.local:7001",
				},
			},
		},
		"ordinal 0 may bootstrap": {
			mutate: func(o *options) { o.statefulSet, o.id, o.replicas = true, "strata-master-0", 1 },
			want: topology{
				raftAdvertise: "strata-master-0.strata-master.strata-system.svc.cluster.local:7000",
				grpcAdvertise: "strata-master-0.strata-master.strata-system.svc.cluster.local:7001",
				mayBootstrap:  true,
			},
		},
		"a pod name without an ordinal is rejected": {
			mutate:  func(o *options) { o.statefulSet, o.id = true, "master" },
			wantErr: true,
		},
		"an ordinal beyond the replicas is rejected": {
			mutate:  func(o *options) { o.statefulSet, o.id = true, "strata-master-3" },
			wantErr: true,
		},
		"outside a StatefulSet the flags say everything": {
			mutate: func(o *options) { o.join, o.raftAdvertise, o.grpcAdvertise = "a:1, b:1", "me:7000", "me:7001" },
			want:   topology{raftAdvertise: "me:7000", grpcAdvertise: "me:7001", peers: []string{"a:1", "b:1"}},
		},
		"a replica with neither peers nor bootstrap is rejected": {
			mutate:  func(*options) {},
			wantErr: true,
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			o := base()
			tc.mutate(&o)
			got, err := o.resolve()
			if (err != nil) != tc.wantErr {
				t.Fatalf("resolve: %v, want error %v", err, tc.wantErr)
			}
			if !tc.wantErr && fmt.Sprintf("%+v", got) != fmt.Sprintf("%+v", tc.want) {
				t.Errorf("got %+v\nwant %+v", got, tc.want)
			}
		})
	}
}

package controllers

import (
	"context"
	"fmt"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/envtest"

	masterclient "github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// The node-loss reconciler against a real API server and a real three-replica master.
func TestNodeLossTellsTheMasterWhichWorkersAreLost(t *testing.T) {
	g := NewWithT(t)
	env := &envtest.Environment{}
	cfg, err := env.Start()
	g.Expect(err).NotTo(HaveOccurred(), "starting envtest: run the tests with `make test`")
	t.Cleanup(func() { _ = env.Stop() })
	kube, err := client.New(cfg, client.Options{})
	g.Expect(err).NotTo(HaveOccurred())

	masters := mastertest.New(t, 3, mastertest.Options{GRPC: true})
	var addrs []string
	for _, n := range masters.Nodes {
		addrs = append(addrs, n.APIAddr)
	}
	workers, err := masterclient.New(addrs, masterclient.Options{})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = workers.Close() })

	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	now := time.Now()

	cases := map[string]struct {
		// ready is the node's Ready condition, nil when the node does not exist.
		ready    *corev1.NodeCondition
		wantLost bool
	}{
		"a deleted node's worker is lost": {ready: nil, wantLost: true},
		"a node NotReady for longer than the grace period loses its worker": {
			ready:    &corev1.NodeCondition{Status: corev1.ConditionFalse, Reason: "KubeletNotReady", LastTransitionTime: metav1.NewTime(now.Add(-2 * time.Minute))},
			wantLost: true,
		},
		"a node NotReady for less than the grace period keeps its worker": {
			ready: &corev1.NodeCondition{Status: corev1.ConditionUnknown, Reason: "NodeStatusUnknown", LastTransitionTime: metav1.NewTime(now.Add(-10 * time.Second))},
		},
		"a Ready node keeps its worker": {
			ready: &corev1.NodeCondition{Status: corev1.ConditionTrue, Reason: "KubeletReady", LastTransitionTime: metav1.NewTime(now.Add(-time.Hour))},
		},
	}

	reconciler := &NodeLossReconciler{Client: kube, Workers: workers, Grace: time.Minute, Now: func() time.Time { return now }}
	i := 0
	for name, tc := range cases {
		i++
		nodeName := fmt.Sprintf("node-%d", i)
		workerID := "worker-on-" + nodeName
		_, err := workers.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: workerID, Address: nodeName + ":7100", Node: nodeName})
		g.Expect(err).NotTo(HaveOccurred(), name)
		if tc.ready != nil {
			node := &corev1.Node{ObjectMeta: metav1.ObjectMeta{Name: nodeName}}
			g.Expect(kube.Create(ctx, node)).To(Succeed(), name)
			tc.ready.Type = corev1.NodeReady
			node.Status.Conditions = []corev1.NodeCondition{*tc.ready}
			g.Expect(kube.Status().Update(ctx, node)).To(Succeed(), name)
		}

		result, err := reconciler.Reconcile(ctx, ctrl.Request{NamespacedName: types.NamespacedName{Name: nodeName}})
		g.Expect(err).NotTo(HaveOccurred(), name)

		list, err := workers.ListWorkers(ctx, &masterpb.ListWorkersRequest{})
		g.Expect(err).NotTo(HaveOccurred(), name)
		var state masterpb.WorkerState
		for _, w := range list.Workers {
			if w.Id == workerID {
				state = w.State
			}
		}
		if tc.wantLost {
			g.Expect(state).To(Equal(masterpb.WorkerState_WORKER_STATE_LOST), name)
		} else {
			g.Expect(state).To(Equal(masterpb.WorkerState_WORKER_STATE_ALIVE), name)
		}
		if tc.ready != nil && tc.ready.Status == corev1.ConditionUnknown {
			// Stored times have whole seconds, hence the tolerance.
			g.Expect(result.RequeueAfter).To(BeNumerically("~", 50*time.Second, time.Second), "%s: looks again when the grace period ends", name)
		}
	}
}

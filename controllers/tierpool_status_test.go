package controllers

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// The suite's manager runs with a worker image; what a pool says when the operator has none, or
// cannot label the workers with the pool's name, is tested here on the status function.
var _ = Describe("The Ready condition of a pool that selects two nodes", func() {
	twoNodes := nodeSelection{matching: 2, schedulable: []string{"node-a", "node-b"}}
	deployed := workerObservation{deployed: true, namespace: "strata-system", found: true}

	DescribeTable("setTierPoolStatus",
		func(name string, workers workerObservation, status metav1.ConditionStatus, reason, message string) {
			pool := &datav1alpha1.TierPool{}
			pool.Name = name
			pool.Generation = 4
			setTierPoolStatus(pool, twoNodes, workers, nil)

			Expect(pool.Status.Nodes).To(BeEquivalentTo(2))
			Expect(pool.Status.ReadyWorkers).To(Equal(workers.ready))
			ready := meta.FindStatusCondition(pool.Status.Conditions, datav1alpha1.ConditionReady)
			Expect(ready).NotTo(BeNil())
			Expect(ready.Status).To(Equal(status))
			Expect(ready.Reason).To(Equal(reason))
			Expect(ready.Message).To(Equal(message))
			Expect(ready.ObservedGeneration).To(BeEquivalentTo(4))
		},
		Entry("says the operator was started without --worker-image when it deploys no worker",
			"fast", workerObservation{namespace: "strata-system"},
			metav1.ConditionFalse, ReasonWorkersNotDeployed,
			"2 node(s) selected, but no cache worker runs on them: the operator was started without --worker-image, "+
				"so it deploys none (set the chart's worker.enabled and worker.image values)"),
		Entry("says to shorten a pool name that cannot label the workers' pods",
			strings.Repeat("p", 64), workerObservation{deployed: true, namespace: "strata-system"},
			metav1.ConditionFalse, ReasonWorkersNotDeployed,
			"2 node(s) selected, but no cache worker runs on them: the pool's name is 64 characters long, but its "+
				"workers' pods carry it in the label app.kubernetes.io/instance (must be no more than 63 characters): "+
				"recreate the pool under a shorter name"),
		Entry("says the DaemonSet is not there yet before the operator created it",
			"fast", workerObservation{deployed: true, namespace: "strata-system"},
			metav1.ConditionFalse, ReasonWorkersNotReady,
			"2 node(s) selected; the worker DaemonSet strata-system/strata-worker-fast does not exist yet: "+
				"the operator creates it, and the Events of this TierPool say why when it cannot"),
		Entry("counts the ready workers against the DaemonSet's desired number, and says which pods to look at",
			"fast", withWorkers(deployed, 2, 1),
			metav1.ConditionFalse, ReasonWorkersNotReady,
			"1 of 2 worker(s) ready: see `kubectl -n strata-system get pods -l "+
				"app.kubernetes.io/name=strata-worker,app.kubernetes.io/instance=fast`"),
		Entry("counts against the pool's nodes while the DaemonSet has not counted them yet",
			"fast", withWorkers(deployed, 0, 0),
			metav1.ConditionFalse, ReasonWorkersNotReady,
			"0 of 2 worker(s) ready: see `kubectl -n strata-system get pods -l "+
				"app.kubernetes.io/name=strata-worker,app.kubernetes.io/instance=fast`"),
		Entry("is True when every node runs a ready worker",
			"fast", withWorkers(deployed, 2, 2),
			metav1.ConditionTrue, ReasonWorkersReady, "2 of 2 worker(s) ready"),
	)
})

func withWorkers(obs workerObservation, desired, ready int32) workerObservation {
	obs.desired, obs.ready = desired, ready
	return obs
}

var _ = Describe("The tiers of a pool's status", func() {
	It("show each tier's capacity over the pool's nodes and what its workers hold", func() {
		pool := &datav1alpha1.TierPool{Spec: datav1alpha1.TierPoolSpec{Tiers: []datav1alpha1.Tier{
			{Name: "mem", Medium: datav1alpha1.MediumMemory, Quota: resource.MustParse("1Gi")},
			{Name: "nvme", Medium: datav1alpha1.MediumNVMe, Quota: resource.MustParse("10Gi")},
		}}}
		setTierPoolStatus(pool, nodeSelection{matching: 2, schedulable: []string{"a", "b"}}, workerObservation{},
			map[string]int64{"mem": 42})
		Expect(pool.Status.Tiers).To(Equal([]datav1alpha1.TierStatus{
			{Name: "mem", Medium: datav1alpha1.MediumMemory, CapacityBytes: 2 << 30, UsedBytes: 42},
			{Name: "nvme", Medium: datav1alpha1.MediumNVMe, CapacityBytes: 20 << 30, UsedBytes: 0},
		}))
	})
})

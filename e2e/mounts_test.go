//go:build e2e

package e2e

import (
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

var _ = Describe("A Dataset of several stores", Label("smoke", "mounts"), func() {
	It("reads a private bucket with its Secret and a public one without, each at its folder, byte for byte on both nodes", func(ctx SpecContext) {
		namespace := testNamespace(ctx, "e2e-mounts-")
		DeferCleanup(func() { dumpOnFailure(namespace) })
		nodes := cacheNodes(ctx)
		pool := memoryPool(ctx, "mounts", "4Mi")
		prefix := namespace + "/"

		By("writing two objects to a private bucket and two to a public one")
		private := putObjects(ctx, namespace, nodes[0], "e2e-mounts-private", []string{prefix + "rec/a.bin", prefix + "b.txt"}, 6<<20+3, 1)
		public := runPod(ctx, testkitPod(namespace, nodes[0], "s3", "put", "--public", "--endpoint", minioEndpoint,
			"--bucket", "e2e-mounts-public", "--key", prefix+"corpus.txt,"+prefix+"ref/genome.fa", "--size", "3000", "--seed", "5"))
		var want []object
		for _, o := range private {
			o.Key = "raw/" + strings.TrimPrefix(o.Key, prefix)
			want = append(want, o)
		}
		for _, o := range public {
			o.Key = "reference/v1/" + strings.TrimPrefix(o.Key, prefix)
			want = append(want, o)
		}

		ds := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "mixed", Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{
				Mounts: []datav1alpha1.DatasetMount{
					{Path: "/raw", Source: datav1alpha1.DatasetSource{URI: "s3://e2e-mounts-private/" + prefix, Endpoint: minioEndpoint,
						SecretRef: &datav1alpha1.SecretReference{Name: "minio-credentials"}}},
					{Path: "/reference/v1", Source: datav1alpha1.DatasetSource{URI: "s3://e2e-mounts-public/" + prefix, Endpoint: minioEndpoint}},
				},
				TierPoolName: pool,
			},
		}
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		waitReady(ctx, ds)
		Expect(ds.Status.Files).To(BeEquivalentTo(4), "the status counts the objects of both stores")

		By("kubectl get -o wide naming the mounts")
		out, err := kubectl("-n", namespace, "get", "dataset", "mixed", "-o", "wide")
		Expect(err).NotTo(HaveOccurred(), "%s", out)
		Expect(out).To(And(ContainSubstring("MOUNTS"), ContainSubstring("/raw,/reference/v1")))

		for _, node := range nodes {
			Expect(sumClaim(ctx, namespace, node, "mixed")).To(Equal(contents(want)), "read on %s", node)
		}
	})
})

package controllers

import (
	"bytes"
	"fmt"
	"net"
	"path"
	"strings"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/types"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/cli"
	"github.com/strata-cache/strata/master/masterpb"
)

// These specs run `kubectl strata`'s commands (package cli) against the API server of the
// suite, with the operator's Dataset reconciler answering them, a real master saying where
// blocks are and workers' data-plane ports giving the trees their mounts show.
var _ = Describe("kubectl strata", func() {
	var namespace, poolName string
	var out *bytes.Buffer
	var plugin *cli.CLI

	BeforeEach(func() {
		namespace, poolName = newTenant("plugin-", "1Mi")
		withWatch, err := client.NewWithWatch(testEnv.Config, client.Options{Scheme: k8sClient.Scheme()})
		Expect(err).NotTo(HaveOccurred())
		out = &bytes.Buffer{}
		plugin = &cli.CLI{Client: withWatch, Namespace: namespace, Out: out, Wait: 30 * time.Second}
	})

	// dataset creates a Dataset of the suite's MinIO holding a.bin (1000 bytes) and dir/b.bin
	// (3 MiB, three blocks of the pool), and waits until the operator has listed it.
	dataset := func(name string) *datav1alpha1.Dataset {
		ds := s3DatasetOf(namespace, name, poolName, map[string]int{"a.bin": 1000, "dir/b.bin": 3 << 20})
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect(ds.Status.Files).To(BeEquivalentTo(2))
		}).Should(Succeed(), "the operator lists Dataset %s", name)
		return ds
	}

	// cacheAt records at the master that the worker of node holds the blocks (by index) of the
	// file at p of ds, version etag, in tier: what the worker reports as it caches them.
	cacheAt := func(ds *datav1alpha1.Dataset, node, tier, p, etag string, size int64, indexes ...int64) {
		GinkgoHelper()
		worker := poolName + "/" + node
		_, err := lineageMaster.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: worker, Address: "127.0.0.1:1", Node: node})
		Expect(err).NotTo(HaveOccurred())
		name := datav1alpha1.MasterDatasetName(ds.Namespace, ds.Name, string(ds.UID))
		root := datav1alpha1.MasterDatasetRoot(ds.Namespace, ds.Name, string(ds.UID))
		_, err = lineageMaster.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: name, Root: root})
		Expect(err).NotTo(HaveOccurred())
		file := locations.MasterPath(path.Join(root, p), etag)
		if _, err := lineageMaster.CreateFile(ctx, &masterpb.CreateFileRequest{Path: file, Dataset: name}); status.Code(err) != codes.AlreadyExists {
			Expect(err).NotTo(HaveOccurred())
		}
		for _, i := range indexes {
			_, err := lineageMaster.CommitBlock(ctx, &masterpb.CommitBlockRequest{
				BlockId: locations.MasterBlockID(fmt.Sprintf("%s#%d", file, i)), Path: file, Offset: i << 20,
				Size: min(size-i<<20, 1<<20), Worker: worker, Tier: tier, Checksum: "0",
			})
			Expect(err).NotTo(HaveOccurred())
		}
	}

	tree := []*workerpb.ListedObject{{Path: "a.bin", Size: 1000, Etag: "ea"}, {Path: "dir/b.bin", Size: 3 << 20, Etag: "eb"}}

	It("lists a Dataset's files with how much of each is cached and where, and sums a folder by node and tier", func() {
		startSyncingWorker(poolName, "node-a").mount(tree...)
		ds := dataset("shown")
		cacheAt(ds, "node-a", "mem", "dir/b.bin", "eb", 3<<20, 0, 2)
		cacheAt(ds, "node-b", "ssd", "dir/b.bin", "eb", 3<<20, 0)
		// A block of a version the source replaced is not the file's.
		cacheAt(ds, "node-b", "ssd", "a.bin", "replaced", 1000, 0)

		written := testutil.ToFloat64(blockReports.WithLabelValues("written"))
		Expect(plugin.List(ctx, "shown", "")).To(Succeed())
		Expect(testutil.ToFloat64(blockReports.WithLabelValues("written"))).To(Equal(written+1), "counted")
		Expect(rows(out)).To(Equal([][]string{
			{"PATH", "SIZE", "BLOCKS", "CACHED", "WHERE"},
			{"a.bin", "1000B", "1", "0%", "-"},
			{"dir/b.bin", "3.0Mi", "3", "66%", "node-a/mem:2", "node-b/ssd:1"},
		}))
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
		Expect(ds.Status.BlockReport).NotTo(BeNil())
		Expect(ds.Status.BlockReport.ConfigMapName).To(Equal("shown-blocks"))
		Expect(ds.Status.BlockReport.Files).To(BeEquivalentTo(2))
		report := &corev1.ConfigMap{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "shown-blocks"}, report)).To(Succeed())
		Expect(metav1.IsControlledBy(report, ds)).To(BeTrue(), "the report goes with the Dataset")

		out.Reset()
		Expect(plugin.DiskUsage(ctx, "shown", "")).To(Succeed())
		Expect(rows(out)).To(Equal([][]string{
			{"SIZE", "CACHED", "FILES", "PATH"},
			{"1000B", "0%", "1", "a.bin"},
			{"3.0Mi", "66%", "1", "dir"},
			{"3.0Mi", "66%", "2", "(all)"},
			{"NODE", "TIER", "BLOCKS", "CACHED"},
			{"node-a", "mem", "2", "2.0Mi"},
			{"node-b", "ssd", "1", "1.0Mi"},
		}))

		out.Reset()
		Expect(plugin.List(ctx, "shown", "/dir/")).To(Succeed(), "a folder, however written")
		Expect(rows(out)).To(HaveLen(2))
		Expect(rows(out)[1][0]).To(Equal("dir/b.bin"))
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
		Expect(ds.Status.BlockReport.Dir).To(Equal("dir"))
		Expect(ds.Status.BlockReport.TotalFiles).To(BeEquivalentTo(1))
	})

	It("reports from the listing a worker keeps once no node mounts the Dataset any more", func() {
		startSyncingWorker(poolName, "node-a").keep(tree...)
		ds := dataset("read-before")
		cacheAt(ds, "node-a", "mem", "a.bin", "ea", 1000, 0)
		Expect(plugin.List(ctx, "read-before", "")).To(Succeed())
		Expect(rows(out)).To(ContainElement([]string{"a.bin", "1000B", "1", "100%", "node-a/mem:1"}))
	})

	It("says why there is no report: no node ever mounted the Dataset, a folder out of the tree, a ConfigMap of another", func() {
		ds := dataset("unmounted")
		err := plugin.List(ctx, "unmounted", "")
		Expect(err).To(MatchError(ContainSubstring("no node has mounted the Dataset yet")))
		Expect(err).To(MatchError(ContainSubstring("claim unmounted")))

		// A worker of the pool that cannot be asked may mount it: the report says why it failed.
		gone, err := net.Listen("tcp", "127.0.0.1:0")
		Expect(err).NotTo(HaveOccurred())
		Expect(gone.Close()).To(Succeed())
		syncWorkers.add(&masterpb.Worker{Id: poolName + "/node-gone", Address: gone.Addr().String(), Node: "node-gone", State: masterpb.WorkerState_WORKER_STATE_ALIVE})
		err = plugin.List(ctx, "unmounted", "")
		Expect(err).To(MatchError(ContainSubstring("worker %s/node-gone", poolName)))
		Expect(err).NotTo(MatchError(ContainSubstring("no node has mounted")))
		syncWorkers.remove(poolName + "/node-gone")

		Expect(plugin.DiskUsage(ctx, "unmounted", "../other")).To(MatchError(ContainSubstring("climbs out of the Dataset's tree")))
		Expect(plugin.List(ctx, "missing", "")).To(MatchError(ContainSubstring(`no Dataset "missing" in namespace ` + namespace)))

		// Someone's own ConfigMap of the report's name is left alone.
		startSyncingWorker(poolName, "node-a").mount(tree...)
		Expect(k8sClient.Create(ctx, &corev1.ConfigMap{ObjectMeta: metav1.ObjectMeta{Name: "unmounted-blocks", Namespace: namespace},
			Data: map[string]string{"mine": "yes"}})).To(Succeed())
		Expect(plugin.List(ctx, "unmounted", "")).To(MatchError(ContainSubstring("ConfigMap unmounted-blocks is not this Dataset's")))
		mine := &corev1.ConfigMap{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "unmounted-blocks"}, mine)).To(Succeed())
		Expect(mine.Data).To(Equal(map[string]string{"mine": "yes"}))
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
		Expect(ds.Status.BlockReport.ConfigMapName).To(BeEmpty())
	})

	It("syncs a Dataset's mounts and says what changed, or why the sync failed", func() {
		worker := startSyncingWorker(poolName, "node-a")
		dataset("synced")
		worker.set(&workerpb.SyncDatasetResponse{Mounted: true, Added: 2, Removed: 1, Files: 2, Bytes: 3<<20 + 1000}, nil)
		Expect(plugin.Sync(ctx, "synced")).To(Succeed())
		Expect(out.String()).To(ContainSubstring("synced on 1 node(s): 2 file(s) added, 1 removed, 0 changed"))

		worker.set(nil, status.Error(codes.Unavailable, "the bucket does not answer"))
		Expect(plugin.Sync(ctx, "synced")).To(MatchError(And(ContainSubstring("the sync of Dataset "+namespace+"/synced failed"),
			ContainSubstring("the bucket does not answer"))))
	})

	It("loads a Dataset again for each request, and says when a load fails", func() {
		makeServable(poolName)
		ds := dataset("loaded")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect(ds.Status.Phase).To(Equal(datav1alpha1.DatasetReady))
		}).Should(Succeed())

		// load runs until the Job it asked for ends; the spec plays the Job controller.
		load := func() chan error {
			done := make(chan error, 1)
			go func() {
				defer GinkgoRecover()
				done <- plugin.Load(ctx, "loaded")
			}()
			return done
		}
		endLoad := func(previous types.UID, ok bool) types.UID {
			GinkgoHelper()
			var uid types.UID
			Eventually(func(g Gomega) {
				job := &batchv1.Job{}
				g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "loaded-preload"}, job)).To(Succeed())
				g.Expect(job.UID).NotTo(Equal(previous), "a new Job for the new request")
				g.Expect(job.Annotations).To(HaveKeyWithValue(annotationJobLoadRequest, Not(BeEmpty())))
				endJob(job, ok)
				g.Expect(k8sClient.Status().Update(ctx, job)).To(Succeed())
				uid = job.UID
			}).Should(Succeed())
			return uid
		}

		first := load()
		job := endLoad("", true)
		Eventually(first).Should(Receive(BeNil()))
		Expect(out.String()).To(ContainSubstring("loaded: every file was read once"))
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
		Expect(ds.Status.LoadRequest).To(Equal(ds.Annotations[datav1alpha1.AnnotationLoadRequested]))

		again := load()
		job = endLoad(job, false)
		Eventually(again).Should(Receive(MatchError(ContainSubstring("the load of Dataset " + namespace + "/loaded failed"))))

		third := load()
		endLoad(job, true)
		Eventually(third).Should(Receive(BeNil()), "a failed load is tried again on request")
	})

	It("shows the pools and the namespace's Datasets", func() {
		dataset("listed")
		Expect(plugin.Status(ctx)).To(Succeed())
		Expect(out.String()).To(And(ContainSubstring("POOL"), ContainSubstring(poolName), ContainSubstring("DATASET")))
		Expect(rows(out)).To(ContainElement(HaveExactElements("listed", Not(BeEmpty()), "2", "3.0Mi", "0%", "-", poolName)))
	})

	It("shows the namespace's pipeline in the order it runs, with each output's state", func() {
		lineageOf := func(name string, inputs, outputs []string) {
			l := &datav1alpha1.Lineage{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec: datav1alpha1.LineageSpec{Inputs: inputs, Outputs: outputs, Template: batchv1.JobTemplateSpec{
					Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{Spec: corev1.PodSpec{
						RestartPolicy: corev1.RestartPolicyNever,
						Containers:    []corev1.Container{{Name: "step", Image: "busybox"}},
					}}},
				}},
			}
			Expect(k8sClient.Create(ctx, l)).To(Succeed())
		}
		// Given out of order: the table puts them in the order they run.
		lineageOf("train", []string{"clean"}, []string{"model"})
		lineageOf("prep", []string{"raw"}, []string{"clean"})
		Expect(plugin.Lineage(ctx)).To(Succeed())
		lines := rows(out)
		Expect(lines[0]).To(Equal([]string{"LEVEL", "LINEAGE", "STATE", "LAST", "RUN", "PREDICTED", "READS", "WRITES"}))
		Expect(lines[1][:2]).To(Equal([]string{"0", "prep"}))
		Expect(lines[2][:2]).To(Equal([]string{"1", "train"}))
		Expect(strings.Join(lines[2], " ")).To(And(ContainSubstring("clean<-prep"), ContainSubstring("model [Pending, no Dataset]")))
	})
})

// rows are the lines of a command's output, each split into its fields, blank lines left out.
func rows(out *bytes.Buffer) [][]string {
	var lines [][]string
	for _, line := range strings.Split(out.String(), "\n") {
		if fields := strings.Fields(line); len(fields) > 0 {
			lines = append(lines, fields)
		}
	}
	return lines
}

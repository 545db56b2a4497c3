package v1alpha1_test

import (
	"fmt"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/internal/samples"
)

var samplesDir = filepath.Join("..", "..", "config", "samples")

// loadSamples reads every object of config/samples, keyed by "Kind/name".
func loadSamples() map[string]*unstructured.Unstructured {
	objs, err := samples.Load(samplesDir)
	Expect(err).NotTo(HaveOccurred())
	byKey := map[string]*unstructured.Unstructured{}
	for _, obj := range objs {
		byKey[obj.GetKind()+"/"+obj.GetName()] = obj
	}
	return byKey
}

// sample returns a fresh copy of a sample, so that a test may change it.
func sample(key string) *unstructured.Unstructured {
	obj, ok := loadSamples()[key]
	Expect(ok).To(BeTrue(), "no sample %s in %s", key, samplesDir)
	return obj
}

var pathSegment = regexp.MustCompile(`^([^\[]+)(?:\[(\d+)\])?$`)

// set writes value at a dotted path such as "spec.tiers[1].quota"; a nil value removes the field.
func set(obj *unstructured.Unstructured, path string, value any) *unstructured.Unstructured {
	segments := strings.Split(path, ".")
	var current any = obj.Object
	for i, segment := range segments {
		m := pathSegment.FindStringSubmatch(segment)
		Expect(m).NotTo(BeNil(), "bad path segment %q", segment)
		fields, ok := current.(map[string]any)
		Expect(ok).To(BeTrue(), "%s: %q is not an object", path, segment)
		last := i == len(segments)-1
		if m[2] == "" {
			if last {
				if value == nil {
					delete(fields, m[1])
				} else {
					fields[m[1]] = value
				}
				return obj
			}
			if _, ok := fields[m[1]]; !ok {
				fields[m[1]] = map[string]any{}
			}
			current = fields[m[1]]
			continue
		}
		list, ok := fields[m[1]].([]any)
		Expect(ok).To(BeTrue(), "%s: %q is not a list", path, m[1])
		index, _ := strconv.Atoi(m[2])
		Expect(index).To(BeNumerically("<", len(list)), "%s: index out of range", path)
		if last {
			list[index] = value
			return obj
		}
		current = list[index]
	}
	return obj
}

func tier(name, medium, quota string) map[string]any {
	return map[string]any{"name": name, "medium": medium, "paths": []any{"/mnt/strata/" + name}, "quota": quota}
}

// createDryRun sends obj through admission without persisting it.
func createDryRun(obj client.Object) error {
	return k8sClient.Create(ctx, obj, client.DryRunAll)
}

var _ = Describe("Admission of the Strata API", func() {
	var namespace string

	BeforeEach(func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "api-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
	})

	inNamespace := func(obj *unstructured.Unstructured) *unstructured.Unstructured {
		if obj.GetKind() != "TierPool" {
			obj.SetNamespace(namespace)
		}
		return obj
	}

	It("accepts every sample in config/samples and stores it", func() {
		samples := loadSamples()
		Expect(samples).To(HaveKey("TierPool/default"))
		Expect(samples).To(HaveKey("CachePolicy/training"))
		Expect(samples).To(HaveKey("Dataset/imagenet-mini"))
		Expect(samples).To(HaveKey("Dataset/speech-corpus"))
		Expect(samples).To(HaveKey("Lineage/extract-features"))
		Expect(samples).To(HaveKey("DataLoad/imagenet-mini-train"))
		for key, obj := range samples {
			obj = inNamespace(obj)
			Expect(k8sClient.Create(ctx, obj)).To(Succeed(), "creating sample %s", key)
			DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, obj))).To(Succeed()) })
		}

		var lineage datav1alpha1.Lineage
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "extract-features"}, &lineage)).To(Succeed())
		Expect(lineage.Spec.Outputs).To(Equal([]string{"imagenet-features"}))
		Expect(lineage.Spec.Template.Spec.Template.Spec.Containers).To(HaveLen(1))

		By("the sample Job mounting the claims of its inputs, read-only, and of its outputs: a Job copied from it sees its data")
		pod := lineage.Spec.Template.Spec.Template.Spec
		claims := map[string]bool{} // claim name: read-only
		for _, v := range pod.Volumes {
			if c := v.PersistentVolumeClaim; c != nil {
				for _, m := range pod.Containers[0].VolumeMounts {
					if m.Name == v.Name {
						claims[c.ClaimName] = m.ReadOnly
					}
				}
			}
		}
		for _, in := range lineage.Spec.Inputs {
			Expect(claims).To(HaveKeyWithValue(in, true), "input %s is mounted read-only", in)
		}
		for _, out := range lineage.Spec.Outputs {
			Expect(claims).To(HaveKeyWithValue(out, false), "output %s is mounted writable", out)
		}
	})

	It("fills in defaults a user may leave out", func() {
		policy := &datav1alpha1.CachePolicy{ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: namespace}}
		Expect(k8sClient.Create(ctx, policy)).To(Succeed())
		Expect(policy.Spec.Eviction.Policy).To(Equal(datav1alpha1.EvictLRU))
		Expect(policy.Spec.Checkpoint.Strategy).To(Equal(datav1alpha1.CheckpointEdge))
		Expect(policy.Spec.Checkpoint.EdgeFraction).To(Equal(0.5))
		Expect(policy.Spec.Checkpoint.HotReads).To(Equal(int32(2)))
		Expect(policy.Spec.Replication.Count).To(Equal(int32(1)))
		Expect(policy.Spec.Replication.Scope).To(Equal(datav1alpha1.ReplicateSameRack))
		Expect(policy.Spec.Replication.Selective).To(HaveValue(BeTrue()))
		Expect(policy.Spec.Promotion.AccessThreshold).To(Equal(int32(3)))
		Expect(policy.Spec.Prefetch.Policy).To(Equal(datav1alpha1.PrefetchNone))
		Expect(policy.Spec.Recovery.ReadWait).To(Equal(&metav1.Duration{Duration: datav1alpha1.DefaultRecoveryReadWait}))

		dataset := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "plain", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Source: &datav1alpha1.DatasetSource{URI: "s3://bucket/prefix"}},
		}
		Expect(k8sClient.Create(ctx, dataset)).To(Succeed())
		Expect(dataset.Spec.TierPoolName).To(Equal("default"))

		asRole := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "as-role", Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{Source: &datav1alpha1.DatasetSource{URI: "s3://bucket/prefix",
				WebIdentity: &datav1alpha1.WebIdentity{RoleARN: "arn:aws:iam::1:role/r", ServiceAccountName: "reader"}}},
		}
		Expect(k8sClient.Create(ctx, asRole)).To(Succeed())
		Expect(asRole.Spec.Source.WebIdentity.Audience).To(Equal("sts.amazonaws.com"), "what AWS STS expects")

		pool := sample("TierPool/default")
		pool.SetName("defaults-" + namespace)
		set(pool, "spec.tiers[0]", tier("mem", "MEM", "1Gi"))
		set(pool, "spec.blockSize", nil)
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())
		DeferCleanup(func() { Expect(k8sClient.Delete(ctx, pool)).To(Succeed()) })
		var stored datav1alpha1.TierPool
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(pool), &stored)).To(Succeed())
		Expect(stored.Spec.BlockSize.String()).To(Equal("64Mi"))
		Expect(stored.Spec.Tiers[0].Watermarks).To(Equal(datav1alpha1.Watermarks{High: 0.9, Low: 0.7}))
	})

	It("accepts a Narrow Lineage without partitions whose completion index i writes output i", func() {
		obj := inNamespace(loadSamples()["Lineage/extract-features"])
		set(obj, "spec.partitions", nil)
		set(obj, "spec.inputs", []any{"in-0", "in-1"})
		set(obj, "spec.outputs", []any{"out-0", "out-1"})
		Expect(k8sClient.Create(ctx, obj)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, obj))).To(Succeed()) })
	})

	It("keeps a Dataset's source immutable, because cached blocks belong to it", func() {
		obj := inNamespace(sample("Dataset/imagenet-mini"))
		Expect(k8sClient.Create(ctx, obj)).To(Succeed())
		set(obj, "spec.source.uri", "s3://other-bucket/")
		err := k8sClient.Update(ctx, obj)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "expected Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("spec.source is immutable: create a new Dataset"))
	})

	It("keeps a Dataset's mounts immutable, and a Dataset from switching between a source and mounts", func() {
		obj := inNamespace(sample("Dataset/speech-corpus"))
		Expect(k8sClient.Create(ctx, obj)).To(Succeed())
		moved := obj.DeepCopy()
		set(moved, "spec.mounts[1].path", "/corpus")
		err := k8sClient.Update(ctx, moved)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "expected Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("spec.mounts is immutable: create a new Dataset"))

		switched := obj.DeepCopy()
		set(switched, "spec.mounts", nil)
		set(switched, "spec.source", map[string]any{"uri": "s3://datasets/recordings/"})
		err = k8sClient.Update(ctx, switched)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "expected Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("a Dataset cannot switch between spec.source, spec.mounts and spec.lineage"))
	})

	It("keeps an output's checkpoint target immutable once set, because its checkpoints are read back from there", func() {
		obj := inNamespace(sample("Dataset/imagenet-features"))
		Expect(k8sClient.Create(ctx, obj)).To(Succeed())
		set(obj, "spec.checkpoint.uri", "s3://elsewhere/")
		err := k8sClient.Update(ctx, obj)
		Expect(apierrors.IsInvalid(err)).To(BeTrue(), "expected Invalid, got %v", err)
		Expect(err.Error()).To(ContainSubstring("spec.checkpoint is immutable once set"))
	})

	DescribeTable("rejects a bad spec with a message that says what to fix",
		func(key string, change func(*unstructured.Unstructured), message string) {
			obj := inNamespace(sample(key))
			change(obj)
			err := createDryRun(obj)
			Expect(err).To(HaveOccurred(), "the API server accepted %s", describe(obj))
			Expect(apierrors.IsInvalid(err)).To(BeTrue(), "expected an Invalid error, got %v", err)
			Expect(err.Error()).To(ContainSubstring(message))
		},

		// Dataset
		Entry("a Dataset with both a source and a lineage", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) { set(o, "spec.lineage", map[string]any{"name": "extract-features"}) },
			"set exactly one of spec.source (data that already exists in an under-store), spec.mounts (data of several under-stores, each at a folder of the tree) and spec.lineage"),
		Entry("a Dataset with neither a source nor a lineage", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) { set(o, "spec.source", nil) },
			"set exactly one of spec.source"),
		Entry("a Dataset whose source has an unknown scheme", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) { set(o, "spec.source.uri", "ftp://files.example.com/data") },
			"the source's uri must start with s3://, file://, pvc://, http:// or https://"),
		Entry("a Dataset whose source is a bare path", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) { set(o, "spec.source.uri", "/data/images") },
			"the source's uri must start with s3://, file://, pvc://, http:// or https://"),
		Entry("an s3:// source without a bucket", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) { set(o, "spec.source.uri", "s3:///prefix") },
			"an s3:// source must name a bucket: s3://bucket or s3://bucket/prefix"),
		Entry("a pvc:// source without a claim", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) {
				set(o, "spec.source.uri", "pvc://")
				set(o, "spec.source.endpoint", nil)
			},
			"a pvc:// source must name a PersistentVolumeClaim of the Dataset's namespace"),
		Entry("a pvc:// source with a Secret", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) {
				set(o, "spec.source.uri", "pvc://raw-images/train")
				set(o, "spec.source.endpoint", nil)
			},
			"a pvc:// source takes no secretRef"),
		Entry("a relative file:// source", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) {
				set(o, "spec.source.uri", "file://data/images")
				set(o, "spec.source.endpoint", nil)
			},
			"a file:// source must be an absolute path: file:///path"),
		Entry("a web identity on a source that is not S3", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) {
				set(o, "spec.source", map[string]any{"uri": "https://example.com/data/",
					"webIdentity": map[string]any{"roleARN": "arn:aws:iam::1:role/r", "serviceAccountName": "reader"}})
			},
			"webIdentity only applies to s3:// sources"),
		Entry("a web identity beside a Secret", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) {
				set(o, "spec.source.webIdentity", map[string]any{"roleARN": "arn:aws:iam::1:role/r", "serviceAccountName": "reader"})
			},
			"set one of secretRef (keys in a Secret) and webIdentity (a role assumed with a ServiceAccount's token), not both"),
		Entry("a web identity without a role", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) {
				set(o, "spec.source.secretRef", nil)
				set(o, "spec.source.webIdentity", map[string]any{"serviceAccountName": "reader"})
			},
			"spec.source.webIdentity.roleARN: Required value"),
		Entry("a web identity whose STS endpoint has a path", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) {
				set(o, "spec.source.secretRef", nil)
				set(o, "spec.source.webIdentity", map[string]any{"roleARN": "arn:aws:iam::1:role/r", "serviceAccountName": "reader",
					"stsEndpoint": "https://sts.example.com/assume"})
			},
			"spec.source.webIdentity.stsEndpoint"),
		Entry("an endpoint on a source that is not S3", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) { set(o, "spec.source.uri", "https://example.com/data/") },
			"a source's endpoint only applies to s3:// sources"),
		Entry("a Dataset with both a source and mounts", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) {
				set(o, "spec.mounts", []any{map[string]any{"path": "/raw", "source": map[string]any{"uri": "s3://b/p"}}})
			},
			"set exactly one of spec.source (data that already exists in an under-store), spec.mounts"),
		Entry("two mounts at one folder", "Dataset/speech-corpus",
			func(o *unstructured.Unstructured) { set(o, "spec.mounts[1].path", "/raw") },
			"two mounts share a folder: give each mount a path of its own"),
		Entry("a mount inside another", "Dataset/speech-corpus",
			func(o *unstructured.Unstructured) { set(o, "spec.mounts[1].path", "/raw/reference") },
			"a mount lies inside another"),
		Entry("a mount at the root", "Dataset/speech-corpus",
			func(o *unstructured.Unstructured) { set(o, "spec.mounts[1].path", "/") },
			"spec.mounts[1].path"),
		Entry("a mount path with a trailing slash", "Dataset/speech-corpus",
			func(o *unstructured.Unstructured) { set(o, "spec.mounts[1].path", "/reference/") },
			"spec.mounts[1].path"),
		Entry("a mount path with an empty element", "Dataset/speech-corpus",
			func(o *unstructured.Unstructured) { set(o, "spec.mounts[1].path", "/a//b") },
			"spec.mounts[1].path"),
		Entry("a relative mount path", "Dataset/speech-corpus",
			func(o *unstructured.Unstructured) { set(o, "spec.mounts[1].path", "reference") },
			"spec.mounts[1].path"),
		Entry("a mount path with '..'", "Dataset/speech-corpus",
			func(o *unstructured.Unstructured) { set(o, "spec.mounts[1].path", "/raw/../etc") },
			"a mount path has no '.' or '..' elements"),
		Entry("a mount path with '.'", "Dataset/speech-corpus",
			func(o *unstructured.Unstructured) { set(o, "spec.mounts[1].path", "/./x") },
			"a mount path has no '.' or '..' elements"),
		Entry("a pvc:// mount with a Secret", "Dataset/speech-corpus",
			func(o *unstructured.Unstructured) {
				set(o, "spec.mounts[1].source", map[string]any{"uri": "pvc://claim/data", "secretRef": map[string]any{"name": "keys"}})
			},
			"a pvc:// source takes no secretRef"),
		Entry("a mount whose source has an unknown scheme", "Dataset/speech-corpus",
			func(o *unstructured.Unstructured) {
				set(o, "spec.mounts[0].source.uri", "ftp://files.example.com/data")
			},
			"the source's uri must start with s3://"),
		Entry("an empty list of mounts", "Dataset/speech-corpus",
			func(o *unstructured.Unstructured) { set(o, "spec.mounts", []any{}) },
			"spec.mounts"),
		Entry("a checkpoint target on a Dataset with a source", "Dataset/imagenet-mini",
			func(o *unstructured.Unstructured) {
				set(o, "spec.checkpoint", map[string]any{"uri": "s3://b/p", "secretRef": map[string]any{"name": "keys"}})
			},
			"spec.checkpoint only applies to a Lineage's output (spec.lineage)"),
		Entry("a checkpoint target that is not S3", "Dataset/imagenet-features",
			func(o *unstructured.Unstructured) { set(o, "spec.checkpoint.uri", "file:///data/checkpoints") },
			"spec.checkpoint.uri must name an S3 bucket: s3://bucket or s3://bucket/prefix"),
		Entry("a checkpoint target without its Secret", "Dataset/imagenet-features",
			func(o *unstructured.Unstructured) { set(o, "spec.checkpoint.secretRef", nil) },
			"spec.checkpoint.secretRef: Required value"),

		// TierPool
		Entry("a TierPool with an empty list of tiers", "TierPool/default",
			func(o *unstructured.Unstructured) { set(o, "spec.tiers", []any{}) },
			"spec.tiers must list at least one tier"),
		Entry("a TierPool with no tiers at all", "TierPool/default",
			func(o *unstructured.Unstructured) { set(o, "spec.tiers", nil) },
			"spec.tiers must list at least one tier"),
		Entry("a TierPool with two tiers of one name", "TierPool/default",
			func(o *unstructured.Unstructured) { set(o, "spec.tiers[1]", tier("mem", "NVME", "10Gi")) },
			"tier names must be unique in spec.tiers"),
		Entry("a tier of an unknown medium", "TierPool/default",
			func(o *unstructured.Unstructured) { set(o, "spec.tiers[1].medium", "TAPE") },
			`supported values: "MEM", "PMEM", "NVME", "SSD", "HDD"`),
		Entry("a quota that is not a quantity", "TierPool/default",
			func(o *unstructured.Unstructured) { set(o, "spec.tiers[0].quota", "lots") },
			"quota must be a positive quantity of bytes, such as 8Gi or 500Mi"),
		Entry("a quota of zero", "TierPool/default",
			func(o *unstructured.Unstructured) { set(o, "spec.tiers[0].quota", "0") },
			"quota must be a positive quantity of bytes, such as 8Gi or 500Mi"),
		Entry("a high watermark below the low one", "TierPool/default",
			func(o *unstructured.Unstructured) {
				set(o, "spec.tiers[0].watermarks", map[string]any{"high": 0.6, "low": 0.8})
			},
			"watermarks.high must be above watermarks.low"),
		Entry("a high watermark equal to the low one", "TierPool/default",
			func(o *unstructured.Unstructured) {
				set(o, "spec.tiers[0].watermarks", map[string]any{"high": 0.8, "low": 0.8})
			},
			"watermarks.high must be above watermarks.low"),
		Entry("a high watermark above 1", "TierPool/default",
			func(o *unstructured.Unstructured) { set(o, "spec.tiers[0].watermarks.high", 1.5) },
			"watermarks.high is a share of the quota and must be in (0, 1]"),
		Entry("a high watermark of 0", "TierPool/default",
			func(o *unstructured.Unstructured) {
				set(o, "spec.tiers[0].watermarks", map[string]any{"high": 0.0, "low": 0.0})
			},
			"watermarks.high is a share of the quota and must be in (0, 1]"),
		Entry("a negative low watermark", "TierPool/default",
			func(o *unstructured.Unstructured) { set(o, "spec.tiers[0].watermarks.low", -0.1) },
			"watermarks.low is a share of the quota and must be in [0, 1)"),
		Entry("a relative tier path", "TierPool/default",
			func(o *unstructured.Unstructured) { set(o, "spec.tiers[0].paths", []any{"mnt/mem"}) },
			"tier paths must be absolute host paths"),
		Entry("a block size above 1Gi", "TierPool/default",
			func(o *unstructured.Unstructured) { set(o, "spec.blockSize", "2Gi") },
			"blockSize must be a quantity between 1Mi and 1Gi"),

		// Lineage
		Entry("a Lineage with no outputs", "Lineage/extract-features",
			func(o *unstructured.Unstructured) {
				set(o, "spec.outputs", nil)
				set(o, "spec.partitions", nil)
				set(o, "spec.dependency", "Wide")
			},
			"spec.outputs must name at least one Dataset that this Lineage writes"),
		Entry("a Lineage with an empty list of outputs", "Lineage/extract-features",
			func(o *unstructured.Unstructured) {
				set(o, "spec.outputs", []any{})
				set(o, "spec.partitions", nil)
				set(o, "spec.dependency", "Wide")
			},
			"spec.outputs must name at least one Dataset that this Lineage writes"),
		Entry("a Lineage whose output is also an input", "Lineage/extract-features",
			func(o *unstructured.Unstructured) { set(o, "spec.outputs", []any{"imagenet-mini"}) },
			"a Dataset cannot be both an input and an output of one Lineage"),
		Entry("a Lineage with an empty Job template", "Lineage/extract-features",
			func(o *unstructured.Unstructured) { set(o, "spec.template", map[string]any{}) },
			"spec.template must be a Job template with at least one container"),
		Entry("a Lineage whose Job template has no containers", "Lineage/extract-features",
			func(o *unstructured.Unstructured) { set(o, "spec.template.spec.template.spec.containers", []any{}) },
			"spec.template must be a Job template with at least one container"),
		Entry("a Narrow Lineage with more outputs than inputs", "Lineage/extract-features",
			func(o *unstructured.Unstructured) { set(o, "spec.outputs", []any{"imagenet-features", "thumbnails"}) },
			"a Narrow Lineage maps input i to output i"),
		Entry("a Narrow Lineage whose Job is not Indexed", "Lineage/extract-features",
			func(o *unstructured.Unstructured) { set(o, "spec.template.spec.completionMode", nil) },
			"a Narrow Lineage reruns only the completion indexes that write what was lost"),
		Entry("a Narrow Lineage without partitions whose completions are not one per output", "Lineage/extract-features",
			func(o *unstructured.Unstructured) { set(o, "spec.partitions", nil) },
			"a Narrow Lineage reruns only the completion indexes that write what was lost"),
		Entry("a partition of a Dataset that is not an output", "Lineage/extract-features",
			func(o *unstructured.Unstructured) {
				set(o, "spec.partitions[0]", map[string]any{"index": int64(0), "output": "other", "path": "part-0"})
			},
			"every spec.partitions[].output must be one of spec.outputs"),
		Entry("a partition path that climbs out of the output", "Lineage/extract-features",
			func(o *unstructured.Unstructured) { set(o, "spec.partitions[0].path", "../escape") },
			"spec.partitions[].path is relative to the output and may not contain '..'"),

		// CachePolicy
		Entry("an edge fraction of 0", "CachePolicy/training",
			func(o *unstructured.Unstructured) { set(o, "spec.checkpoint.edgeFraction", 0.0) },
			"spec.checkpoint.edgeFraction must be in (0, 1]"),
		Entry("an edge fraction above 1", "CachePolicy/training",
			func(o *unstructured.Unstructured) { set(o, "spec.checkpoint.edgeFraction", 1.2) },
			"spec.checkpoint.edgeFraction must be in (0, 1]"),
		Entry("a negative edge fraction", "CachePolicy/training",
			func(o *unstructured.Unstructured) { set(o, "spec.checkpoint.edgeFraction", -0.5) },
			"spec.checkpoint.edgeFraction must be in (0, 1]"),
		Entry("a replication count of 0", "CachePolicy/training",
			func(o *unstructured.Unstructured) { set(o, "spec.replication.count", int64(0)) },
			"spec.replication.count is the number of copies including the original and must be at least 1"),
		Entry("a negative replication count", "CachePolicy/training",
			func(o *unstructured.Unstructured) { set(o, "spec.replication.count", int64(-2)) },
			"spec.replication.count is the number of copies including the original and must be at least 1"),
		Entry("an LRFU lambda above 1", "CachePolicy/training",
			func(o *unstructured.Unstructured) { set(o, "spec.eviction.lambda", 2.0) },
			"spec.eviction.lambda must be in [0, 1]"),
		Entry("a lambda with a policy other than LRFU", "CachePolicy/training",
			func(o *unstructured.Unstructured) { set(o, "spec.eviction.policy", "LRU") },
			"spec.eviction.lambda only applies to policy: LRFU"),
		Entry("an Interval checkpoint without an interval", "CachePolicy/training",
			func(o *unstructured.Unstructured) { set(o, "spec.checkpoint.strategy", "Interval") },
			"spec.checkpoint.interval is required with strategy: Interval"),
		Entry("a negative recovery read wait", "CachePolicy/training",
			func(o *unstructured.Unstructured) { set(o, "spec.recovery.readWait", "-1m") },
			"spec.recovery.readWait must be between 0s and 24h"),
		Entry("a recovery read wait of days", "CachePolicy/training",
			func(o *unstructured.Unstructured) { set(o, "spec.recovery.readWait", "72h") },
			"spec.recovery.readWait must be between 0s and 24h"),
		Entry("an unknown eviction policy", "CachePolicy/training",
			func(o *unstructured.Unstructured) { set(o, "spec.eviction.policy", "FIFO") },
			`supported values: "LRU", "LFU", "LRFU", "MRD"`),
	)
})

func describe(obj runtime.Object) string {
	u, ok := obj.(*unstructured.Unstructured)
	if !ok {
		return fmt.Sprintf("%T", obj)
	}
	return fmt.Sprintf("%s %s: %v", u.GetKind(), u.GetName(), u.Object["spec"])
}

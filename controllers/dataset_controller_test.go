package controllers

import (
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"time"

	. "github.com/onsi/ginkgo/v2"
	. "github.com/onsi/gomega"
	"github.com/onsi/gomega/types"
	appsv1 "k8s.io/api/apps/v1"
	batchv1 "k8s.io/api/batch/v1"
	corev1 "k8s.io/api/core/v1"
	storagev1 "k8s.io/api/storage/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	"k8s.io/apimachinery/pkg/api/resource"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/util/intstr"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/internal/miniotest"
	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
)

var _ = Describe("The Dataset reconciler", func() {
	var namespace, poolName string

	BeforeEach(func() {
		ns := &corev1.Namespace{ObjectMeta: metav1.ObjectMeta{GenerateName: "datasets-"}}
		Expect(k8sClient.Create(ctx, ns)).To(Succeed())
		namespace = ns.Name
		poolName = "pool-" + ns.Name
	})

	createPool := func(fileRoots ...string) {
		pool := &datav1alpha1.TierPool{
			ObjectMeta: metav1.ObjectMeta{Name: poolName},
			Spec: datav1alpha1.TierPoolSpec{
				NodeSelector: map[string]string{"strata.dev/cache": "true", "topology.kubernetes.io/zone": "a"},
				Tiers: []datav1alpha1.Tier{{
					Name: "mem", Medium: datav1alpha1.MediumMemory, Paths: []string{"/mnt/strata/mem"},
					Quota: resource.MustParse("1Gi"),
				}},
				FileSourceRoots: fileRoots,
			},
		}
		Expect(k8sClient.Create(ctx, pool)).To(Succeed())
		DeferCleanup(func() { Expect(client.IgnoreNotFound(k8sClient.Delete(ctx, pool))).To(Succeed()) })
	}

	// s3Dataset reads the prefix <namespace>/<name>/ of the suite's MinIO, where it puts two
	// objects, with the credentials of the Secret "creds".
	s3Dataset := func(name string) *datav1alpha1.Dataset {
		return s3DatasetOf(namespace, name, poolName, map[string]int{"a.bin": 1000, "dir/b.bin": 3 * 1024 * 1024})
	}
	createCredentials := func(secretKey string) {
		Expect(k8sClient.Create(ctx, &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: namespace},
			Data: map[string][]byte{"accessKeyID": []byte(miniotest.AccessKey), "secretAccessKey": []byte(secretKey)}})).To(Succeed())
	}

	// readyCondition waits until the Dataset's Ready condition has the reason, and returns it.
	readyCondition := func(ds *datav1alpha1.Dataset, reason string) metav1.Condition {
		GinkgoHelper()
		return awaitCondition(ds, datasetConditions, datav1alpha1.ConditionReady, reason)
	}

	It("says which TierPool is missing and how to fix it", func() {
		ds := s3Dataset("no-pool")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		cond := readyCondition(ds, ReasonTierPoolNotFound)
		Expect(cond.Message).To(ContainSubstring(`TierPool "` + poolName + `" does not exist`))
		Expect(ds.Status.Phase).To(Equal(datav1alpha1.DatasetPending))
		Expect(ds.Finalizers).To(ContainElement(DatasetFinalizer))
	})

	It("stays Ready while a source it served is unreachable, and says since when and what pods get meanwhile", func() {
		createPool()
		createCredentials(miniotest.SecretKey)
		ds := s3Dataset("outage")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		readyCondition(ds, ReasonNoCSIDriver)
		Expect(ds.Status.PersistentVolumeClaimName).NotTo(BeEmpty())
		Expect(meta.IsStatusConditionTrue(ds.Status.Conditions, datav1alpha1.ConditionSourceReachable)).To(BeTrue())
		files := ds.Status.Files

		poke := func(value string) { // a reconcile now: the sync annotation triggers one
			patch := client.MergeFrom(ds.DeepCopy())
			ds.Annotations = map[string]string{datav1alpha1.AnnotationSyncRequested: value}
			Expect(k8sClient.Patch(ctx, ds, patch)).To(Succeed())
		}
		unreachableSources.Store(ds.Spec.Source.URI, true)
		DeferCleanup(func() { unreachableSources.Delete(ds.Spec.Source.URI) })
		poke("down")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			c := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionSourceReachable)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Status).To(Equal(metav1.ConditionFalse))
			g.Expect(c.Reason).To(Equal(ReasonSourceUnreachable))
			g.Expect(c.Message).To(And(ContainSubstring("unreachable since "+c.LastTransitionTime.UTC().Format(time.RFC3339)),
				ContainSubstring("connection refused"), ContainSubstring("last good listing"), ContainSubstring("EIO")))
		}).Should(Succeed())
		ready := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionReady)
		Expect(ready.Reason).To(Equal(ReasonNoCSIDriver), "the outage does not make the Dataset unservable: %s", ready.Message)
		Expect(ds.Status.Files).To(Equal(files), "the last listing's counts stay")

		unreachableSources.Delete(ds.Spec.Source.URI)
		poke("up")
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			g.Expect(meta.IsStatusConditionTrue(ds.Status.Conditions, datav1alpha1.ConditionSourceReachable)).To(BeTrue())
		}).Should(Succeed())

		By("a Dataset never served with an unreachable source is not Ready, and says why")
		never := s3Dataset("never-served")
		unreachableSources.Store(never.Spec.Source.URI, true)
		DeferCleanup(func() { unreachableSources.Delete(never.Spec.Source.URI) })
		Expect(k8sClient.Create(ctx, never)).To(Succeed())
		readyCondition(never, ReasonSourceUnreachable)
		Expect(meta.FindStatusCondition(never.Status.Conditions, datav1alpha1.ConditionSourceReachable)).To(HaveField("Status", metav1.ConditionFalse))
	})

	It("counts and names the objects its tree cannot show, with a Warning event", func() {
		createPool()
		createCredentials(miniotest.SecretKey)
		// The source's listing ends with "dir" (beside dir/b.bin) and "two//slashes": see
		// openSourceWithHiddenKeys.
		ds := s3Dataset("with-hidden")
		Expect(ds.Spec.Source.URI).To(ContainSubstring(hiddenKeysMarker))
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		readyCondition(ds, ReasonNoCSIDriver)
		Expect(ds.Status.Files).To(BeEquivalentTo(2), "a.bin and dir/b.bin: what the mounts show")
		Expect(ds.Status.TotalBytes).To(BeEquivalentTo(1000 + 3*1024*1024))
		Expect(ds.Status.LeftOutObjects).To(BeEquivalentTo(2))
		Expect(ds.Status.LeftOut).To(ConsistOf(
			datav1alpha1.LeftOutObject{Key: "dir", Reason: "a folder of the same name holds other objects"},
			HaveField("Reason", ContainSubstring("an empty element")),
		))
		Eventually(func() []string { return eventMessages(namespace, ds.Name, ReasonObjectsLeftOut) }).Should(ContainElement(And(
			ContainSubstring("2 object(s) of "+ds.Spec.Source.URI), ContainSubstring(`"dir"`), ContainSubstring("status.leftOut"))))
	})

	It("reads a public bucket without a Secret, and says a private one is not public", func() {
		createPool()
		private := s3Dataset("private-without-secret")
		private.Spec.Source.SecretRef = nil
		Expect(k8sClient.Create(ctx, private)).To(Succeed())
		cond := readyCondition(private, ReasonSourceAccessDenied)
		Expect(cond.Message).To(And(ContainSubstring("refuses anonymous access"), ContainSubstring("spec.source.secretRef")))

		bucket := "public-" + namespace
		s3.MakeBucket(GinkgoT(), bucket)
		s3.Put(GinkgoT(), bucket, "sets/a.bin", make([]byte, 1000))
		s3.MakePublic(GinkgoT(), bucket)
		public := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "public", Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{
				Source:       &datav1alpha1.DatasetSource{URI: "s3://" + bucket + "/sets/", Endpoint: "http://" + s3.Endpoint},
				TierPoolName: poolName,
			},
		}
		Expect(k8sClient.Create(ctx, public)).To(Succeed())
		readyCondition(public, ReasonNoCSIDriver)
		Expect(public.Status.Files).To(BeEquivalentTo(1), "the operator listed the public bucket without credentials")
		pv := &corev1.PersistentVolume{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "strata-" + string(public.UID)}, pv)).To(Succeed())
		Expect(pv.Spec.CSI.NodePublishSecretRef).To(BeNil(), "the workers get no credentials, and read anonymously too")
	})

	It("serves several stores as one tree, each mount with its own Secret, kept in one Secret the kubelet hands the node plugin", func() {
		createPool()
		createCredentials(miniotest.SecretKey)
		bucket := "public-" + namespace
		s3.MakeBucket(GinkgoT(), bucket)
		s3.MakePublic(GinkgoT(), bucket)
		s3.Put(GinkgoT(), bucket, "corpus/ref.txt", make([]byte, 500))
		private := s3Dataset("private-part") // two objects, 1000 + 3 MiB bytes
		mounts := func(name string) *datav1alpha1.Dataset {
			return &datav1alpha1.Dataset{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec: datav1alpha1.DatasetSpec{
					Mounts: []datav1alpha1.DatasetMount{
						{Path: "/raw", Source: *private.Spec.Source},
						{Path: "/reference/v1", Source: datav1alpha1.DatasetSource{URI: "s3://" + bucket + "/corpus/", Endpoint: "http://" + s3.Endpoint}},
					},
					TierPoolName: poolName,
				},
			}
		}

		By("a mount whose Secret is missing is named")
		missing := mounts("missing-secret")
		missing.Spec.Mounts[0].Source.SecretRef = &datav1alpha1.SecretReference{Name: "no-such-secret"}
		Expect(k8sClient.Create(ctx, missing)).To(Succeed())
		cond := readyCondition(missing, ReasonSecretNotFound)
		Expect(cond.Message).To(HavePrefix(`mount /raw (spec.mounts[0]): Secret "no-such-secret" does not exist`))

		By("a mount that lists nothing is named: its folder would not even show")
		empty := mounts("empty-mount")
		empty.Spec.Mounts[1].Source.URI = "s3://" + bucket + "/nothing-here/"
		Expect(k8sClient.Create(ctx, empty)).To(Succeed())
		cond = readyCondition(empty, ReasonSourceEmpty)
		Expect(cond.Message).To(And(HavePrefix("mount /reference/v1 (spec.mounts[1]): there are no objects under s3://"+bucket+"/nothing-here/"),
			ContainSubstring("check spec.mounts[1].source.uri")))

		By("a private mount read without a Secret is named, with the field to set")
		anonymous := mounts("anonymous-private")
		anonymous.Spec.Mounts[0].Source.SecretRef = nil
		Expect(k8sClient.Create(ctx, anonymous)).To(Succeed())
		cond = readyCondition(anonymous, ReasonSourceAccessDenied)
		Expect(cond.Message).To(And(HavePrefix("mount /raw (spec.mounts[0]): the under-store refuses anonymous access"),
			ContainSubstring("set spec.mounts[0].source.secretRef")))

		By("good mounts are served: the status counts both, the volume names both, and one Secret holds the keys of each")
		ds := mounts("mixed")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		readyCondition(ds, ReasonNoCSIDriver)
		Expect(ds.Status.Files).To(BeEquivalentTo(3), "two objects of the private bucket and one of the public one")
		Expect(ds.Status.MountPaths).To(Equal("/raw,/reference/v1"), "for kubectl get -o wide")
		Expect(ds.Status.TotalBytes).To(BeEquivalentTo(1000 + 3*1024*1024 + 500))
		pv := &corev1.PersistentVolume{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "strata-" + string(ds.UID)}, pv)).To(Succeed())
		Expect(pv.Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(datav1alpha1.VolumeAttributeMounts, datav1alpha1.EncodeVolumeMounts([]datav1alpha1.VolumeMount{
			{Path: "/raw", URI: ds.Spec.Mounts[0].Source.URI, Endpoint: ds.Spec.Mounts[0].Source.Endpoint},
			{Path: "/reference/v1", URI: ds.Spec.Mounts[1].Source.URI, Endpoint: ds.Spec.Mounts[1].Source.Endpoint},
		})))
		Expect(pv.Spec.CSI.VolumeAttributes).NotTo(HaveKey(datav1alpha1.VolumeAttributeSourceURI))
		combined := mountsSecretName(ds)
		Expect(pv.Spec.CSI.NodePublishSecretRef).To(Equal(&corev1.SecretReference{Name: combined, Namespace: namespace}))
		secret := &corev1.Secret{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: combined}, secret)).To(Succeed())
		Expect(metav1.IsControlledBy(secret, ds)).To(BeTrue(), "deleted with the Dataset")
		Expect(secret.Data).To(Equal(map[string][]byte{
			datav1alpha1.MountCredentialKey(0, "accessKeyID"):     []byte(miniotest.AccessKey),
			datav1alpha1.MountCredentialKey(0, "secretAccessKey"): []byte(miniotest.SecretKey),
		}), "the public mount has no keys")

		By("a rotated Secret of a mount reaches the combined one")
		creds := &corev1.Secret{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "creds"}, creds)).To(Succeed())
		creds.Data["sessionToken"] = []byte("rotated")
		Expect(k8sClient.Update(ctx, creds)).To(Succeed())
		patch := client.MergeFrom(ds.DeepCopy())
		ds.Annotations = map[string]string{"poke": "1"} // a reconcile now, as the next periodic one would
		Expect(k8sClient.Patch(ctx, ds, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: combined}, secret)).To(Succeed())
			g.Expect(secret.Data).To(HaveKeyWithValue(datav1alpha1.MountCredentialKey(0, "sessionToken"), []byte("rotated")))
		}).Should(Succeed())
	})

	It("reads a source as a role, with tokens of a ServiceAccount that the operator asks for, keeps and renews", func() {
		createPool()
		// A MinIO that trusts the envtest API server's ServiceAccount tokens, as AWS STS trusts
		// a cluster's issuer for IRSA: it fetches the API server's keys through a relay.
		issuer, jwks := apiServerIssuer()
		const audience = "strata-test-sts"
		sts := miniotest.Start(GinkgoT(), miniotest.ServeOpenID(GinkgoT(), issuer, jwks).Env(audience, "readwrite")...)
		sts.MakeBucket(GinkgoT(), "models")
		sts.Put(GinkgoT(), "models", "bert/weights.bin", make([]byte, 4096))
		role := miniotest.OpenIDRoleARN(audience)
		dataset := func(name string, w datav1alpha1.WebIdentity) *datav1alpha1.Dataset {
			return &datav1alpha1.Dataset{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec: datav1alpha1.DatasetSpec{
					Source:       &datav1alpha1.DatasetSource{URI: "s3://models/bert/", Endpoint: "http://" + sts.Endpoint, WebIdentity: &w},
					TierPoolName: poolName,
				},
			}
		}

		By("a ServiceAccount that does not exist is named, with what to do")
		ds := dataset("bert", datav1alpha1.WebIdentity{RoleARN: role, ServiceAccountName: "model-reader", Audience: audience})
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		cond := readyCondition(ds, ReasonServiceAccountNotFound)
		Expect(cond.Message).To(HavePrefix(`ServiceAccount "model-reader" does not exist in namespace ` + namespace))

		By("once it exists, the Dataset is listed as the role and served, its token kept in a Secret it owns")
		Expect(k8sClient.Create(ctx, &corev1.ServiceAccount{ObjectMeta: metav1.ObjectMeta{Name: "model-reader", Namespace: namespace}})).To(Succeed())
		readyCondition(ds, ReasonNoCSIDriver)
		Expect(ds.Status.Files).To(BeEquivalentTo(1))
		Expect(ds.Status.TotalBytes).To(BeEquivalentTo(4096))
		pv := &corev1.PersistentVolume{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "strata-" + string(ds.UID)}, pv)).To(Succeed())
		kept := webIdentitySecretName(ds)
		Expect(pv.Spec.CSI.NodePublishSecretRef).To(Equal(&corev1.SecretReference{Name: kept, Namespace: namespace}))
		secret := &corev1.Secret{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: kept}, secret)).To(Succeed())
		Expect(metav1.IsControlledBy(secret, ds)).To(BeTrue(), "deleted with the Dataset")
		Expect(secret.Data).To(HaveKeyWithValue(understore.CredentialRoleARN, []byte(role)))
		token := string(secret.Data[understore.CredentialWebIdentityToken])
		Expect(tokenClaims(token)).To(And(
			HaveKeyWithValue("sub", "system:serviceaccount:"+namespace+":model-reader"),
			HaveKeyWithValue("aud", ConsistOf(audience)),
		))
		expires, err := time.Parse(time.RFC3339, string(secret.Data[webIdentityTokenExpiresKey]))
		Expect(err).NotTo(HaveOccurred())
		Expect(expires).To(BeTemporally("~", time.Now().Add(webIdentityTokenTTL), 5*time.Minute))

		By("a token with less than a fifth of its life left is replaced by a new one")
		secret.Data[webIdentityTokenExpiresKey] = []byte(time.Now().Add(webIdentityTokenTTL / 10).UTC().Format(time.RFC3339))
		Expect(k8sClient.Update(ctx, secret)).To(Succeed())
		patch := client.MergeFrom(ds.DeepCopy())
		ds.Annotations = map[string]string{"poke": "1"} // a reconcile now, as the renewal's requeue would
		Expect(k8sClient.Patch(ctx, ds, patch)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: kept}, secret)).To(Succeed())
			g.Expect(string(secret.Data[understore.CredentialWebIdentityToken])).NotTo(Equal(token))
			expires, err := time.Parse(time.RFC3339, string(secret.Data[webIdentityTokenExpiresKey]))
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(expires).To(BeTemporally(">", time.Now().Add(webIdentityTokenTTL/2)))
		}).Should(Succeed())

		By("a mount read as a role keeps its token in the mounts' Secret, under its index")
		mounted := dataset("mounted", datav1alpha1.WebIdentity{RoleARN: role, ServiceAccountName: "model-reader", Audience: audience})
		mounted.Spec.Mounts = []datav1alpha1.DatasetMount{{Path: "/models", Source: *mounted.Spec.Source}}
		mounted.Spec.Source = nil
		Expect(k8sClient.Create(ctx, mounted)).To(Succeed())
		readyCondition(mounted, ReasonNoCSIDriver)
		Expect(mounted.Status.Files).To(BeEquivalentTo(1))
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: mountsSecretName(mounted)}, secret)).To(Succeed())
		Expect(secret.Data).To(And(
			HaveKeyWithValue(datav1alpha1.MountCredentialKey(0, understore.CredentialRoleARN), []byte(role)),
			HaveKey(datav1alpha1.MountCredentialKey(0, understore.CredentialWebIdentityToken))))

		By("a role that does not trust the token is refused, naming the ServiceAccount and the role")
		refused := dataset("refused", datav1alpha1.WebIdentity{RoleARN: "arn:minio:iam:::role/nobody", ServiceAccountName: "model-reader", Audience: audience})
		Expect(k8sClient.Create(ctx, refused)).To(Succeed())
		cond = readyCondition(refused, ReasonSourceAccessDenied)
		Expect(cond.Message).To(And(
			HavePrefix(`the under-store refuses ServiceAccount "model-reader" as role arn:minio:iam:::role/nobody`),
			ContainSubstring("system:serviceaccount:"+namespace+":model-reader")))

		By("an audience the API server accepts is refused, and its token is never kept")
		unsafe := dataset("unsafe", datav1alpha1.WebIdentity{RoleARN: role, ServiceAccountName: "model-reader", Audience: issuer})
		Expect(k8sClient.Create(ctx, unsafe)).To(Succeed())
		cond = readyCondition(unsafe, ReasonWebIdentityUnsafe)
		Expect(cond.Message).To(ContainSubstring(`the API server accepts tokens for the audience "` + issuer + `"`))
		err = k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: webIdentitySecretName(unsafe)}, &corev1.Secret{})
		Expect(apierrors.IsNotFound(err)).To(BeTrue(), "no Secret holds a token the API server takes: %v", err)
	})

	It("lists an http(s) source from its directory index pages, and says what to do with a server that has none", func() {
		createPool()
		root := GinkgoT().TempDir()
		Expect(os.MkdirAll(filepath.Join(root, "corpus", "en"), 0o750)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(root, "corpus", "en", "a.txt"), make([]byte, 700), 0o640)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(root, "corpus", "b.txt"), make([]byte, 300), 0o640)).To(Succeed())
		mux := http.NewServeMux()
		mux.Handle("/files/", http.StripPrefix("/files/", http.FileServer(http.Dir(root))))
		mux.HandleFunc("/api/", func(w http.ResponseWriter, _ *http.Request) {
			w.Header().Set("Content-Type", "application/json")
			_, _ = w.Write([]byte(`{"objects": []}`))
		})
		web := httptest.NewServer(mux)
		DeferCleanup(web.Close)
		dataset := func(name, uri string) *datav1alpha1.Dataset {
			return &datav1alpha1.Dataset{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec:       datav1alpha1.DatasetSpec{Source: &datav1alpha1.DatasetSource{URI: uri}, TierPoolName: poolName},
			}
		}

		ds := dataset("corpus", web.URL+"/files/corpus/")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		readyCondition(ds, ReasonNoCSIDriver)
		Expect(ds.Status.Files).To(BeEquivalentTo(2))
		Expect(ds.Status.TotalBytes).To(BeEquivalentTo(1000))

		api := dataset("api", web.URL+"/api/")
		Expect(k8sClient.Create(ctx, api)).To(Succeed())
		cond := readyCondition(api, ReasonSourceNotListable)
		Expect(cond.Message).To(And(
			HavePrefix(web.URL+"/api/ cannot be listed: point spec.source.uri at a folder whose server answers with an HTML directory index"),
			ContainSubstring(`answers with "application/json"`)))
	})

	It("reports a missing Secret, then one without the keys, then gives the Dataset its volume and claim", func() {
		createPool()
		ds := s3Dataset("photos")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		cond := readyCondition(ds, ReasonSecretNotFound)
		Expect(cond.Message).To(ContainSubstring(`Secret "creds" does not exist in namespace ` + namespace))
		Expect(cond.Message).To(ContainSubstring("accessKeyID and secretAccessKey"))

		secret := &corev1.Secret{ObjectMeta: metav1.ObjectMeta{Name: "creds", Namespace: namespace},
			Data: map[string][]byte{"accessKeyID": []byte("user")}}
		Expect(k8sClient.Create(ctx, secret)).To(Succeed())
		cond = readyCondition(ds, ReasonSecretIncomplete)
		Expect(cond.Message).To(ContainSubstring("has no secretAccessKey"))

		secret.Data["secretAccessKey"] = []byte("not the key")
		Expect(k8sClient.Update(ctx, secret)).To(Succeed())
		cond = readyCondition(ds, ReasonSourceAccessDenied)
		Expect(cond.Message).To(And(ContainSubstring(`refuses the credentials of Secret "creds"`), ContainSubstring(ds.Spec.Source.URI)))

		secret.Data["accessKeyID"], secret.Data["secretAccessKey"] = []byte(miniotest.AccessKey), []byte(miniotest.SecretKey)
		Expect(k8sClient.Update(ctx, secret)).To(Succeed())
		cond = readyCondition(ds, ReasonNoCSIDriver)
		Expect(cond.Message).To(ContainSubstring("the CSI driver csi.strata.dev that serves it is not installed"))
		Expect(ds.Status.PersistentVolumeClaimName).To(Equal("photos"))

		pvc := &corev1.PersistentVolumeClaim{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "photos"}, pvc)).To(Succeed())
		Expect(pvc.Spec.VolumeName).To(Equal("strata-" + string(ds.UID)))
		Expect(pvc.Spec.AccessModes).To(ConsistOf(corev1.ReadOnlyMany))
		Expect(metav1.IsControlledBy(pvc, ds)).To(BeTrue())

		pv := &corev1.PersistentVolume{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: pvc.Spec.VolumeName}, pv)).To(Succeed())
		Expect(pv.Spec.CSI.Driver).To(Equal(CSIDriverName))
		Expect(pv.Spec.CSI.VolumeAttributes).To(Equal(map[string]string{
			datav1alpha1.VolumeAttributeNamespace:      namespace,
			datav1alpha1.VolumeAttributeDataset:        "photos",
			datav1alpha1.VolumeAttributeUID:            string(ds.UID),
			datav1alpha1.VolumeAttributePool:           poolName,
			datav1alpha1.VolumeAttributeSourceURI:      ds.Spec.Source.URI,
			datav1alpha1.VolumeAttributeSourceEndpoint: ds.Spec.Source.Endpoint,
		}), "the node plugin finds everything it needs to serve the Dataset in the volume")
		Expect(pv.Spec.CSI.NodePublishSecretRef).To(Equal(&corev1.SecretReference{Name: "creds", Namespace: namespace}),
			"the kubelet hands the node plugin the Dataset's Secret, from the Dataset's own namespace")
		Expect(pv.Spec.NodeAffinity).To(Equal(&corev1.VolumeNodeAffinity{Required: &corev1.NodeSelector{
			NodeSelectorTerms: []corev1.NodeSelectorTerm{{MatchExpressions: []corev1.NodeSelectorRequirement{
				{Key: "strata.dev/cache", Operator: corev1.NodeSelectorOpIn, Values: []string{"true"}},
				{Key: "topology.kubernetes.io/zone", Operator: corev1.NodeSelectorOpIn, Values: []string{"a"}},
			}}},
		}}), "pods that mount the Dataset are scheduled only where a worker of its pool serves it")
		Expect(ds.Status.Files).To(BeEquivalentTo(2), "the probe counts the source's objects")
		Expect(ds.Status.TotalBytes).To(BeEquivalentTo(1000 + 3*1024*1024))
		Expect(ds.Status.Size).To(Equal("3.0Mi"))
		Expect(pv.Spec.ClaimRef.Namespace).To(Equal(namespace))
		Expect(pv.Spec.ClaimRef.Name).To(Equal("photos"))

		driver := &storagev1.CSIDriver{ObjectMeta: metav1.ObjectMeta{Name: CSIDriverName}}
		Expect(k8sClient.Create(ctx, driver)).To(Succeed())
		DeferCleanup(func() { Expect(k8sClient.Delete(ctx, driver)).To(Succeed()) })
		cond = readyCondition(ds, ReasonNoReadyWorkers)
		Expect(cond.Message).To(ContainSubstring("has no ready cache worker"))
	})

	It("says pods can mount its claim only once the claim is bound to its volume", func() {
		ns := &corev1.Namespace{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: namespace}, ns)).To(Succeed())
		ns.Labels = map[string]string{unboundNamespaceLabel: "true"}
		Expect(k8sClient.Update(ctx, ns)).To(Succeed())
		createPool()
		createCredentials(miniotest.SecretKey)
		makeServable(poolName)
		ds := s3Dataset("unbound")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		cond := readyCondition(ds, ReasonClaimNotBound)
		Expect(cond.Message).To(And(
			ContainSubstring("claim unbound is "), // Pending, or new if the operator's cache has not seen it yet
			ContainSubstring("not yet bound to volume strata-"+string(ds.UID)),
			ContainSubstring("kubectl -n "+namespace+" describe pvc unbound")))
		Expect(ds.Status.Phase).To(Equal(datav1alpha1.DatasetPending), "a pod that mounted it now would wait out the scheduler's back-off")

		By("binding the claim, as kube-controller-manager would")
		bindByHand(namespace, "unbound")
		cond = readyCondition(ds, ReasonVolumeReady)
		Expect(cond.Message).To(Equal("pods can mount claim unbound"))
	})

	It("says what is wrong with a source that does not answer, does not exist or is empty", func() {
		createPool()
		createCredentials(miniotest.SecretKey)
		cases := map[string]struct {
			change  func(src *datav1alpha1.DatasetSource)
			reason  string
			message string
		}{
			"an endpoint nothing listens on": {
				change:  func(src *datav1alpha1.DatasetSource) { src.Endpoint = "http://" + miniotest.ClosedAddr(GinkgoT()) },
				reason:  ReasonSourceUnreachable,
				message: "check spec.source.endpoint",
			},
			"a bucket that does not exist": {
				change:  func(src *datav1alpha1.DatasetSource) { src.URI = "s3://no-such-bucket/x/" },
				reason:  ReasonSourceNotFound,
				message: "check the bucket in spec.source.uri",
			},
			"a prefix with no objects": {
				change:  func(src *datav1alpha1.DatasetSource) { src.URI = "s3://datasets/nothing-here/" },
				reason:  ReasonSourceEmpty,
				message: "there are no objects under s3://datasets/nothing-here/",
			},
			"no Secret for a bucket that is not public": {
				change:  func(src *datav1alpha1.DatasetSource) { src.SecretRef = nil },
				reason:  ReasonSourceAccessDenied,
				message: "set spec.source.secretRef",
			},
		}
		i := 0
		for name, tc := range cases {
			By(name)
			ds := s3Dataset(fmt.Sprintf("bad-%d", i))
			i++
			tc.change(ds.Spec.Source)
			Expect(k8sClient.Create(ctx, ds)).To(Succeed())
			cond := readyCondition(ds, tc.reason)
			Expect(cond.Message).To(ContainSubstring(tc.message), "%s", name)
			pvc := &corev1.PersistentVolumeClaim{}
			err := k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ds.Name}, pvc)
			Expect(apierrors.IsNotFound(err)).To(BeTrue(), "%s: no claim is made for a source that cannot be served", name)
		}
	})

	It("preloads a Dataset that asks for it with a Job of its namespace, Loading until the Job ends", func() {
		createPool()
		createCredentials(miniotest.SecretKey)
		makeServable(poolName)

		preloaded := func(ds *datav1alpha1.Dataset, reason string, phase datav1alpha1.DatasetPhase) metav1.Condition {
			GinkgoHelper()
			return awaitCondition(ds, datasetConditions, datav1alpha1.ConditionPreloaded, reason,
				func(g Gomega) { g.Expect(ds.Status.Phase).To(Equal(phase)) })
		}
		endJob := func(ds *datav1alpha1.Dataset, ok bool) {
			GinkgoHelper()
			Eventually(func(g Gomega) {
				job := &batchv1.Job{}
				g.Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: ds.Name + "-preload"}, job)).To(Succeed())
				endJob(job, ok)
				g.Expect(k8sClient.Status().Update(ctx, job)).To(Succeed())
			}).Should(Succeed(), "ending the preload Job of %s", ds.Name)
		}

		ds := s3Dataset("warm")
		ds.Spec.Preload = true
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		cond := preloaded(ds, datav1alpha1.ReasonPreloading, datav1alpha1.DatasetLoading)
		Expect(cond.Message).To(ContainSubstring("kubectl -n " + namespace + " logs job/warm-preload"))

		job := &batchv1.Job{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "warm-preload"}, job)).To(Succeed())
		Expect(metav1.IsControlledBy(job, ds)).To(BeTrue(), "the Job goes with the Dataset")
		pod := job.Spec.Template.Spec
		Expect(pod.Containers).To(ConsistOf(And(
			HaveField("Image", testWorkerSpec.Image),
			HaveField("Args", []string{"preload", "/data"}),
			HaveField("VolumeMounts", ConsistOf(And(HaveField("MountPath", "/data"), HaveField("ReadOnly", BeTrue())))),
			HaveField("SecurityContext.AllowPrivilegeEscalation", HaveValue(BeFalse())),
		)))
		Expect(pod.SecurityContext.RunAsNonRoot).To(HaveValue(BeTrue()), "the preload runs as a tenant's pod would, without privileges")
		Expect(pod.Volumes).To(ConsistOf(HaveField("VolumeSource.PersistentVolumeClaim.ClaimName", "warm")))

		endJob(ds, true)
		preloaded(ds, datav1alpha1.ReasonPreloaded, datav1alpha1.DatasetReady)

		failing := s3Dataset("cold")
		failing.Spec.Preload = true
		Expect(k8sClient.Create(ctx, failing)).To(Succeed())
		preloaded(failing, datav1alpha1.ReasonPreloading, datav1alpha1.DatasetLoading)
		endJob(failing, false)
		cond = preloaded(failing, datav1alpha1.ReasonPreloadFailed, datav1alpha1.DatasetReady)
		Expect(cond.Message).To(And(ContainSubstring("BackoffLimitExceeded"), ContainSubstring("kubectl strata -n "+namespace+" load cold")))
	})

	It("refuses a file:// source outside the TierPool's fileSourceRoots", func() {
		createPool("/srv/shared")
		ds := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "host-files", Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{
				Source:       &datav1alpha1.DatasetSource{URI: "file:///etc/kubernetes/pki"},
				TierPoolName: poolName,
			},
		}
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		cond := readyCondition(ds, ReasonFileSourceNotAllowed)
		Expect(cond.Message).To(ContainSubstring("is not under any of TierPool"))
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "host-files"}, &corev1.PersistentVolumeClaim{})).
			To(Satisfy(apierrors.IsNotFound), "no claim for a refused source")
	})

	It("checks that an output's Lineage exists and lists it", func() {
		createPool()
		ds := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "features", Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{
				Lineage:      &datav1alpha1.LineageReference{Name: "extract"},
				TierPoolName: poolName,
			},
		}
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		readyCondition(ds, ReasonLineageNotFound)

		lineage := newLineage(namespace, "extract", []string{"raw"}, []string{"other"})
		Expect(k8sClient.Create(ctx, lineage)).To(Succeed())
		cond := readyCondition(ds, ReasonLineageMismatch)
		Expect(cond.Message).To(ContainSubstring(`does not list "features" in spec.outputs`))

		By("once the Lineage lists it, its volume is a writable output's, with no source")
		// The Lineage reconciler writes its status meanwhile: read it again on a conflict.
		Eventually(func() error {
			if err := k8sClient.Get(ctx, client.ObjectKeyFromObject(lineage), lineage); err != nil {
				return err
			}
			lineage.Spec.Outputs = []string{"features"}
			return k8sClient.Update(ctx, lineage)
		}).Should(Succeed())
		readyCondition(ds, ReasonNoCSIDriver)
		pv := &corev1.PersistentVolume{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "strata-" + string(ds.UID)}, pv)).To(Succeed())
		Expect(pv.Spec.AccessModes).To(ConsistOf(corev1.ReadWriteMany))
		Expect(pv.Spec.CSI.ReadOnly).To(BeFalse())
		Expect(pv.Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(datav1alpha1.VolumeAttributeOutput, "true"))
		Expect(pv.Spec.CSI.VolumeAttributes).NotTo(HaveKey(datav1alpha1.VolumeAttributeSourceURI))
		Expect(pv.Spec.CSI.NodePublishSecretRef).To(BeNil())
	})

	It("waits to be deleted while a Lineage that reads it has uncheckpointed outputs, then removes its claim and volume", func() {
		createPool()
		createCredentials(miniotest.SecretKey)
		ds := s3Dataset("raw")
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())
		readyCondition(ds, ReasonNoCSIDriver)
		pvName := "strata-" + string(ds.UID)

		lineage := newLineage(namespace, "clean", []string{"raw"}, []string{"cleaned"})
		Expect(k8sClient.Create(ctx, lineage)).To(Succeed())

		Expect(k8sClient.Delete(ctx, ds)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			c := meta.FindStatusCondition(ds.Status.Conditions, ConditionDeletionBlocked)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Message).To(ContainSubstring("Lineage clean reads this Dataset and its output cleaned is not checkpointed"))
		}).Should(Succeed(), "waiting for the deletion to be blocked by Lineage clean")

		Expect(k8sClient.Delete(ctx, lineage)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Satisfy(apierrors.IsNotFound))
		}).Should(Succeed(), "waiting for Dataset raw to go once the Lineage that needed it is given up")

		// The claim and volume are deleted; their protection finalizers keep them until the
		// kube-controller-manager (absent in envtest) releases them.
		Eventually(func(g Gomega) {
			pv := &corev1.PersistentVolume{}
			err := k8sClient.Get(ctx, client.ObjectKey{Name: pvName}, pv)
			g.Expect(apierrors.IsNotFound(err) || !pv.DeletionTimestamp.IsZero()).To(BeTrue(), "volume %s still live", pvName)
			pvc := &corev1.PersistentVolumeClaim{}
			err = k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "raw"}, pvc)
			g.Expect(apierrors.IsNotFound(err) || !pvc.DeletionTimestamp.IsZero()).To(BeTrue(), "claim raw still live")
		}).Should(Succeed())
	})

	It("serves a pvc:// source through a claim server it runs in the Dataset's namespace", func() {
		createPool()
		createClaim(namespace, "raw-data")
		ds := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "from-claim", Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{
				Source:       &datav1alpha1.DatasetSource{URI: "pvc://raw-data/sets/v1"},
				TierPoolName: poolName,
			},
		}
		Expect(k8sClient.Create(ctx, ds)).To(Succeed())

		By("making the claim server, reporting it not ready while it has no pod")
		cond := readyCondition(ds, ReasonClaimServerNotReady)
		Expect(cond.Message).To(And(ContainSubstring(`PersistentVolumeClaim "raw-data"`), ContainSubstring("its pod does not exist yet")))
		name := "from-claim-claim-server"
		deploy := &appsv1.Deployment{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, deploy)).To(Succeed())
		Expect(metav1.IsControlledBy(deploy, ds)).To(BeTrue())
		pod := deploy.Spec.Template.Spec
		Expect(pod.Volumes).To(ContainElement(corev1.Volume{Name: "claim", VolumeSource: corev1.VolumeSource{
			PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: "raw-data", ReadOnly: true}}}))
		Expect(pod.Containers[0].Image).To(Equal(testWorkerSpec.Image))
		Expect(pod.Containers[0].Args).To(ContainElements("serve-claim", "--path=sets/v1"))
		Expect(pod.Containers[0].SecurityContext.Capabilities.Add).To(ConsistOf(corev1.Capability("DAC_OVERRIDE")),
			"it reads any file of the claim, and can do nothing else a root user could")
		Expect(*pod.AutomountServiceAccountToken).To(BeFalse())
		svc := &corev1.Service{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, svc)).To(Succeed())
		Expect(svc.Spec.Selector).To(Equal(deploy.Spec.Selector.MatchLabels))
		secret := &corev1.Secret{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name}, secret)).To(Succeed())
		token := string(secret.Data["token"])
		Expect(token).To(HaveLen(64))
		Expect(secret.Data).To(HaveLen(1), "the Secret the kubelet hands the node plugin holds the token alone")

		By("certifying the claim server for its Service's name, in a Secret of its own that its pod mounts")
		Expect(svc.Spec.Ports).To(HaveLen(1))
		Expect(svc.Spec.Ports[0].TargetPort).To(Equal(intstr.FromString("https")))
		certSecret := &corev1.Secret{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: name + "-tls"}, certSecret)).To(Succeed())
		Expect(metav1.IsControlledBy(certSecret, ds)).To(BeTrue())
		Expect(certSecret.Type).To(Equal(corev1.SecretTypeTLS))
		Expect(certSecret.Data["ca.crt"]).To(Equal(testCA.CA.CertPEM))
		cert, err := tls.X509KeyPair(certSecret.Data[corev1.TLSCertKey], certSecret.Data[corev1.TLSPrivateKeyKey])
		Expect(err).NotTo(HaveOccurred())
		Expect(cert.Leaf.DNSNames).To(ConsistOf(name + "." + namespace + ".svc"))
		Expect(pki.FromCertificate(cert.Leaf)).To(Equal(pki.ClaimServer(namespace, name)))
		Expect(pod.Volumes).To(ContainElement(And(
			HaveField("Name", "tls"), HaveField("Secret.SecretName", name+"-tls"), HaveField("Secret.Items", BeEmpty()))),
			"mounted whole, so that the kubelet brings renewed certificates")
		Expect(pod.Containers[0].Args).To(ContainElement("--tls-dir=/var/run/strata/claim-tls"))

		By("repeating why its pod fails")
		failing := &corev1.Pod{
			ObjectMeta: metav1.ObjectMeta{Name: name + "-7d9f-x2x4q", Namespace: namespace, Labels: deploy.Spec.Template.Labels},
			Spec:       corev1.PodSpec{Containers: []corev1.Container{{Name: "claim-server", Image: testWorkerSpec.Image}}},
		}
		Expect(k8sClient.Create(ctx, failing)).To(Succeed())
		failing.Status.ContainerStatuses = []corev1.ContainerStatus{{
			Name: "claim-server", RestartCount: 3,
			LastTerminationState: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{
				ExitCode: 1, Message: `opening the claim's folder (does "sets/v1" exist in the claim?): not found`}},
		}}
		Expect(k8sClient.Status().Update(ctx, failing)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
			c := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionReady)
			g.Expect(c).NotTo(BeNil())
			g.Expect(c.Message).To(ContainSubstring(`exited (3 restarts): opening the claim's folder (does "sets/v1" exist in the claim?)`))
		}).Should(Succeed(), "a change of the claim server's pod is seen at once")

		By("probing the source through the claim server once it is available")
		dir := GinkgoT().TempDir()
		Expect(os.MkdirAll(filepath.Join(dir, "sets", "v1", "nested"), 0o750)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(dir, "sets", "v1", "a.bin"), make([]byte, 1000), 0o640)).To(Succeed())
		Expect(os.WriteFile(filepath.Join(dir, "sets", "v1", "nested", "b.bin"), make([]byte, 2000), 0o640)).To(Succeed())
		endpoint := claimServers.serve(namespace, name, filepath.Join(dir, "sets", "v1"), token)
		deploy.Status.Replicas, deploy.Status.AvailableReplicas, deploy.Status.ReadyReplicas = 1, 1, 1
		deploy.Status.ObservedGeneration = deploy.Generation
		Expect(k8sClient.Status().Update(ctx, deploy)).To(Succeed())
		cond = readyCondition(ds, ReasonNoCSIDriver)
		Expect(ds.Status.Files).To(BeEquivalentTo(2))
		Expect(ds.Status.TotalBytes).To(BeEquivalentTo(3000))

		pv := &corev1.PersistentVolume{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "strata-" + string(ds.UID)}, pv)).To(Succeed())
		Expect(pv.Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(datav1alpha1.VolumeAttributeSourceEndpoint, endpoint),
			"the workers read the source from the claim server")
		Expect(pv.Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(datav1alpha1.VolumeAttributeSourceURI, "pvc://raw-data/sets/v1"))
		Expect(pv.Spec.CSI.NodePublishSecretRef).To(Equal(&corev1.SecretReference{Name: name, Namespace: namespace}),
			"the kubelet hands the node plugin the claim server's token")

		By("a claim mounted beside a bucket gets a claim server of its own, named by the volume with its token in the mounts' Secret")
		createCredentials(miniotest.SecretKey)
		bucket := s3Dataset("beside-claim") // two objects, 1000 + 3 MiB bytes
		mixed := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "claim-and-bucket", Namespace: namespace},
			Spec: datav1alpha1.DatasetSpec{
				Mounts: []datav1alpha1.DatasetMount{
					{Path: "/bucket", Source: *bucket.Spec.Source},
					{Path: "/claim", Source: datav1alpha1.DatasetSource{URI: "pvc://raw-data/sets/v1"}},
				},
				TierPoolName: poolName,
			},
		}
		Expect(k8sClient.Create(ctx, mixed)).To(Succeed())
		cond = readyCondition(mixed, ReasonClaimServerNotReady)
		mountServer := "claim-and-bucket-claim-server-1"
		Expect(cond.Message).To(ContainSubstring("Deployment " + namespace + "/" + mountServer))
		mountDeploy := &appsv1.Deployment{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: mountServer}, mountDeploy)).To(Succeed())
		Expect(mountDeploy.Spec.Selector.MatchLabels).To(HaveKeyWithValue(claimMountLabel, "1"), "apart from the pods of the Dataset's other claim servers")
		Expect(mountDeploy.Spec.Template.Spec.Containers[0].Args).To(ContainElement("--path=sets/v1"))
		mountToken := &corev1.Secret{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: mountServer}, mountToken)).To(Succeed())
		mountEndpoint := claimServers.serve(namespace, mountServer, filepath.Join(dir, "sets", "v1"), string(mountToken.Data["token"]))
		mountDeploy.Status.Replicas, mountDeploy.Status.AvailableReplicas, mountDeploy.Status.ReadyReplicas = 1, 1, 1
		mountDeploy.Status.ObservedGeneration = mountDeploy.Generation
		Expect(k8sClient.Status().Update(ctx, mountDeploy)).To(Succeed())
		readyCondition(mixed, ReasonNoCSIDriver)
		Expect(mixed.Status.Files).To(BeEquivalentTo(4), "two objects of the bucket and two files of the claim")
		Expect(mixed.Status.TotalBytes).To(BeEquivalentTo(1000 + 3*1024*1024 + 3000))
		Expect(k8sClient.Get(ctx, client.ObjectKey{Name: "strata-" + string(mixed.UID)}, pv)).To(Succeed())
		Expect(pv.Spec.CSI.VolumeAttributes).To(HaveKeyWithValue(datav1alpha1.VolumeAttributeMounts, datav1alpha1.EncodeVolumeMounts([]datav1alpha1.VolumeMount{
			{Path: "/bucket", URI: bucket.Spec.Source.URI, Endpoint: bucket.Spec.Source.Endpoint},
			{Path: "/claim", URI: "pvc://raw-data/sets/v1", Endpoint: mountEndpoint},
		})), "the workers read the claim from its server")
		combined := &corev1.Secret{}
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: mountsSecretName(mixed)}, combined)).To(Succeed())
		Expect(combined.Data).To(HaveKeyWithValue(datav1alpha1.MountCredentialKey(1, "token"), mountToken.Data["token"]))

		By("renewing a certificate that is not of Strata's CA, at its next look")
		forged, forgedKey := pkitest.New(GinkgoT()).Issue(GinkgoT(), pki.ClaimServer(namespace, name))
		certSecret.Data[corev1.TLSCertKey], certSecret.Data[corev1.TLSPrivateKeyKey] = forged, forgedKey
		Expect(k8sClient.Update(ctx, certSecret)).To(Succeed())
		Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
		metav1.SetMetaDataAnnotation(&ds.ObjectMeta, "test/touch", "1")
		Expect(k8sClient.Update(ctx, ds)).To(Succeed())
		Eventually(func(g Gomega) {
			g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(certSecret), certSecret)).To(Succeed())
			cert, err := tls.X509KeyPair(certSecret.Data[corev1.TLSCertKey], certSecret.Data[corev1.TLSPrivateKeyKey])
			g.Expect(err).NotTo(HaveOccurred())
			_, err = cert.Leaf.Verify(x509.VerifyOptions{Roots: testCA.CA.Pool(), DNSName: name + "." + namespace + ".svc"})
			g.Expect(err).NotTo(HaveOccurred())
		}).Should(Succeed())
	})

	It("refuses a pvc:// source that is the Dataset's own claim, or whose claim server's name is taken", func() {
		createPool()
		own := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "loop", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Source: &datav1alpha1.DatasetSource{URI: "pvc://loop"}, TierPoolName: poolName},
		}
		Expect(k8sClient.Create(ctx, own)).To(Succeed())
		cond := readyCondition(own, ReasonClaimNotFound)
		Expect(cond.Message).To(ContainSubstring("cannot be its own source"))

		createClaim(namespace, "data")
		Expect(k8sClient.Create(ctx, &corev1.Service{
			ObjectMeta: metav1.ObjectMeta{Name: "taken-claim-server", Namespace: namespace},
			Spec:       corev1.ServiceSpec{Ports: []corev1.ServicePort{{Port: 80}}},
		})).To(Succeed())
		taken := &datav1alpha1.Dataset{
			ObjectMeta: metav1.ObjectMeta{Name: "taken", Namespace: namespace},
			Spec:       datav1alpha1.DatasetSpec{Source: &datav1alpha1.DatasetSource{URI: "pvc://data"}, TierPoolName: poolName},
		}
		Expect(k8sClient.Create(ctx, taken)).To(Succeed())
		cond = readyCondition(taken, ReasonObjectInTheWay)
		Expect(cond.Message).To(ContainSubstring("a Service " + namespace + "/taken-claim-server that this Dataset does not own is in the way"))
		Expect(k8sClient.Get(ctx, client.ObjectKey{Namespace: namespace, Name: "taken-claim-server"}, &appsv1.Deployment{})).
			To(Satisfy(apierrors.IsNotFound), "nothing runs behind a Service that is not Strata's")
	})

	It("steers a new pod that mounts Datasets to the nodes holding them, and leaves other pods alone", func() {
		createPool()
		createCredentials(miniotest.SecretKey)
		images, labels := s3Dataset("images"), s3Dataset("labels")
		for _, ds := range []*datav1alpha1.Dataset{images, labels} {
			Expect(k8sClient.Create(ctx, ds)).To(Succeed())
			readyCondition(ds, ReasonNoCSIDriver) // its claim exists
		}
		// What the operator copies from the master's usage, which envtest has not.
		setNodes := func(ds *datav1alpha1.Dataset, nodes ...datav1alpha1.NodeUsage) {
			Eventually(func(g Gomega) {
				g.Expect(k8sClient.Get(ctx, client.ObjectKeyFromObject(ds), ds)).To(Succeed())
				ds.Status.Nodes = nodes
				g.Expect(k8sClient.Status().Update(ctx, ds)).To(Succeed())
			}).Should(Succeed())
		}
		setNodes(images, datav1alpha1.NodeUsage{Node: "node-b", Bytes: 3000}, datav1alpha1.NodeUsage{Node: "node-a", Bytes: 1000})
		setNodes(labels, datav1alpha1.NodeUsage{Node: "node-a", Bytes: 500}, datav1alpha1.NodeUsage{Node: "node-c", Bytes: 10})
		createClaim(namespace, "scratch")
		pod := func(name string, claims ...string) *corev1.Pod {
			p := &corev1.Pod{
				ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
				Spec: corev1.PodSpec{
					Containers: []corev1.Container{{Name: "train", Image: "trainer"}},
					Affinity: &corev1.Affinity{NodeAffinity: &corev1.NodeAffinity{PreferredDuringSchedulingIgnoredDuringExecution: []corev1.PreferredSchedulingTerm{{
						Weight: 10, Preference: corev1.NodeSelectorTerm{MatchExpressions: []corev1.NodeSelectorRequirement{
							{Key: "gpu", Operator: corev1.NodeSelectorOpExists}}},
					}}}},
				},
			}
			for _, c := range claims {
				p.Spec.Volumes = append(p.Spec.Volumes, corev1.Volume{Name: c, VolumeSource: corev1.VolumeSource{
					PersistentVolumeClaim: &corev1.PersistentVolumeClaimVolumeSource{ClaimName: c, ReadOnly: true}}})
			}
			return p
		}
		term := func(node string, weight int32) corev1.PreferredSchedulingTerm {
			return corev1.PreferredSchedulingTerm{Weight: weight, Preference: corev1.NodeSelectorTerm{MatchFields: []corev1.NodeSelectorRequirement{
				{Key: "metadata.name", Operator: corev1.NodeSelectorOpIn, Values: []string{node}}}}}
		}

		// The webhook reads Datasets from the operator's cache, which follows a status update
		// shortly: a pod is created until the webhook saw the update.
		admitted := func(want types.GomegaMatcher, p *corev1.Pod) *corev1.Pod {
			var created *corev1.Pod
			Eventually(func(g Gomega) {
				created = p.DeepCopy()
				created.GenerateName = p.Name + "-"
				created.Name = ""
				g.Expect(k8sClient.Create(ctx, created)).To(Succeed())
				g.Expect(created.Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution).To(want)
			}).Should(Succeed())
			return created
		}
		own := pod("", "").Spec.Affinity.NodeAffinity.PreferredDuringSchedulingIgnoredDuringExecution[0]

		By("weighting each node by the bytes of the pod's Datasets it holds, after the pod's own preferences")
		trainer := admitted(HaveExactElements(own, term("node-b", 100), term("node-a", 50), term("node-c", 1)),
			pod("trainer", "images", "labels", "scratch"))
		Expect(trainer.Annotations).To(HaveKeyWithValue("data.strata.dev/preferred-nodes", "node-b=100,node-a=50,node-c=1"))

		By("leaving alone a pod that mounts no Dataset, and one that names its node")
		plain := admitted(HaveExactElements(own), pod("plain", "scratch"))
		Expect(plain.Annotations).NotTo(HaveKey("data.strata.dev/preferred-nodes"))
		pinned := pod("pinned", "images")
		pinned.Spec.NodeName = "node-a"
		admitted(HaveExactElements(own), pinned)

		By("leaving alone a pod whose Datasets no node holds yet")
		setNodes(images)
		setNodes(labels)
		admitted(HaveExactElements(own), pod("cold", "images", "labels"))
	})
})

// createClaim creates an unbound claim of 1Gi: in envtest nothing binds it, nor needs to.
func createClaim(namespace, name string) {
	GinkgoHelper()
	Expect(k8sClient.Create(ctx, &corev1.PersistentVolumeClaim{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: corev1.PersistentVolumeClaimSpec{
			AccessModes: []corev1.PersistentVolumeAccessMode{corev1.ReadWriteOnce},
			Resources:   corev1.VolumeResourceRequirements{Requests: corev1.ResourceList{corev1.ResourceStorage: resource.MustParse("1Gi")}},
		},
	})).To(Succeed())
}

func newLineage(namespace, name string, inputs, outputs []string) *datav1alpha1.Lineage {
	return &datav1alpha1.Lineage{
		ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: namespace},
		Spec: datav1alpha1.LineageSpec{
			Inputs:     inputs,
			Outputs:    outputs,
			Dependency: datav1alpha1.DependencyWide,
			Template: batchv1.JobTemplateSpec{Spec: batchv1.JobSpec{Template: corev1.PodTemplateSpec{
				Spec: corev1.PodSpec{
					RestartPolicy: corev1.RestartPolicyNever,
					Containers:    []corev1.Container{{Name: "step", Image: "example.com/step:1"}},
				},
			}}},
		},
	}
}

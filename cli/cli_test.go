package cli

import (
	"bytes"
	"context"
	"strings"
	"testing"
	"time"

	. "github.com/onsi/gomega"
	corev1 "k8s.io/api/core/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"sigs.k8s.io/controller-runtime/pkg/client"
	"sigs.k8s.io/controller-runtime/pkg/client/fake"
	"sigs.k8s.io/controller-runtime/pkg/client/interceptor"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// The commands are tested against the operator in controllers/kubectl_strata_test.go; these
// tests cover what no operator can show there: a cycle (admission refuses one), a user who may
// not read TierPools, an operator that does not answer.

func fakeCLI(t *testing.T, funcs interceptor.Funcs, objs ...client.Object) (*CLI, *bytes.Buffer) {
	t.Helper()
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	if err := datav1alpha1.AddToScheme(scheme); err != nil {
		t.Fatal(err)
	}
	kube := fake.NewClientBuilder().WithScheme(scheme).WithObjects(objs...).WithInterceptorFuncs(funcs).Build()
	out := &bytes.Buffer{}
	return &CLI{Client: kube, Namespace: "team", Out: out}, out
}

func TestLineageNamesTheCycleItsStepsAreCaughtIn(t *testing.T) {
	g := NewWithT(t)
	step := func(name, in, out string) *datav1alpha1.Lineage {
		return &datav1alpha1.Lineage{ObjectMeta: metav1.ObjectMeta{Name: name, Namespace: "team"},
			Spec: datav1alpha1.LineageSpec{Inputs: []string{in}, Outputs: []string{out}}}
	}
	c, out := fakeCLI(t, interceptor.Funcs{},
		step("loop-a", "lb", "la"), step("loop-b", "la", "lb"), step("first", "raw", "x"))
	g.Expect(c.Lineage(context.Background())).To(Succeed())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	g.Expect(strings.Fields(lines[1])[:2]).To(Equal([]string{"0", "first"}), "what can run comes first")
	g.Expect(strings.Fields(lines[2])[:2]).To(Equal([]string{"cycle", "loop-a"}))
	g.Expect(strings.Fields(lines[3])[:2]).To(Equal([]string{"cycle", "loop-b"}))
	g.Expect(out.String()).To(ContainSubstring("loop-a is on a cycle (loop-a <- loop-b <- loop-a)"))
}

func TestLineageShowsTheLastRunAndThePrediction(t *testing.T) {
	g := NewWithT(t)
	ran := &datav1alpha1.Lineage{ObjectMeta: metav1.ObjectMeta{Name: "ran", Namespace: "team"},
		Spec: datav1alpha1.LineageSpec{Outputs: []string{"a"}},
		Status: datav1alpha1.LineageStatus{RunTime: &datav1alpha1.LineageRunTime{
			Runs:      []datav1alpha1.LineageRun{{Job: "ran-run", Milliseconds: 61_400}, {Job: "ran-recompute-1-x", Milliseconds: 32_600}},
			Predicted: "30s",
		}}}
	fresh := &datav1alpha1.Lineage{ObjectMeta: metav1.ObjectMeta{Name: "fresh", Namespace: "team"},
		Spec: datav1alpha1.LineageSpec{Inputs: []string{"a"}, Outputs: []string{"b"}}}
	c, out := fakeCLI(t, interceptor.Funcs{}, ran, fresh)
	g.Expect(c.Lineage(context.Background())).To(Succeed())
	lines := strings.Split(strings.TrimSpace(out.String()), "\n")
	g.Expect(strings.Fields(lines[0])[3:6]).To(Equal([]string{"LAST", "RUN", "PREDICTED"}))
	g.Expect(strings.Fields(lines[1])[:5]).To(Equal([]string{"0", "ran", "-", "33s", "30s"}), "the last run, rounded")
	g.Expect(strings.Fields(lines[2])[:5]).To(Equal([]string{"1", "fresh", "-", "-", "-"}), "never ran: nothing to say")
}

func TestStatusSaysWhenTheUserMayNotReadTierPools(t *testing.T) {
	g := NewWithT(t)
	forbidden := interceptor.Funcs{List: func(ctx context.Context, c client.WithWatch, list client.ObjectList, opts ...client.ListOption) error {
		if _, ok := list.(*datav1alpha1.TierPoolList); ok {
			return apierrors.NewForbidden(schema.GroupResource{Group: "data.strata.dev", Resource: "tierpools"}, "", nil)
		}
		return c.List(ctx, list, opts...)
	}}
	c, out := fakeCLI(t, forbidden, &datav1alpha1.Dataset{
		ObjectMeta: metav1.ObjectMeta{Name: "images", Namespace: "team"},
		Status:     datav1alpha1.DatasetStatus{Phase: datav1alpha1.DatasetReady, Files: 3, TotalBytes: 3 << 20, CachedPercentage: "33%"},
	})
	g.Expect(c.Status(context.Background())).To(Succeed())
	g.Expect(out.String()).To(ContainSubstring("TierPools: you may not list them"))
	g.Expect(out.String()).To(MatchRegexp(`images\s+Ready\s+3\s+3.0Mi\s+33%`))
}

func TestARequestTheOperatorDoesNotAnswerSaysWhatTheDatasetSays(t *testing.T) {
	g := NewWithT(t)
	c, _ := fakeCLI(t, interceptor.Funcs{}, &datav1alpha1.Dataset{
		ObjectMeta: metav1.ObjectMeta{Name: "images", Namespace: "team"},
		Spec:       datav1alpha1.DatasetSpec{Source: &datav1alpha1.DatasetSource{URI: "s3://bucket/images/"}},
		Status: datav1alpha1.DatasetStatus{Conditions: []metav1.Condition{{
			Type: datav1alpha1.ConditionReady, Status: metav1.ConditionFalse, Reason: "SecretNotFound", Message: "Secret creds does not exist",
		}}},
	})
	c.Wait = 100 * time.Millisecond // nothing answers here: the wait runs out
	err := c.Sync(context.Background(), "images")
	g.Expect(err).To(MatchError(errNoAnswer))
	g.Expect(err).To(MatchError(ContainSubstring("the Dataset is not Ready (SecretNotFound: Secret creds does not exist)")))
}

func TestABackupWhereNoneIsConfiguredSaysWhatToSet(t *testing.T) {
	g := NewWithT(t)
	c, _ := fakeCLI(t, interceptor.Funcs{})
	c.StrataNamespace = "strata-system"
	err := c.Backup(context.Background())
	g.Expect(err).To(MatchError(ContainSubstring("the master is not backed up: there is no ConfigMap strata-system/strata-master-backups; install Strata with master.backup.uri and master.backup.secretName set")))
}

func TestABackupTheOperatorDoesNotTakeSaysItsLastFailure(t *testing.T) {
	g := NewWithT(t)
	c, _ := fakeCLI(t, interceptor.Funcs{}, &corev1.ConfigMap{
		ObjectMeta: metav1.ObjectMeta{Name: datav1alpha1.MasterBackupsConfigMap, Namespace: "strata-system"},
		Data: map[string]string{
			datav1alpha1.BackupKeyFailure:     "restore: there is no backup under s3://b/p",
			datav1alpha1.BackupKeyFailureTime: "2026-11-30T02:00:00Z",
		},
	})
	c.StrataNamespace, c.Wait = "strata-system", 100*time.Millisecond // nothing answers here
	err := c.Backup(context.Background())
	g.Expect(err).To(MatchError(errNoAnswer))
	g.Expect(err).To(MatchError(ContainSubstring("the operator's last failure (2026-11-30T02:00:00Z): restore: there is no backup under s3://b/p")))
}

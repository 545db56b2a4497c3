package charttest

import (
	"bytes"
	"fmt"
	"os"
	"os/exec"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	rbacv1 "k8s.io/api/rbac/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"sigs.k8s.io/yaml"

	"github.com/strata-cache/strata/internal/testenv"
)

// TestTheChartGrantsTheOperatorWhatItsMarkersSay compares the operator's ClusterRole and Role in
// the chart, kept by hand, with what controller-gen makes of the +kubebuilder:rbac markers next
// to the code that needs each permission: a rule in one and not the other fails, naming it.
func TestTheChartGrantsTheOperatorWhatItsMarkersSay(t *testing.T) {
	g := NewWithT(t)
	gen := os.Getenv("CONTROLLER_GEN")
	if gen == "" {
		testenv.Lacking(t, "no controller-gen: run `make test`, which builds it and sets CONTROLLER_GEN")
	}
	var out, stderr bytes.Buffer
	cmd := exec.Command(gen, "rbac:roleName=strata-operator", "paths=./controllers/...", "paths=./cmd/operator/...", "output:stdout")
	cmd.Dir = "../.."
	cmd.Stdout, cmd.Stderr = &out, &stderr
	g.Expect(cmd.Run()).To(Succeed(), "controller-gen: %s", stderr.String())
	generated := decode(t, &out)

	// The markers name the release namespace as the chart's default, strata-system, and the
	// operator's Deployment as a release named strata calls it.
	chart, failed := render(t)
	g.Expect(failed).To(BeEmpty())

	for _, kind := range []string{"ClusterRole", "Role"} {
		want := rules(t, ofKind(generated, kind), "")
		got := rules(t, ofKind(chart, kind), "strata-operator")
		g.Expect(want).NotTo(BeEmpty())
		g.Expect(got).To(Equal(want), "the chart's operator %s against the markers (group resource verb [names]): only in the chart %v, only in the markers %v",
			kind, difference(got, want), difference(want, got))
	}
}

func decode(t *testing.T, b *bytes.Buffer) []unstructured.Unstructured {
	t.Helper()
	var objs []unstructured.Unstructured
	for _, doc := range strings.Split(b.String(), "\n---\n") {
		if strings.TrimSpace(strings.TrimPrefix(doc, "---")) == "" {
			continue
		}
		o := map[string]any{}
		if err := yaml.Unmarshal([]byte(doc), &o); err != nil {
			t.Fatalf("reading controller-gen's output: %v", err)
		}
		objs = append(objs, unstructured.Unstructured{Object: o})
	}
	return objs
}

// rules are the grants of the objects named name ("" for any), one string per group, resource,
// verb and resource names.
func rules(t *testing.T, objs []unstructured.Unstructured, name string) map[string]bool {
	t.Helper()
	out := map[string]bool{}
	for _, o := range objs {
		if name != "" && o.GetName() != name {
			continue
		}
		var role rbacv1.ClusterRole // a Role's rules have the same shape
		if err := runtime.DefaultUnstructuredConverter.FromUnstructured(o.Object, &role); err != nil {
			t.Fatalf("reading %s %s: %v", o.GetKind(), o.GetName(), err)
		}
		for _, r := range role.Rules {
			for _, group := range r.APIGroups {
				for _, res := range r.Resources {
					for _, verb := range r.Verbs {
						out[fmt.Sprintf("%s %s %s %v", group, res, verb, r.ResourceNames)] = true
					}
				}
			}
		}
	}
	return out
}

func difference(a, b map[string]bool) []string {
	var out []string
	for k := range a {
		if !b[k] {
			out = append(out, k)
		}
	}
	return out
}

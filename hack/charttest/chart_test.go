// Package charttest renders charts/strata with the project's Helm (make test passes it in $HELM)
// and checks what the values turn on and off.
package charttest

import (
	"bytes"
	"errors"
	"io"
	"os"
	"os/exec"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	utilyaml "k8s.io/apimachinery/pkg/util/yaml"
	"sigs.k8s.io/yaml"

	"github.com/strata-cache/strata/internal/testenv"
)

// render runs helm template over the chart with the --set flags given, and returns its objects,
// or Helm's error output.
func render(t *testing.T, set ...string) ([]unstructured.Unstructured, string) {
	t.Helper()
	helm := os.Getenv("HELM")
	if helm == "" {
		testenv.Lacking(t, "no Helm: run `make test`, which builds bin/helm and sets HELM")
	}
	args := []string{"template", "strata", "../../charts/strata", "--namespace", "strata-system"}
	for _, s := range set {
		args = append(args, "--set", s)
	}
	var out, stderr bytes.Buffer
	cmd := exec.Command(helm, args...)
	cmd.Stdout, cmd.Stderr = &out, &stderr
	if err := cmd.Run(); err != nil {
		return nil, stderr.String()
	}
	var objs []unstructured.Unstructured
	dec := utilyaml.NewYAMLOrJSONDecoder(&out, 4096)
	for {
		var o map[string]any
		if err := dec.Decode(&o); errors.Is(err, io.EOF) {
			break
		} else if err != nil {
			t.Fatalf("reading helm's output: %v", err)
		}
		if o != nil {
			objs = append(objs, unstructured.Unstructured{Object: o})
		}
	}
	return objs, ""
}

func ofKind(objs []unstructured.Unstructured, kind string) []unstructured.Unstructured {
	var out []unstructured.Unstructured
	for _, o := range objs {
		if o.GetKind() == kind {
			out = append(out, o)
		}
	}
	return out
}

func TestMonitorsAreOffByDefault(t *testing.T) {
	g := NewWithT(t)
	objs, failed := render(t)
	g.Expect(failed).To(BeEmpty())
	g.Expect(ofKind(objs, "ServiceMonitor")).To(BeEmpty(), "the Prometheus Operator's CRDs may not be installed")
	g.Expect(ofKind(objs, "PodMonitor")).To(BeEmpty())
}

func TestMonitorsScrapeEveryComponent(t *testing.T) {
	g := NewWithT(t)
	objs, failed := render(t, "metrics.monitors.enabled=true", "metrics.monitors.labels.release=prometheus")
	g.Expect(failed).To(BeEmpty())

	monitors := ofKind(objs, "ServiceMonitor")
	g.Expect(monitors).To(HaveLen(1))
	sm := monitors[0]
	g.Expect(sm.GetLabels()).To(HaveKeyWithValue("release", "prometheus"), "Prometheus finds it by its selector's labels")
	selector, _, _ := unstructured.NestedStringMap(sm.Object, "spec", "selector", "matchLabels")
	var scraped []unstructured.Unstructured
	for _, svc := range ofKind(objs, "Service") {
		if matches(svc.GetLabels(), selector) {
			scraped = append(scraped, svc)
		}
	}
	g.Expect(scraped).To(HaveLen(1), "the ServiceMonitor selects the operator's metrics Service, and only it")
	ports, _, _ := unstructured.NestedSlice(scraped[0].Object, "spec", "ports")
	g.Expect(ports).To(ContainElement(HaveKeyWithValue("name", "metrics")), "the port the ServiceMonitor names")

	pods := ofKind(objs, "PodMonitor")
	g.Expect(pods).To(HaveLen(1))
	exprs, _, _ := unstructured.NestedSlice(pods[0].Object, "spec", "selector", "matchExpressions")
	g.Expect(exprs).To(ContainElement(And(
		HaveKeyWithValue("key", "app.kubernetes.io/component"),
		HaveKeyWithValue("values", ConsistOf("master", "worker", "csi-node")))))
	// The CSI node plugin's pods are the chart's own: they must carry what the PodMonitor selects.
	for _, ds := range ofKind(objs, "DaemonSet") {
		labels, _, _ := unstructured.NestedStringMap(ds.Object, "spec", "template", "metadata", "labels")
		g.Expect(labels).To(And(HaveKeyWithValue("app.kubernetes.io/component", "csi-node"), HaveKeyWithValue("app.kubernetes.io/part-of", "strata")))
		containers, _, _ := unstructured.NestedSlice(ds.Object, "spec", "template", "spec", "containers")
		g.Expect(containers).To(ContainElement(HaveKeyWithValue("ports", ContainElement(HaveKeyWithValue("name", "metrics")))))
	}
}

func TestMonitorsNeedTheMetricsService(t *testing.T) {
	g := NewWithT(t)
	_, failed := render(t, "metrics.monitors.enabled=true", "metrics.service.enabled=false")
	g.Expect(failed).To(ContainSubstring("metrics.monitors.enabled needs metrics.service.enabled"))
	_, failed = render(t, "metrics.monitors.interval=often")
	g.Expect(failed).To(ContainSubstring("interval"), "the values schema refuses what Prometheus would")
}

func matches(labels, selector map[string]string) bool {
	if len(selector) == 0 {
		return false
	}
	for k, v := range selector {
		if labels[k] != v {
			return false
		}
	}
	return true
}

func TestUsersOfANamespaceGetStrataWithTheRolesTheyHold(t *testing.T) {
	g := NewWithT(t)
	objs, failed := render(t)
	g.Expect(failed).To(BeEmpty())
	aggregated := map[string][]string{}
	for _, role := range ofKind(objs, "ClusterRole") {
		for label, value := range role.GetLabels() {
			if value == "true" && strings.HasPrefix(label, "rbac.authorization.k8s.io/aggregate-to-") {
				aggregated[strings.TrimPrefix(label, "rbac.authorization.k8s.io/aggregate-to-")] = append(
					aggregated[strings.TrimPrefix(label, "rbac.authorization.k8s.io/aggregate-to-")], role.GetName())
			}
		}
	}
	g.Expect(aggregated).To(HaveKeyWithValue("edit", ConsistOf("strata-edit")))
	g.Expect(aggregated).To(HaveKeyWithValue("admin", ConsistOf("strata-edit")))
	g.Expect(aggregated).To(HaveKeyWithValue("view", ConsistOf("strata-view")))
	for _, role := range ofKind(objs, "ClusterRole") {
		if role.GetName() != "strata-edit" {
			continue
		}
		rules, _, _ := unstructured.NestedSlice(role.Object, "rules")
		// `kubectl strata` asks the operator with an annotation: patch on Datasets.
		g.Expect(rules).To(ContainElement(And(
			HaveKeyWithValue("resources", ContainElement("datasets")), HaveKeyWithValue("verbs", ContainElement("patch")))))
		// Nothing cluster-scoped: aggregated into admin and edit, it would reach every namespace's
		// users.
		g.Expect(rules).NotTo(ContainElement(HaveKeyWithValue("resources", ContainElement("tierpools"))))
	}

	objs, failed = render(t, "userRoles.aggregate=false")
	g.Expect(failed).To(BeEmpty())
	for _, role := range ofKind(objs, "ClusterRole") {
		g.Expect(role.GetName()).NotTo(HaveSuffix("-edit"))
	}
}

// TestUninstallLetsTheLineagesPodsGo: before Helm removes the operator, a hook Job, run as the
// operator, takes the attempt finalizer off the Lineages' pods (nothing would, afterwards).
func TestUninstallLetsTheLineagesPodsGo(t *testing.T) {
	g := NewWithT(t)
	objs, failed := render(t, "serviceAccount.name=strata-sa", "image.tag=1.2.3")
	g.Expect(failed).To(BeEmpty())
	var hooks []unstructured.Unstructured
	for _, job := range ofKind(objs, "Job") {
		if job.GetAnnotations()["helm.sh/hook"] == "pre-delete" {
			hooks = append(hooks, job)
		}
	}
	g.Expect(hooks).To(HaveLen(1))
	spec, _, _ := unstructured.NestedMap(hooks[0].Object, "spec", "template", "spec")
	g.Expect(spec).To(HaveKeyWithValue("serviceAccountName", "strata-sa"))
	containers, _, _ := unstructured.NestedSlice(spec, "containers")
	g.Expect(containers).To(HaveExactElements(And(
		HaveKeyWithValue("args", ContainElement("--release-attempts-and-exit")),
		HaveKeyWithValue("image", HaveSuffix(":1.2.3")))))
	g.Expect(hooks[0].GetAnnotations()).To(HaveKeyWithValue("helm.sh/hook-delete-policy", ContainSubstring("hook-succeeded")))
}

// TestImageTagTagsEveryComponent: image.tag (what `make deploy` sets to the tree it built)
// tags the operator, the master, the workers and the CSI driver alike, unless a component names
// its own tag; with none, the chart's appVersion.
func TestImageTagTagsEveryComponent(t *testing.T) {
	// images are the operator's and the CSI driver's images, and the master's and the workers'
	// as the operator is told them.
	images := func(g *WithT, set ...string) map[string]string {
		objs, failed := render(t, set...)
		g.Expect(failed).To(BeEmpty())
		out := map[string]string{}
		for _, d := range append(ofKind(objs, "Deployment"), ofKind(objs, "DaemonSet")...) {
			containers, _, _ := unstructured.NestedSlice(d.Object, "spec", "template", "spec", "containers")
			for _, c := range containers {
				c := c.(map[string]any)
				out[d.GetName()+"/"+c["name"].(string)] = c["image"].(string)
				args, _ := c["args"].([]any)
				for _, a := range args {
					for _, flag := range []string{"--master-image=", "--worker-image="} {
						if s := a.(string); strings.HasPrefix(s, flag) {
							out[flag] = strings.TrimPrefix(s, flag)
						}
					}
				}
			}
		}
		return out
	}
	tags := func(images map[string]string) map[string]string {
		out := map[string]string{}
		for k, image := range images {
			out[k] = image[strings.LastIndex(image, ":")+1:]
		}
		return out
	}
	for _, tc := range []struct {
		name string
		set  []string
		want func(what string) string
	}{
		{"none", nil, func(string) string { return appVersion(t) }},
		{"image.tag", []string{"image.tag=1.2.3"}, func(string) string { return "1.2.3" }},
		{"image.tag and the master's own", []string{"image.tag=1.2.3", "master.image.tag=4.5.6"}, func(what string) string {
			if what == "--master-image=" {
				return "4.5.6"
			}
			return "1.2.3"
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := NewWithT(t)
			got := tags(images(g, tc.set...))
			g.Expect(got).To(HaveKey("--master-image="))
			g.Expect(got).To(HaveKey("--worker-image="))
			g.Expect(len(got)).To(BeNumerically(">=", 4), "the operator, the CSI driver, the master and the workers: %v", got)
			for what, tag := range got {
				g.Expect(tag).To(Equal(tc.want(what)), "the tag of %s", what)
			}
		})
	}
}

// appVersion is the chart's appVersion.
func appVersion(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile("../../charts/strata/Chart.yaml")
	if err != nil {
		t.Fatal(err)
	}
	var chart struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(raw, &chart); err != nil || chart.AppVersion == "" {
		t.Fatalf("reading the chart's appVersion: %v", err)
	}
	return chart.AppVersion
}

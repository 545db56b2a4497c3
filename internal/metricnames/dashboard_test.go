package metricnames

import (
	"context"
	"encoding/json"
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/cacheworker/checkpoint"
	"github.com/strata-cache/strata/cacheworker/dataplane"
	"github.com/strata-cache/strata/cacheworker/fusefs"
	"github.com/strata-cache/strata/cacheworker/membership"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/controllers"
	"github.com/strata-cache/strata/controllers/scheduling"
	"github.com/strata-cache/strata/csi/driver"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
	"github.com/strata-cache/strata/master/server"
	"github.com/strata-cache/strata/master/store"
)

// fqName finds a metric's name in a descriptor's text, the one place Desc shows it.
var fqName = regexp.MustCompile(`fqName: "([^"]+)"`)

// recorder is a Registerer that keeps what is registered with it, so that each collector can
// be asked for its descriptors (a registry only gathers metrics that have values).
type recorder struct{ collectors []prometheus.Collector }

func (r *recorder) Register(c prometheus.Collector) error {
	r.collectors = append(r.collectors, c)
	return nil
}

func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	r.collectors = append(r.collectors, cs...)
}

func (r *recorder) Unregister(prometheus.Collector) bool { return false }

// controllerRuntime are metrics the operator's controller-runtime registers itself.
var controllerRuntime = []string{"controller_runtime_reconcile_errors_total", "controller_runtime_reconcile_total", "workqueue_depth"}

// registered returns the names of every metric the components register, built as the binaries
// build them.
func registered(t *testing.T) []string {
	t.Helper()
	g := NewWithT(t)
	reg := &recorder{}
	ts, err := tierstore.Open(context.Background(), tierstore.Config{
		Tiers:    []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(t.TempDir(), "mem")}, Quota: 1 << 20}},
		IndexDir: filepath.Join(t.TempDir(), "index"),
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = ts.Close() })
	_, err = cache.NewMetrics(reg, ts)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = dataplane.NewMetrics(reg)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = fusefs.NewMetrics(reg)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = membership.New(membership.Config{ID: "p/n", Address: "a:1", Interval: time.Second, Log: logr.Discard()}, noMaster{}, ts, reg)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = server.NewMetrics(reg)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = driver.NewMetrics(reg)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = scheduling.NewHinter(nil, nil, reg)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = checkpoint.NewMetrics(reg)
	g.Expect(err).NotTo(HaveOccurred())
	_, err = controllers.NewLineageDepthGauge(reg)
	g.Expect(err).NotTo(HaveOccurred())
	reg.MustRegister(store.NewCollector(mastertest.New(t, 1, mastertest.Options{}).Nodes[0].Store))

	names := slices.Clone(controllerRuntime)
	for _, c := range reg.collectors {
		ch := make(chan *prometheus.Desc, 1024)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			if m := fqName.FindStringSubmatch(d.String()); m != nil {
				names = append(names, m[1])
			}
		}
	}
	return names
}

// noMaster is never called: membership only needs one to be built.
type noMaster struct{}

func (noMaster) RegisterWorker(context.Context, *masterpb.RegisterWorkerRequest) (*masterpb.Worker, error) {
	return nil, os.ErrInvalid
}

func (noMaster) Heartbeat(context.Context, *masterpb.HeartbeatRequest) (*masterpb.HeartbeatResponse, error) {
	return nil, os.ErrInvalid
}

func TestTheDashboardQueriesOnlyRegisteredMetrics(t *testing.T) {
	g := NewWithT(t)
	raw, err := os.ReadFile("../../charts/strata/dashboards/strata.json")
	g.Expect(err).NotTo(HaveOccurred())
	var dash struct {
		Panels []struct {
			Title   string `json:"title"`
			Targets []struct {
				Expr string `json:"expr"`
			} `json:"targets"`
		} `json:"panels"`
	}
	g.Expect(json.Unmarshal(raw, &dash)).To(Succeed(), "the dashboard is valid JSON")
	names := registered(t)
	metric := regexp.MustCompile(`\b(strata_[a-z0-9_]+|controller_runtime_[a-z0-9_]+|workqueue_[a-z0-9_]+)\b`)
	queries := 0
	for _, p := range dash.Panels {
		for _, target := range p.Targets {
			queries++
			for _, m := range metric.FindAllString(target.Expr, -1) {
				base := strings.TrimSuffix(strings.TrimSuffix(strings.TrimSuffix(m, "_bucket"), "_sum"), "_count")
				g.Expect(slices.Contains(names, base)).To(BeTrue(), "panel %q queries %s, which no component registers", p.Title, m)
			}
		}
	}
	g.Expect(queries).To(BeNumerically(">", 10), "the dashboard has its queries")
}

package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/eviction"
	"github.com/strata-cache/strata/cacheworker/tierstore"
)

func TestResolve(t *testing.T) {
	const twoTiers = `
- name: mem
  medium: MEM
  paths: [/mnt/strata/mem]
  quota: 4Gi
- name: nvme
  medium: NVME
  paths: [/mnt/nvme0, /mnt/nvme1]
  quota: 100Gi
  watermarks: {high: 0.95, low: 0.8}
`
	cases := map[string]struct {
		tiers   string
		change  func(o *options)
		want    tierstore.Config
		wantErr string
	}{
		"a TierPool's tiers become the store's tiers": {
			tiers: twoTiers,
			want: tierstore.Config{
				Tiers: []tierstore.Tier{
					{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{"/mnt/strata/mem"}, Quota: 4 << 30},
					{Name: "nvme", Medium: datav1alpha1.MediumNVMe, Dirs: []string{"/mnt/nvme0", "/mnt/nvme1"}, Quota: 100 << 30, High: 0.95, Low: 0.8},
				},
				IndexDir: "/idx", Eviction: eviction.Config{Kind: eviction.LRU}, PromotionThreshold: 3,
			},
		},
		"LRFU takes its lambda": {
			tiers:  twoTiers,
			change: func(o *options) { o.eviction, o.lambda = "LRFU", 0.25 },
			want: tierstore.Config{
				Tiers: []tierstore.Tier{
					{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{"/mnt/strata/mem"}, Quota: 4 << 30},
					{Name: "nvme", Medium: datav1alpha1.MediumNVMe, Dirs: []string{"/mnt/nvme0", "/mnt/nvme1"}, Quota: 100 << 30, High: 0.95, Low: 0.8},
				},
				IndexDir: "/idx", Eviction: eviction.Config{Kind: eviction.LRFU, Lambda: 0.25}, PromotionThreshold: 3,
			},
		},
		"an unknown eviction policy is refused": {tiers: twoTiers, change: func(o *options) { o.eviction = "FIFO" }, wantErr: `unknown eviction policy "FIFO"`},
		"an empty tiers file is refused":        {tiers: "[]", wantErr: "lists no tiers"},
		"an unknown field is refused":           {tiers: "- name: mem\n  size: 4Gi\n", wantErr: `unknown field "size"`},
		"a missing tiers file is refused":       {change: func(o *options) { o.tiersFile = "/nonexistent/tiers.yaml" }, wantErr: "reading the tiers file"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			o := options{indexDir: "/idx", eviction: "LRU", lambda: 0.5, promotionThreshold: 3}
			o.tiersFile = filepath.Join(t.TempDir(), "tiers.yaml")
			g.Expect(os.WriteFile(o.tiersFile, []byte(tc.tiers), 0o600)).To(Succeed())
			if tc.change != nil {
				tc.change(&o)
			}
			cfg, err := o.resolve()
			if tc.wantErr != "" {
				g.Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
				return
			}
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(cfg).To(Equal(tc.want))
		})
	}
}

func TestRunServesMetricsAndStopsCleanly(t *testing.T) {
	g := NewWithT(t)
	dir := t.TempDir()
	tiers := "- name: mem\n  medium: MEM\n  paths: [" + filepath.Join(dir, "mem") + "]\n  quota: 64Mi\n"
	o := options{indexDir: filepath.Join(dir, "index"), eviction: "LRU", promotionThreshold: 3, shutdownTimeout: 5 * time.Second,
		tiersFile: filepath.Join(dir, "tiers.yaml")}
	g.Expect(os.WriteFile(o.tiersFile, []byte(tiers), 0o600)).To(Succeed())
	l, err := net.Listen("tcp", "127.0.0.1:0")
	g.Expect(err).NotTo(HaveOccurred())
	o.metricsAddr = l.Addr().String()
	g.Expect(l.Close()).To(Succeed())

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- run(ctx, o, logr.Discard()) }()

	g.Eventually(func() (string, error) {
		resp, err := http.Get("http://" + o.metricsAddr + "/metrics")
		if err != nil {
			return "", err
		}
		defer func() { _ = resp.Body.Close() }()
		b, err := io.ReadAll(resp.Body)
		return string(b), err
	}).WithTimeout(10*time.Second).Should(ContainSubstring(`strata_worker_tier_quota_bytes{medium="MEM",tier="mem"} 6.7108864e+07`),
		"the worker serves its tiers' metrics")
	cancel()
	g.Expect(<-done).To(Succeed())
}

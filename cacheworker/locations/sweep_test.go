package locations_test

import (
	"context"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"google.golang.org/protobuf/proto"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// TestSweeperRemovesOnlyOrphanedOutputs sweeps a store holding blocks of a live and of a
// deleted Dataset: only old unclean blocks go, those of the deleted Dataset and of a file
// version that was written again since.
func TestSweeperRemovesOnlyOrphanedOutputs(t *testing.T) {
	g := NewWithT(t)
	ctx := context.Background()
	master := mastertest.New(t, 1, mastertest.Options{GRPC: true}).Client()
	for _, name := range []string{"ns/live/1", "ns/gone/2"} {
		_, err := master.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: name, Root: "/datasets/" + name})
		g.Expect(err).NotTo(HaveOccurred())
	}
	_, err := master.DeleteDataset(ctx, "ns/gone/2")
	g.Expect(err).NotTo(HaveOccurred())

	tmp := t.TempDir()
	store, err := tierstore.Open(ctx, tierstore.Config{
		Tiers:    []tierstore.Tier{{Name: "mem", Medium: datav1alpha1.MediumMemory, Dirs: []string{filepath.Join(tmp, "mem")}, Quota: 1 << 20}},
		IndexDir: filepath.Join(tmp, "index"),
	})
	g.Expect(err).NotTo(HaveOccurred())
	t.Cleanup(func() { _ = store.Close() })
	put := func(id, dataset string, clean bool, token string) {
		origin, err := proto.Marshal(&workerpb.BlockOrigin{Dataset: dataset, Path: "/datasets/" + dataset + "/f", FileToken: token})
		g.Expect(err).NotTo(HaveOccurred())
		_, err = store.Put(ctx, id, strings.NewReader("block"), 5, tierstore.PutOptions{Clean: clean, Origin: origin})
		g.Expect(err).NotTo(HaveOccurred())
	}
	// ns/live/1's file f is at version "v2": a block of version "v1" is an orphan, and so is a
	// block of the deleted ns/gone/2. A block with no version whose file is absent waits for its report.
	_, err = master.CreateFile(ctx, &masterpb.CreateFileRequest{Path: "/datasets/ns/live/1/f", Dataset: "ns/live/1", ClientToken: "v2"})
	g.Expect(err).NotTo(HaveOccurred())
	put("live-0", "ns/live/1", false, "v2")
	put("old-version-0", "ns/live/1", false, "v1")
	put("unreported-0", "ns/live/1", false, "")
	put("gone-0", "ns/gone/2", false, "")
	put("gone-clean-0", "ns/gone/2", true, "")

	sweeper := &locations.Sweeper{Master: master, Store: store, Grace: time.Hour, Log: logr.Discard()}
	removed, err := sweeper.Sweep(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(removed).To(BeZero(), "blocks younger than the grace are never swept")

	sweeper.Now = func() time.Time { return time.Now().Add(2 * time.Hour) }
	removed, err = sweeper.Sweep(ctx)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(removed).To(Equal(2))
	var ids []string
	for _, b := range store.Blocks() {
		ids = append(ids, b.ID)
	}
	g.Expect(ids).To(ConsistOf("live-0", "unreported-0", "gone-clean-0"),
		"the unclean block of the deleted Dataset and the earlier version went; eviction takes the clean one")
}

// Package policy carries the CachePolicies of a pool's Datasets to its workers and applies
// them. The operator writes one file per TierPool (File, in the workers' ConfigMap, outside the
// hash that rolls their pods), the kubelet updates it in every worker pod, and each worker
// watches it (Watch) and applies a change live: new blocks of a pinned path are stored pinned,
// and the blocks already held are pinned or unpinned (Repin).
//
// What applies per Dataset: a CachePolicy's pinnedPaths (glob patterns of a Dataset's files
// whose blocks are never evicted), its eviction policy (how the Dataset's blocks rank against
// each other when its tier needs room; MRD also which Dataset gives up blocks, by its next use
// in the lineage graph, which the operator writes with it), its watermarks (the Dataset's share
// of every tier) and its promotion threshold (see tierstore.DatasetRules); and, for an output,
// its replication (how many copies, within which node label's scope; package replication), with
// the values of the scope labels of every node (File.Topology).
package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/go-logr/logr"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/eviction"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/internal/periodic"
	"github.com/strata-cache/strata/lineage/kariz"
)

// FileName is the key of the policies file in the workers' ConfigMap.
const FileName = "policies.json"

// File is the policies file: the policy of every Dataset of the pool that has one.
type File struct {
	Datasets []Dataset `json:"datasets"`
	// Topology maps the name of each node of the cluster to the values of the labels that
	// bound replicas (Replication.ScopeLabel) that it has: where replicas may go.
	Topology map[string]map[string]string `json:"topology,omitempty"`
}

// Replication is how many copies of the blocks of an output not checkpointed yet the workers
// keep, and on which nodes (see cacheworker/replication).
type Replication struct {
	// Count is the number of copies, the original included; at least 2 here.
	Count int `json:"count"`
	// ScopeLabel, when set, is the node label whose value every copy's node shares with the
	// writer's (a rack, a zone); empty means any node.
	ScopeLabel string `json:"scopeLabel,omitempty"`
	// Selective: copies that readers on other nodes keep count as replicas.
	Selective bool `json:"selective,omitempty"`
	// BandwidthBytes caps the bytes per second a worker sends to make replicas; 0: no cap.
	BandwidthBytes int64 `json:"bandwidthBytes,omitempty"`
}

// Dataset is the policy of one Dataset.
type Dataset struct {
	// Name is the Dataset's name at the master, <namespace>/<name>/<uid>, as blocks carry it.
	Name string `json:"name"`
	// CachePolicy names the policy it came from, <namespace>/<name>, for messages.
	CachePolicy string `json:"cachePolicy,omitempty"`
	// PinnedPaths are glob patterns of the Dataset's files (relative to its root) whose
	// blocks are never evicted.
	PinnedPaths []string `json:"pinnedPaths,omitempty"`
	// Eviction ranks the Dataset's blocks against each other: LRU, LFU or LRFU, whose Lambda
	// weighs recency against frequency. Empty means the worker's own policy.
	Eviction string   `json:"eviction,omitempty"`
	Lambda   *float64 `json:"lambda,omitempty"`
	// Watermarks, when set, bound the Dataset's share of every tier, as fractions of its quota.
	Watermarks *Watermarks `json:"watermarks,omitempty"`
	// PromotionThreshold is how many reads one of its blocks in a lower tier needs to move up;
	// 0 means the worker's own.
	PromotionThreshold int `json:"promotionThreshold,omitempty"`
	// NextUse, for Eviction MRD, is how many pipeline stages away the Dataset's next read by a
	// Lineage's Job is (0: a Job that reads it runs, or may run, now); none means no Lineage
	// will read it again (tierstore.NoNextUse).
	NextUse *int `json:"nextUse,omitempty"`
	// Prefetch, when set, is what a prefetch of the Lineages' plan loaded of the Dataset, which
	// stays pinned until the stage that reads it ends (the operator then leaves it out).
	Prefetch *Prefetch `json:"prefetch,omitempty"`
	// Replication, when set, replicates the Dataset's blocks that are not checkpointed yet.
	Replication *Replication `json:"replication,omitempty"`
}

// Watermarks are a share of a tier: above High, the Dataset's coldest blocks leave the tier
// until it is back at Low.
type Watermarks struct {
	High float64 `json:"high"`
	Low  float64 `json:"low"`
}

// rules are d's tier-store rules, and whether it has any.
func (d Dataset) rules() (tierstore.DatasetRules, bool) {
	r := tierstore.DatasetRules{Eviction: eviction.Config{Kind: eviction.Kind(d.Eviction)}, PromotionThreshold: d.PromotionThreshold}
	if d.Lambda != nil {
		r.Eviction.Lambda = *d.Lambda
	}
	if d.Watermarks != nil {
		r.High, r.Low = d.Watermarks.High, d.Watermarks.Low
	}
	if r.Eviction.Kind == eviction.MRD {
		r.NextUse = tierstore.NoNextUse
		if d.NextUse != nil {
			r.NextUse = *d.NextUse
		}
	}
	return r, r != tierstore.DatasetRules{}
}

// Prefetch is a share of the files of a Dataset: the blocks of each file matching Paths (all,
// if none) that a load of Percent of each file reads (kariz.Share, as cacheworker/warmup does).
type Prefetch struct {
	Paths   []string `json:"paths,omitempty"`
	Percent int      `json:"percent"`
}

// prefetchPin is a parsed Prefetch.
type prefetchPin struct {
	paths   []Pattern
	percent int
}

// Set is a parsed policies file. The zero Set pins nothing and has no rules.
type Set struct {
	pins        map[string][]Pattern
	rules       map[string]tierstore.DatasetRules
	replication map[string]Replication
	topology    map[string]map[string]string
	prefetches  map[string]prefetchPin
	// shares memoises kariz.Share by [blocks, percent]: every block of a file asks.
	shares sync.Map
}

// Parse reads a policies file. A pattern that does not parse is an error naming it: the
// operator checks patterns before it writes them, so one here is a bug, not a user's typo.
func Parse(raw []byte) (*Set, error) {
	var f File
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &f); err != nil {
			return nil, fmt.Errorf("reading the policies file: %w", err)
		}
	}
	s := &Set{pins: map[string][]Pattern{}, rules: map[string]tierstore.DatasetRules{}, replication: map[string]Replication{},
		topology: f.Topology, prefetches: map[string]prefetchPin{}}
	for _, d := range f.Datasets {
		if pf := d.Prefetch; pf != nil {
			if pf.Percent < 1 || pf.Percent > 100 {
				return nil, fmt.Errorf("Dataset %s: a prefetch of %d%% of each file: the share must be 1 to 100", d.Name, pf.Percent)
			}
			pin := prefetchPin{percent: pf.Percent}
			for _, p := range pf.Paths {
				compiled, err := Compile(p)
				if err != nil {
					return nil, fmt.Errorf("Dataset %s, its prefetch: %w", d.Name, err)
				}
				pin.paths = append(pin.paths, compiled)
			}
			s.prefetches[d.Name] = pin
		}
		if r := d.Replication; r != nil {
			if r.Count < 2 || r.BandwidthBytes < 0 {
				return nil, fmt.Errorf("Dataset %s, CachePolicy %s: replication of %d copies at %d bytes/s: a replication needs at least 2 copies and no negative cap",
					d.Name, d.CachePolicy, r.Count, r.BandwidthBytes)
			}
			s.replication[d.Name] = *r
		}
		for _, p := range d.PinnedPaths {
			compiled, err := Compile(p)
			if err != nil {
				return nil, fmt.Errorf("Dataset %s, CachePolicy %s: %w", d.Name, d.CachePolicy, err)
			}
			s.pins[d.Name] = append(s.pins[d.Name], compiled)
		}
		if r, ok := d.rules(); ok {
			if err := r.Validate(); err != nil {
				return nil, fmt.Errorf("Dataset %s, CachePolicy %s: %w", d.Name, d.CachePolicy, err)
			}
			s.rules[d.Name] = r
		}
	}
	return s, nil
}

// Replication is how the blocks of the Dataset named dataset at the master are replicated, if
// they are.
func (s *Set) Replication(dataset string) (Replication, bool) {
	if s == nil {
		return Replication{}, false
	}
	r, ok := s.replication[dataset]
	return r, ok
}

// NodeLabel is the value of label on node, and whether the node has it.
func (s *Set) NodeLabel(node, label string) (string, bool) {
	if s == nil {
		return "", false
	}
	v, ok := s.topology[node][label]
	return v, ok
}

// Datasets is the number of Datasets the set has a policy for.
func (s *Set) Datasets() int {
	if s == nil {
		return 0
	}
	names := map[string]bool{}
	for name := range s.pins {
		names[name] = true
	}
	for name := range s.rules {
		names[name] = true
	}
	for name := range s.replication {
		names[name] = true
	}
	for name := range s.prefetches {
		names[name] = true
	}
	return len(names)
}

// Rules are the tier-store rules of the Datasets that have any, by name.
func (s *Set) Rules() map[string]tierstore.DatasetRules {
	if s == nil {
		return nil
	}
	return s.rules
}

// DatasetOf names the Dataset of a block from its origin (a workerpb.BlockOrigin), "" for a
// block that is no Dataset's: tierstore.Config.DatasetOf.
func DatasetOf(origin []byte) string {
	var o workerpb.BlockOrigin
	if err := proto.Unmarshal(origin, &o); err != nil {
		return ""
	}
	return o.GetDataset()
}

// Pinned says whether block index of file, a path relative to the root of the Dataset named
// dataset at the master, of blocks blocks (0: not known), is pinned: its path is, or it is in
// the share of the file that a prefetch loaded.
func (s *Set) Pinned(dataset, file string, index, blocks int64) bool {
	if s == nil {
		return false
	}
	for _, p := range s.pins[dataset] {
		if p.Match(file) {
			return true
		}
	}
	pf, ok := s.prefetches[dataset]
	if !ok || len(pf.paths) > 0 && !slices.ContainsFunc(pf.paths, func(p Pattern) bool { return p.Match(file) }) {
		return false
	}
	if pf.percent >= 100 {
		return true
	}
	return blocks > 0 && s.inShare(index, blocks, pf.percent)
}

// inShare says whether block index is in the share percent of a file of blocks blocks.
func (s *Set) inShare(index, blocks int64, percent int) bool {
	key := [2]int64{blocks, int64(percent)}
	share, ok := s.shares.Load(key)
	if !ok {
		share, _ = s.shares.LoadOrStore(key, kariz.Share(int(blocks), percent))
	}
	_, found := slices.BinarySearch(share.([]int), int(index))
	return found
}

// Pattern is a glob of slash-separated segments, each matched as path.Match does, where a
// segment "**" matches any number of segments, none included, except at the end, where it
// matches one or more.
type Pattern []string

// Compile checks a glob pattern of a Dataset's paths: "train/*.parquet", "labels/**",
// "**/index.json". A leading slash is ignored: patterns are relative to the Dataset's root.
func Compile(p string) (Pattern, error) {
	trimmed := strings.Trim(p, "/")
	if trimmed == "" {
		return nil, fmt.Errorf("path pattern %q names no file: use ** for the whole Dataset", p)
	}
	segments := strings.Split(trimmed, "/")
	for _, seg := range segments {
		if seg == "**" {
			continue
		}
		if seg == "" || seg == "." || seg == ".." {
			return nil, fmt.Errorf("path pattern %q has an empty, . or .. segment", p)
		}
		if _, err := path.Match(seg, ""); err != nil {
			return nil, fmt.Errorf("path pattern %q: segment %q is not a valid glob: %w", p, seg, err)
		}
	}
	return Pattern(segments), nil
}

// Match says whether file, a slash-separated path relative to the Dataset's root, matches.
func (p Pattern) Match(file string) bool {
	return matchSegments(p, strings.Split(file, "/"))
}

func matchSegments(pat, name []string) bool {
	for len(pat) > 0 {
		if pat[0] == "**" {
			rest := pat[1:]
			if len(rest) == 0 {
				// A trailing ** is everything below: "labels/**" is not the file "labels".
				return len(name) > 0
			}
			for i := 0; i <= len(name); i++ {
				if matchSegments(rest, name[i:]) {
					return true
				}
			}
			return false
		}
		if len(name) == 0 {
			return false
		}
		if ok, _ := path.Match(pat[0], name[0]); !ok {
			return false
		}
		pat, name = pat[1:], name[1:]
	}
	return len(name) == 0
}

// Watch reads the policies file at p every interval and calls apply with each new content,
// the first included. A file that is missing means no policies; one that does not parse is
// logged and skipped, keeping the last good set. It returns when ctx ends.
func Watch(ctx context.Context, p string, interval time.Duration, log logr.Logger, apply func(*Set)) {
	periodic.WatchFile(ctx, p, interval, log, func(raw []byte) error {
		set, err := Parse(raw)
		if err != nil {
			return err
		}
		apply(set)
		return nil
	})
}

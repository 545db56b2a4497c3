package checkpoint

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strings"
	"time"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/policy"
	"github.com/strata-cache/strata/cacheworker/understore"
)

// File is the checkpoint settings of a pool's output Datasets, as the operator serves them: one
// entry per output that has a checkpoint target (spec.checkpoint), with the credentials read from
// the Secret of its namespace. Because of them it is served to the pool's workers alone.
type File struct {
	Datasets []Dataset `json:"datasets"`
}

// Dataset is how one output Dataset is checkpointed.
type Dataset struct {
	// Name and Root are the Dataset's name and root folder at the master; its blocks carry them.
	Name string `json:"name"`
	Root string `json:"root"`
	// CachePolicy names the policy the settings came from, <namespace>/<name>, or is empty for
	// the built-in defaults. Datasets of one policy share one Edge planner, so that its edge
	// fraction holds over their files together.
	CachePolicy string `json:"cachePolicy,omitempty"`
	// Target is the under-store the files go to, each under its path in the Dataset.
	Target Target `json:"target"`
	// Strategy is Edge, Interval or None (spec.checkpoint.strategy of the CachePolicy).
	Strategy datav1alpha1.CheckpointStrategy `json:"strategy"`
	// EdgeFraction is c, the share of checkpoint time the Edge planner gives the leaves.
	EdgeFraction float64 `json:"edgeFraction,omitempty"`
	// HotReads: a file read more than this many times is hot.
	HotReads int `json:"hotReads,omitempty"`
	// IntervalSeconds is the period of strategy Interval.
	IntervalSeconds float64 `json:"intervalSeconds,omitempty"`
	// BandwidthLimit caps background checkpoint writes, in bytes per second; 0 means none.
	BandwidthLimit int64 `json:"bandwidthLimit,omitempty"`
	// SyncWriteThreshold: a file larger than this is written to the target before its seal
	// returns; 0 means never.
	SyncWriteThreshold int64 `json:"syncWriteThreshold,omitempty"`
	// TemporaryPaths are patterns (policy.Compile) of files never checkpointed in the
	// background; Temporary says so of the whole Dataset. Both are still written before memory
	// full of them would drop them.
	TemporaryPaths []string `json:"temporaryPaths,omitempty"`
	Temporary      bool     `json:"temporary,omitempty"`
	// Consumed says that a Lineage that reads this Dataset has run or runs: its files are no
	// longer the edge of the lineage graph.
	Consumed bool `json:"consumed,omitempty"`
	// CreatedUnix is when the Dataset was created: strategy Interval's ticks count from there.
	CreatedUnix int64 `json:"createdUnix,omitempty"`
}

// Target is an S3 bucket and prefix and how to reach it.
type Target struct {
	URI      string `json:"uri"`
	Endpoint string `json:"endpoint,omitempty"`
	Region   string `json:"region,omitempty"`
	// Credentials are the keys of the Dataset's checkpoint Secret (accessKeyID,
	// secretAccessKey, sessionToken).
	Credentials map[string]string `json:"credentials,omitempty"`
}

// source is the target as understore.Open takes it.
func (t Target) source() understore.Source {
	return understore.Source{URI: t.URI, Endpoint: t.Endpoint, Region: t.Region, Credentials: t.Credentials}
}

// objectURI is where the file rel of the Dataset goes.
func (t Target) objectURI(rel string) string { return strings.TrimSuffix(t.URI, "/") + "/" + rel }

// dataset is a Dataset's settings as the checkpointer uses them.
type dataset struct {
	Dataset
	temporary []policy.Pattern
}

// rel is the path of a file of the Dataset, given by its path at the master, relative to the
// Dataset's root: its name under the target.
func (d *dataset) rel(path string) string { return strings.TrimPrefix(path, d.Root+"/") }

// isTemporary says whether the file at path (at the master) is never checkpointed in the background.
func (d *dataset) isTemporary(path string) bool {
	if d.Temporary {
		return true
	}
	rel := d.rel(path)
	for _, p := range d.temporary {
		if p.Match(rel) {
			return true
		}
	}
	return false
}

// interval is the Interval strategy's period.
func (d *dataset) interval() time.Duration {
	return time.Duration(d.IntervalSeconds * float64(time.Second))
}

// due is when a file created at created is checkpointed under strategy Interval: at the first
// tick after it, ticks counted from the Dataset's creation.
func (d *dataset) due(created time.Time) time.Time {
	period := d.interval()
	epoch := time.Unix(d.CreatedUnix, 0)
	if !created.After(epoch) {
		return epoch.Add(period)
	}
	ticks := created.Sub(epoch)/period + 1
	return epoch.Add(ticks * period)
}

// Settings are a parsed settings file, by the Datasets' names at the master. The zero
// Settings checkpoint nothing.
type Settings struct {
	datasets map[string]*dataset
}

// Datasets is the number of Datasets the settings checkpoint.
func (s *Settings) Datasets() int {
	if s == nil {
		return 0
	}
	return len(s.datasets)
}

func (s *Settings) of(name string) *dataset {
	if s == nil {
		return nil
	}
	return s.datasets[name]
}

// Parse reads a checkpoint settings file. A missing or empty file checkpoints nothing.
func Parse(raw []byte) (*Settings, error) {
	var f File
	if len(bytes.TrimSpace(raw)) > 0 {
		if err := json.Unmarshal(raw, &f); err != nil {
			return nil, fmt.Errorf("reading the checkpoint settings: %w", err)
		}
	}
	out := make(map[string]*dataset, len(f.Datasets))
	var errs []error
	for _, d := range f.Datasets {
		ds := &dataset{Dataset: d}
		if err := ds.validate(); err != nil {
			errs = append(errs, fmt.Errorf("Dataset %s: %w", d.Name, err))
			continue
		}
		for _, p := range d.TemporaryPaths {
			compiled, err := policy.Compile(p)
			if err != nil {
				errs = append(errs, fmt.Errorf("Dataset %s, CachePolicy %s, temporaryPathPatterns: %w", d.Name, d.CachePolicy, err))
				continue
			}
			ds.temporary = append(ds.temporary, compiled)
		}
		out[d.Name] = ds
	}
	// The operator checks what it writes, so a bad entry is a bug: refuse the whole file, which
	// keeps the last good settings.
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Settings{datasets: out}, nil
}

func (d *dataset) validate() error {
	switch {
	case d.Name == "" || !strings.HasPrefix(d.Root, "/"):
		return fmt.Errorf("a Dataset needs its name and root at the master, got %q and %q", d.Name, d.Root)
	case !strings.HasPrefix(d.Target.URI, "s3://"):
		return fmt.Errorf("checkpoint target %q is not an s3:// URI", d.Target.URI)
	case d.EdgeFraction < 0 || d.EdgeFraction > 1:
		return fmt.Errorf("edge fraction %g is not in [0, 1]", d.EdgeFraction)
	case d.BandwidthLimit < 0 || d.SyncWriteThreshold < 0 || d.HotReads < 0:
		return errors.New("bandwidth limit, sync write threshold and hot reads may not be negative")
	}
	switch d.Strategy {
	case datav1alpha1.CheckpointEdge, datav1alpha1.CheckpointNone:
	case datav1alpha1.CheckpointInterval:
		if d.IntervalSeconds <= 0 {
			return fmt.Errorf("strategy Interval needs a positive interval, got %g s", d.IntervalSeconds)
		}
	default:
		return fmt.Errorf("unknown strategy %q: want Edge, Interval or None", d.Strategy)
	}
	return nil
}

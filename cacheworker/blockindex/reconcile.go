package blockindex

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"syscall"

	"golang.org/x/sync/errgroup"
)

// TierLayout is where one tier keeps its blocks.
type TierLayout struct {
	// Name of the tier.
	Name string
	// Volatile is true for tiers whose files do not survive a reboot (MEM on tmpfs), where
	// missing files are expected rather than a loss worth reporting loudly.
	Volatile bool
	// Dirs are the tier's directories.
	Dirs []string
}

// Problem is what Reconcile found wrong with a block or a file.
type Problem string

// The problems Reconcile reports.
const (
	// ProblemMissing: the index has an entry whose file is gone.
	ProblemMissing Problem = "missing"
	// ProblemSizeMismatch: the file is shorter or longer than recorded (truncated, or overwritten).
	ProblemSizeMismatch Problem = "size-mismatch"
	// ProblemChecksumMismatch: the file's bytes do not match the recorded checksum.
	ProblemChecksumMismatch Problem = "checksum-mismatch"
	// ProblemUnreadable: reading the file failed.
	ProblemUnreadable Problem = "unreadable"
	// ProblemTornWrite: a temporary file left by a write or move that never finished.
	ProblemTornWrite Problem = "torn-write"
	// ProblemOrphan: a block file that no entry records, such as the target of a move that
	// crashed before its entry was written.
	ProblemOrphan Problem = "orphan"
	// ProblemUnplaced: an entry names a directory that no configured tier has any more. Its file,
	// if any, is left alone: the directory is no longer the worker's to clean.
	ProblemUnplaced Problem = "unplaced"
)

// Finding is one thing Reconcile dropped or removed.
type Finding struct {
	Problem Problem
	// ID of the block, if the file or entry names one.
	ID string
	// Tier that owns the directory, if any.
	Tier string
	// Path of the file.
	Path string
	// Detail says what exactly was wrong, such as the sizes or checksums that differ.
	Detail string
	// Expected marks findings that a restart produces normally: a volatile tier's files gone
	// after a reboot, or a torn write after a crash. Others point at a disk or a bug.
	Expected bool
}

func (f Finding) String() string {
	s := fmt.Sprintf("%s: %s", f.Problem, f.Path)
	if f.Detail != "" {
		s += " (" + f.Detail + ")"
	}
	return s
}

// Report is the outcome of Reconcile.
type Report struct {
	// Kept are the blocks that survived, verified, with Tier set to the tier that owns their directory.
	Kept []Entry
	// Findings are the entries dropped and the files removed, sorted by path.
	Findings []Finding
}

// Count is how many findings have problem p.
func (r Report) Count(p Problem) int {
	n := 0
	for _, f := range r.Findings {
		if f.Problem == p {
			n++
		}
	}
	return n
}

// Reconcile makes the index and the tier directories agree, and returns what survived. It
// verifies every surviving block against its checksum, concurrency files at a time, so a torn
// or corrupt block is removed here and never served. Files whose names are neither block ids
// nor temporary files (lost+found on a mount point, say) and anything that is not a regular
// file are left alone and never served.
//
// It must run before the tier store serves anything, and with nothing else writing the dirs.
func (x *Index) Reconcile(ctx context.Context, layout []TierLayout, concurrency int) (Report, error) {
	var rep Report
	owner := make(map[string]string)           // dir -> tier
	volatile := make(map[string]bool)          // tier -> volatile
	onDisk := make(map[string]map[string]bool) // dir -> file names
	for _, t := range layout {
		volatile[t.Name] = t.Volatile
		for _, d := range t.Dirs {
			d = filepath.Clean(d)
			if other, dup := owner[d]; dup {
				return rep, fmt.Errorf("directory %s belongs to both tier %s and tier %s", d, other, t.Name)
			}
			owner[d] = t.Name
			names, err := blockFiles(d)
			if err != nil {
				return rep, err
			}
			onDisk[d] = names
		}
	}

	entries, err := x.All()
	if err != nil {
		return rep, err
	}
	var (
		drop       []string
		candidates []Entry
		moved      = make(map[string]bool) // ids whose directory now belongs to another tier
	)
	for _, e := range entries {
		dir := filepath.Clean(e.Dir)
		tier, placed := owner[dir]
		switch {
		case ValidateID(e.ID) != nil || !placed:
			rep.Findings = append(rep.Findings, Finding{Problem: ProblemUnplaced, ID: e.ID, Tier: e.Tier, Path: filepath.Join(dir, e.ID),
				Detail: fmt.Sprintf("directory %s is in no configured tier", dir)})
			drop = append(drop, e.ID)
		case !onDisk[dir][e.ID]:
			rep.Findings = append(rep.Findings, Finding{Problem: ProblemMissing, ID: e.ID, Tier: tier, Path: filepath.Join(dir, e.ID),
				Detail: fmt.Sprintf("%d bytes recorded, no file", e.Size), Expected: volatile[tier]})
			drop = append(drop, e.ID)
		default:
			if e.Tier != tier {
				moved[e.ID] = true
				e.Tier = tier
			}
			e.Dir = dir
			candidates = append(candidates, e)
		}
	}

	problems := make([]*Finding, len(candidates))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(max(1, concurrency))
	for i, e := range candidates {
		g.Go(func() error {
			f, err := verify(gctx, e)
			problems[i] = f
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return Report{}, err
	}

	kept := make(map[string]bool) // paths
	var update []Entry
	for i, e := range candidates {
		if f := problems[i]; f != nil {
			f.Tier = e.Tier
			rep.Findings = append(rep.Findings, *f)
			drop = append(drop, e.ID)
			continue
		}
		kept[e.Path()] = true
		rep.Kept = append(rep.Kept, e)
		if moved[e.ID] {
			update = append(update, e)
		}
	}
	// Entries go before files: a crash in between leaves files without entries, which the next
	// start removes, never entries that point at removed files.
	if err := x.DeleteMany(drop); err != nil {
		return Report{}, err
	}
	if err := x.PutMany(update); err != nil {
		return Report{}, err
	}
	if err := x.Sync(); err != nil {
		return Report{}, err
	}

	reported := make(map[string]bool)
	for _, f := range rep.Findings {
		reported[f.Path] = true
	}
	for dir, names := range onDisk {
		for name := range names {
			p := filepath.Join(dir, name)
			if kept[p] {
				continue
			}
			if !reported[p] {
				f := Finding{Problem: ProblemOrphan, ID: name, Tier: owner[dir], Path: p, Detail: "no index entry"}
				if IsTempName(name) {
					f = Finding{Problem: ProblemTornWrite, Tier: owner[dir], Path: p, Detail: "interrupted write", Expected: true}
				}
				rep.Findings = append(rep.Findings, f)
			}
			if err := os.Remove(p); err != nil && !errors.Is(err, os.ErrNotExist) {
				return Report{}, fmt.Errorf("removing unusable block file %s: %w", p, err)
			}
		}
	}
	slices.SortFunc(rep.Findings, func(a, b Finding) int { return strings.Compare(a.Path, b.Path) })
	slices.SortFunc(rep.Kept, func(a, b Entry) int { return strings.Compare(a.ID, b.ID) })
	return rep, nil
}

// blockFiles lists the regular files in dir that are blocks or temporary files.
func blockFiles(dir string) (map[string]bool, error) {
	des, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("listing tier directory %s: %w", dir, err)
	}
	names := make(map[string]bool, len(des))
	for _, de := range des {
		if !de.Type().IsRegular() {
			continue
		}
		if n := de.Name(); IsTempName(n) || ValidateID(n) == nil {
			names[n] = true
		}
	}
	return names, nil
}

// verify reads e's file back and returns a finding if it does not match, or an error only
// when ctx ends.
func verify(ctx context.Context, e Entry) (*Finding, error) {
	p := e.Path()
	bad := func(problem Problem, format string, args ...any) (*Finding, error) {
		return &Finding{Problem: problem, ID: e.ID, Path: p, Detail: fmt.Sprintf(format, args...)}, nil
	}
	// O_NOFOLLOW: a symlink planted under a block's name must not make the worker serve
	// whatever it points at.
	f, err := os.OpenFile(p, os.O_RDONLY|syscall.O_NOFOLLOW, 0)
	if err != nil {
		return bad(ProblemUnreadable, "opening: %v", err)
	}
	defer func() { _ = f.Close() }() // read-only: a failed close loses nothing
	st, err := f.Stat()
	if err != nil {
		return bad(ProblemUnreadable, "stat: %v", err)
	}
	if st.Size() != e.Size {
		return bad(ProblemSizeMismatch, "file has %d bytes, index records %d", st.Size(), e.Size)
	}
	h := NewHash()
	buf := make([]byte, 1<<20)
	for {
		if err := ctx.Err(); err != nil {
			return nil, fmt.Errorf("verifying block %s: %w", e.ID, err)
		}
		n, err := f.Read(buf)
		h.Write(buf[:n])
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return bad(ProblemUnreadable, "reading: %v", err)
		}
	}
	if sum := h.Sum32(); sum != e.Checksum {
		return bad(ProblemChecksumMismatch, "crc32c %08x, index records %08x", sum, e.Checksum)
	}
	return nil, nil
}

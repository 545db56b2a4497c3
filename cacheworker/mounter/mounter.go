package mounter

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"
	"k8s.io/apimachinery/pkg/util/validation"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cacheworker/cache"
	"github.com/strata-cache/strata/cacheworker/callerpod"
	"github.com/strata-cache/strata/cacheworker/fuseconn"
	"github.com/strata-cache/strata/cacheworker/fusefs"
	"github.com/strata-cache/strata/cacheworker/listings"
	"github.com/strata-cache/strata/cacheworker/outputfs"
	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// BlockStore is the node's tier store, as the mounts use it: through the cache, and directly
// for blocks a tier holds.
type BlockStore interface {
	cache.BlockStore
	OpenBlock(ctx context.Context, id string) (*os.File, tierstore.BlockInfo, error)
	Delete(ctx context.Context, id string) error
	Blocks() []tierstore.BlockInfo
	// Adopt stores a file written into an output mount's staging folder as a block.
	Adopt(ctx context.Context, id, path string, size int64, opts tierstore.PutOptions) (tierstore.BlockInfo, error)
	OpenVerified(ctx context.Context, id string) (io.ReadCloser, tierstore.BlockInfo, error)
}

// Outputs is what serving output Datasets (written by pods) takes besides the tier store.
type Outputs struct {
	// Master records the files written; Locations records their blocks and reads blocks
	// other workers hold.
	Master    outputfs.Master
	Locations outputfs.Locations
	// StagingDir holds a folder per mounted output for the files being written: put it on the
	// top tier's file system (tmpfs for MEM), so that writes go to memory.
	StagingDir string
	// Metrics counts what is written; nil counts nowhere.
	Metrics *outputfs.Metrics
	// Checkpoints writes large files through to the under-store and reads lost blocks back
	// from their checkpoints (outputfs.Config.Checkpoints); nil does neither.
	Checkpoints outputfs.Checkpoints
	// KeepsReadCopies says which outputs' blocks read from other nodes are kept, as replicas
	// (outputfs.Config.KeepsReadCopies); nil keeps none.
	KeepsReadCopies func(dataset string) bool
	// Callers says which pod a process writing an output runs in (outputfs.Config.Callers);
	// nil publishes every file at once.
	Callers func(pid uint32) (callerpod.Caller, bool)
}

// Config configures a Mounter.
type Config struct {
	// MountsDir holds a mount point per Dataset, named by its UID. It must be in a host folder
	// with bidirectional mount propagation, so that the CSI node plugin sees the mounts.
	MountsDir string
	// Store is the node's tier store, shared by every Dataset's cache.
	Store BlockStore
	// BlockSize is the TierPool's block size.
	BlockSize int64
	// Fetch tunes the parallel ranged reads of missing blocks; zero means the defaults.
	Fetch understore.ParallelOptions
	// CacheMetrics is shared by the caches of all Datasets; nil keeps their counts unregistered.
	CacheMetrics *cache.Metrics
	// Peers, when set, is asked for a missing block before the under-store.
	Peers cache.PeerReader
	// Stored, when set, is told of every block stored, with its origin in the master's
	// namespace (/datasets/<namespace>/<name>/<uid>/<file>), to report it to the master.
	Stored func(ctx context.Context, info tierstore.BlockInfo)
	// Pinned, when set, says whether block index of a file of blocks blocks (0: not known) of a
	// Dataset (named as at the master) is stored pinned: the Datasets' CachePolicies and
	// prefetches, as the operator sent them.
	Pinned func(dataset, file string, index, blocks int64) bool
	// FileRoots are the folders file:// sources must lie under (the TierPool's fileSourceRoots).
	FileRoots []string
	// ClaimServerTLS is how the claim servers of pvc:// sources are spoken to
	// (understore.ClaimClientTLS of the worker's certificate); nil cannot mount pvc:// sources.
	ClaimServerTLS *tls.Config
	// DisablePassthrough keeps every read going through the worker (see fusefs).
	DisablePassthrough bool
	// Listings, if set, keeps the last good listing of every source mounted, so that a Dataset
	// can be mounted while its source is unreachable; ListingPeers, if set, finds one another
	// node keeps when this node keeps none (see cacheworker/listings).
	Listings     *listings.Store
	ListingPeers listings.Peers
	// Outputs, when set, lets the mounter serve output Datasets; without it, mounting one fails.
	Outputs *Outputs
	// Handovers, when set, holds every mount's FUSE connection for the worker that comes next
	// (see handover.go); without it, a worker restart ends the mounts pods hold.
	Handovers Handovers
	// DrainTimeout is how long UnmountDataset waits for the kernel to end a file system once
	// its folder is unmounted; 0 means DefaultDrainTimeout.
	DrainTimeout time.Duration
	// KeepIdle is how long an input Dataset stays mounted after the last pod of the node that
	// mounted it goes (UnmountDataset), so that the next pod finds its files in the kernel's
	// page cache, which lives as long as the file system does; 0 unmounts at once. Outputs are
	// always unmounted at once, and so is a deleted Dataset (the operator's ForgetDataset).
	KeepIdle time.Duration
	// LoaderUID is the user the load Jobs run as: their reads are loads, which wait for the
	// pods' and are counted apart (fusefs.Loads); 0 takes every reader for a pod.
	LoaderUID uint32
	// Log receives what the mounts do and what goes wrong.
	Log logr.Logger
	// Registerer receives the FUSE metrics; nil keeps them unregistered.
	Registerer prometheus.Registerer
}

// DefaultDrainTimeout is Config.DrainTimeout's default: ending a file system nothing else
// mounts takes milliseconds; longer means a pod's bind mount still holds it.
const DefaultDrainTimeout = 2 * time.Second

// closeTimeout bounds how long Close waits for each file system to end.
const closeTimeout = 5 * time.Second

// Mounter serves Datasets as FUSE file systems under MountsDir: the workerpb.MounterServer.
type Mounter struct {
	workerpb.UnimplementedMounterServer

	cfg Config
	log logr.Logger
	fm  *fusefs.Metrics
	// loads tells loads from pods' reads in every mount.
	loads *fusefs.Loads

	// mu guards the maps and closed. It is never held across I/O; the per-UID locks are.
	mu     sync.Mutex
	mounts map[string]*mount
	locks  map[string]*uidLock
	// draining are file systems whose folder is unmounted but that pods still mount; each has
	// a goroutine (counted in wg) that releases its cache once the kernel ends it.
	draining map[*mount]struct{}
	closed   bool
	wg       sync.WaitGroup
	// rotations counts the sources given rotated credentials while mounted.
	rotations prometheus.Counter
	syncs     *syncMetrics
}

// fileSystem is a mounted Dataset: an input's read-only tree (*fusefs.Server) or an output's
// writable one (*outputfs.Server).
type fileSystem interface {
	Dir() string
	// Done is closed once the kernel ended the file system; Stopped once this process no
	// longer serves it (ended, or suspended for the next worker).
	Done() <-chan struct{}
	Stopped() <-chan struct{}
	// Unmount unmounts the folder; fuseconn.ErrStillMounted if pods' bind mounts remain.
	Unmount(ctx context.Context) error
	Abort() error
	// Suspend stops serving without ending the file system, for the next worker to take over.
	Suspend()
	Files() int
	Bytes() int64
}

// mount is a served Dataset.
type mount struct {
	uid, namespace, name string
	readOnly, output     bool
	path                 string
	fs                   fileSystem
	cache                *cache.Cache
	// store is the source, which a publish with rotated credentials replaces (rotate).
	store    *understore.Replaceable
	released sync.Once
	// req is the request that made the mount, for putting it back in a restarted store. A
	// rotation replaces it (under the UID's lock, which sameMount's reads hold too) while the
	// store's refill or a compacted journal may hand it over (without that lock): handoverMu
	// serialises the replacement with each read and put, so that the store never ends up with an
	// older request than the mount's.
	req        *workerpb.MountDatasetRequest
	handoverMu sync.Mutex
	// held is set once Config.Handovers holds the mount's connection; Mounter.mu guards it.
	held bool
	// idle, set while no pod of the node mounts the Dataset (Config.KeepIdle), unmounts it
	// when it fires; the UID's lock guards it.
	idle *time.Timer
	// deleted: the operator said the Dataset is deleted (forgetDeleted), so the mount is not
	// kept idle when its last pod goes. It is handed over with the mount (handedOver): the
	// store may put the mount back at any time.
	deleted atomic.Bool
}

func (mnt *mount) dataset() string { return mnt.namespace + "/" + mnt.name }

// uidLock serialises the calls for one UID. It is a channel so that a waiter can give up
// when its context ends.
type uidLock struct {
	ch   chan struct{}
	refs int // guarded by Mounter.mu
}

// New returns a Mounter. Call Recover before serving it, and Close when the worker stops.
func New(cfg Config) (*Mounter, error) {
	switch {
	case cfg.MountsDir == "" || !filepath.IsAbs(cfg.MountsDir):
		return nil, fmt.Errorf("the mounts folder must be an absolute path, got %q", cfg.MountsDir)
	case cfg.Store == nil:
		return nil, errors.New("a mounter needs the tier store")
	case cfg.BlockSize <= 0:
		return nil, fmt.Errorf("block size must be positive, got %d", cfg.BlockSize)
	}
	cfg.MountsDir = filepath.Clean(cfg.MountsDir)
	if cfg.DrainTimeout <= 0 {
		cfg.DrainTimeout = DefaultDrainTimeout
	}
	log := cfg.Log
	if log.GetSink() == nil {
		log = logr.Discard()
	}
	if err := os.MkdirAll(cfg.MountsDir, 0o755); err != nil {
		return nil, fmt.Errorf("creating the mounts folder: %w", err)
	}
	m := &Mounter{cfg: cfg, log: log, mounts: map[string]*mount{}, locks: map[string]*uidLock{}, draining: map[*mount]struct{}{},
		rotations: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "strata_worker_credential_rotations_total",
			Help: "Mounted Datasets whose source the worker went on reading with rotated credentials from their Secret, without a remount.",
		}),
		syncs: newSyncMetrics()}
	reg := cfg.Registerer
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	var err error
	if m.loads, err = fusefs.NewLoads(reg, cfg.LoaderUID); err != nil {
		return nil, err
	}
	if cfg.Registerer != nil {
		if m.fm, err = fusefs.NewMetrics(cfg.Registerer); err != nil {
			return nil, err
		}
		for _, c := range append(m.syncs.collectors(), m.rotations) {
			if err := cfg.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("registering the mounter's metrics: %w", err)
			}
		}
	}
	return m, nil
}

var _ workerpb.MounterServer = (*Mounter)(nil)

// uidPattern is a Kubernetes UID, or any token of the same letters: it names a folder, so no
// "/" or "." ever gets into a path.
var uidPattern = regexp.MustCompile(`^[a-zA-Z0-9][a-zA-Z0-9-]{0,127}$`)

func validUID(uid string) error {
	if !uidPattern.MatchString(uid) {
		return status.Errorf(codes.InvalidArgument, "uid %q is not a Dataset UID: want letters, digits and '-', at most 128", uid)
	}
	return nil
}

func validate(req *workerpb.MountDatasetRequest) error {
	if err := validUID(req.GetUid()); err != nil {
		return err
	}
	if errs := validation.IsDNS1123Label(req.GetNamespace()); len(errs) > 0 {
		return status.Errorf(codes.InvalidArgument, "namespace %q: %s", req.GetNamespace(), strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(req.GetName()); len(errs) > 0 {
		return status.Errorf(codes.InvalidArgument, "name %q: %s", req.GetName(), strings.Join(errs, "; "))
	}
	hasSource := req.GetSource().GetUri() != "" || len(req.GetMounts()) > 0
	switch {
	case req.GetOutput() && hasSource:
		return status.Errorf(codes.InvalidArgument, "Dataset %s/%s is an output, written by pods: it has no source", req.GetNamespace(), req.GetName())
	case req.GetOutput():
		return nil
	case !hasSource:
		return status.Errorf(codes.InvalidArgument, "Dataset %s/%s has no source: only Datasets read from an under-store or written as outputs can be mounted", req.GetNamespace(), req.GetName())
	case !req.GetReadOnly():
		return status.Errorf(codes.FailedPrecondition,
			"Dataset %s/%s is an input, read from its source: mount it read-only (only Lineage outputs are writable)", req.GetNamespace(), req.GetName())
	}
	return validSources(req)
}

// lockedMount checks uid, takes its lock and returns its mount (nil if none); the caller
// unlocks.
func (m *Mounter) lockedMount(ctx context.Context, uid string) (*mount, func(), error) {
	if err := validUID(uid); err != nil {
		return nil, nil, err
	}
	unlock, err := m.lock(ctx, uid)
	if err != nil {
		return nil, nil, err
	}
	m.mu.Lock()
	mnt := m.mounts[uid]
	m.mu.Unlock()
	return mnt, unlock, nil
}

// lock takes the lock of uid, waiting for it until ctx ends.
func (m *Mounter) lock(ctx context.Context, uid string) (unlock func(), err error) {
	m.mu.Lock()
	l := m.locks[uid]
	if l == nil {
		l = &uidLock{ch: make(chan struct{}, 1)}
		m.locks[uid] = l
	}
	l.refs++
	m.mu.Unlock()
	release := func() {
		m.mu.Lock()
		defer m.mu.Unlock()
		if l.refs--; l.refs == 0 {
			delete(m.locks, uid)
		}
	}
	select {
	case l.ch <- struct{}{}:
		return func() { <-l.ch; release() }, nil
	case <-ctx.Done():
		release()
		return nil, status.Errorf(codes.Aborted, "another mount or unmount of Dataset %s is under way: %v", uid, ctx.Err())
	}
}

// MountDataset implements workerpb.MounterServer.
func (m *Mounter) MountDataset(ctx context.Context, req *workerpb.MountDatasetRequest) (*workerpb.MountDatasetResponse, error) {
	if err := validate(req); err != nil {
		return nil, err
	}
	if req.GetDatasetDeleted() {
		return nil, status.Error(codes.InvalidArgument, "dataset_deleted is set only by a worker, in the request it hands over to the next worker process")
	}
	uid, dataset := req.GetUid(), req.GetNamespace()+"/"+req.GetName()
	unlock, err := m.lock(ctx, uid)
	if err != nil {
		return nil, err
	}
	defer unlock()

	m.mu.Lock()
	closed, old := m.closed, m.mounts[uid]
	m.mu.Unlock()
	if closed {
		return nil, status.Error(codes.Unavailable, "the worker is shutting down")
	}
	if old != nil {
		select {
		case <-old.fs.Done():
			// The kernel ended it (its folder was unmounted behind our back): mount afresh.
			m.log.Info("a mount had ended; mounting the Dataset again", "dataset", old.dataset(), "uid", uid, "path", old.path)
			m.forget(old)
		default:
			wasIdle := old.stopIdle()
			err := sameMount(old, req)
			if err == nil {
				if err := m.rotate(ctx, old, req); err != nil {
					return nil, err
				}
				if wasIdle {
					m.log.Info("a pod mounts an idle Dataset again; its files are still in the page cache", "dataset", dataset, "uid", uid)
				}
				return &workerpb.MountDatasetResponse{Path: old.path}, nil
			}
			if !wasIdle {
				return nil, err
			}
			// No pod mounts the idle file system: it goes, and the Dataset as asked now is
			// mounted in its place.
			m.log.Info("replacing an idle mount of the Dataset that serves another spec", "dataset", dataset, "uid", uid, "reason", status.Convert(err).Message())
			if err := m.unmount(ctx, old); err != nil {
				return nil, err
			}
		}
	}

	mnt, err := m.mount(ctx, req)
	if err != nil {
		return nil, err
	}
	m.mu.Lock()
	closed = m.closed
	if !closed {
		m.mounts[uid] = mnt
	}
	m.mu.Unlock()
	if closed {
		// Close began while this mount was made and did not see it.
		if err := m.unmount(ctx, mnt); err != nil {
			_ = detach(mnt.path)
			m.forget(mnt)
		}
		return nil, status.Error(codes.Unavailable, "the worker is shutting down")
	}
	m.hold(ctx, mnt)
	if input, ok := mnt.fs.(*fusefs.Server); ok {
		m.log.Info("mounted Dataset", "dataset", dataset, "uid", uid, "source", mnt.store.String(), "path", mnt.path,
			"files", mnt.fs.Files(), "bytes", mnt.fs.Bytes(), "passthrough", input.Passthrough(), "outlivesWorker", mnt.held)
	} else {
		m.log.Info("mounted output Dataset, writable", "dataset", dataset, "uid", uid, "path", mnt.path,
			"files", mnt.fs.Files(), "bytes", mnt.fs.Bytes())
	}
	return &workerpb.MountDatasetResponse{Path: mnt.path}, nil
}

// sameMount checks that req asks for what old serves. The credentials are not compared: a
// rotated Secret is taken in by rotate.
func sameMount(old *mount, req *workerpb.MountDatasetRequest) error {
	var diff []string
	if old.namespace != req.GetNamespace() || old.name != req.GetName() {
		diff = append(diff, fmt.Sprintf("Dataset %s, not %s/%s", old.dataset(), req.GetNamespace(), req.GetName()))
	}
	if !sameSources(old.req, req) {
		diff = append(diff, fmt.Sprintf("source %s, not %s", describeSources(old.req), describeSources(req)))
	}
	if old.output != req.GetOutput() {
		diff = append(diff, fmt.Sprintf("output %t, not %t", old.output, req.GetOutput()))
	}
	// An output is served writable whoever asks; the CSI plugin binds it read-only for readers.
	if !old.output && old.readOnly != req.GetReadOnly() {
		diff = append(diff, fmt.Sprintf("read-only %t, not %t", old.readOnly, req.GetReadOnly()))
	}
	if len(diff) == 0 {
		return nil
	}
	return status.Errorf(codes.FailedPrecondition, "Dataset uid %s is mounted at %s with %s: unmount it first",
		old.uid, old.path, strings.Join(diff, ", "))
}

// mount opens the under-store, lists it and mounts it; the caller holds uid's lock.
func (m *Mounter) mount(ctx context.Context, req *workerpb.MountDatasetRequest) (_ *mount, err error) {
	mnt := m.newMount(req)
	log := m.log.WithValues("dataset", mnt.dataset(), "uid", mnt.uid)
	if err := m.clearPath(mnt.path, log); err != nil {
		return nil, status.Errorf(codes.Internal, "preparing the mount point of Dataset %s: %v", mnt.dataset(), err)
	}
	if err := os.Mkdir(mnt.path, 0o755); err != nil && !errors.Is(err, os.ErrExist) {
		return nil, status.Errorf(codes.Internal, "creating the mount point of Dataset %s: %v", mnt.dataset(), err)
	}
	defer func() {
		if err != nil {
			mnt.release(log)
			if rerr := os.Remove(mnt.path); rerr != nil && !errors.Is(rerr, os.ErrNotExist) {
				log.Error(rerr, "removing the mount point of a failed mount", "path", mnt.path)
			}
		}
	}()

	if mnt.output {
		if mnt.fs, err = m.mountOutput(ctx, mnt, log); err != nil {
			return nil, err
		}
		return mnt, nil
	}
	if err := m.openCache(ctx, mnt, req, log); err != nil {
		return nil, err
	}
	mnt.fs, err = fusefs.Mount(ctx, mnt.path, m.fsConfig(mnt, log))
	if err != nil {
		var uerr *understore.Error
		if errors.As(err, &uerr) {
			return nil, storeError("mounting", mnt.dataset(), err)
		}
		return nil, status.Errorf(codes.Internal, "mounting Dataset %s: %v", mnt.dataset(), err)
	}
	return mnt, nil
}

// newMount is the mount req asks for, before anything is opened.
func (m *Mounter) newMount(req *workerpb.MountDatasetRequest) *mount {
	return &mount{
		uid: req.GetUid(), namespace: req.GetNamespace(), name: req.GetName(), readOnly: req.GetReadOnly(),
		output: req.GetOutput(), path: filepath.Join(m.cfg.MountsDir, req.GetUid()), req: req,
	}
}

// mountOutput serves an output Dataset, writable, from what the master lists of it.
func (m *Mounter) mountOutput(ctx context.Context, mnt *mount, log logr.Logger) (*outputfs.Server, error) {
	cfg, err := m.outputConfig(mnt, log)
	if err != nil {
		return nil, err
	}
	srv, err := outputfs.Mount(ctx, mnt.path, cfg)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "mounting output Dataset %s: %v", mnt.dataset(), err)
	}
	return srv, nil
}

// outputConfig is the output file system's configuration for mnt, the same for a mount and a
// takeover.
func (m *Mounter) outputConfig(mnt *mount, log logr.Logger) (outputfs.Config, error) {
	out := m.cfg.Outputs
	if out == nil {
		return outputfs.Config{}, status.Errorf(codes.FailedPrecondition,
			"Dataset %s is an output, and this worker has no master to record what is written: start it with --masters", mnt.dataset())
	}
	cfg := outputfs.Config{
		Dataset: datav1alpha1.MasterDatasetName(mnt.namespace, mnt.name, mnt.uid),
		Root:    datav1alpha1.MasterDatasetRoot(mnt.namespace, mnt.name, mnt.uid),
		Master:  out.Master, Store: m.cfg.Store, Locations: out.Locations, BlockSize: m.cfg.BlockSize,
		StagingDir: filepath.Join(out.StagingDir, mnt.uid), Name: "strata:" + mnt.dataset(),
		Metrics: out.Metrics, Checkpoints: out.Checkpoints, KeepsReadCopies: out.KeepsReadCopies, Callers: out.Callers, Log: log,
	}
	if m.cfg.Handovers != nil {
		// The store must hold the journal the mount appends to, or a takeover would miss changes.
		cfg.OnNewJournal = func(h outputfs.Handover) error { return m.putFiles(context.Background(), mnt, h.Files()) }
	}
	return cfg, nil
}

// rotate makes old read its source with the credentials of req when they are not those it
// reads with: the kubelet publishes again with the Secret's current keys (the CSIDriver asks
// it to, every minute or so, and at each new pod), so a rotated Secret is used by the next read
// without a remount. The next worker resumes the mount with them too.
func (m *Mounter) rotate(ctx context.Context, old *mount, req *workerpb.MountDatasetRequest) error {
	if old.store == nil || sameCredentials(old.req, req) {
		return nil
	}
	store, err := m.openSources(ctx, req)
	if err != nil {
		return storeError("mounting", old.dataset(), err)
	}
	// Calls under way finish with the old store, which is closed once they are done (it may
	// hold resources: a Union of mounts with a file:// one beside a rotated one).
	old.store.Replace(store)
	// sameMount found req the same as old.req but for the credentials.
	old.handoverMu.Lock()
	old.req = proto.Clone(req).(*workerpb.MountDatasetRequest)
	old.handoverMu.Unlock()
	m.rotations.Inc()
	m.log.Info("reading the Dataset's source with its Secret's new credentials", "dataset", old.dataset(), "uid", old.uid)
	m.hold(ctx, old)
	return nil
}

// openCache opens the under-store of req and the Dataset's read-through cache over it.
func (m *Mounter) openCache(ctx context.Context, mnt *mount, req *workerpb.MountDatasetRequest, log logr.Logger) error {
	store, err := m.openSources(ctx, req)
	if err != nil {
		return storeError("mounting", mnt.dataset(), err)
	}
	mnt.store = understore.NewReplaceable(store)
	cfg := cache.Config{
		Store: m.cfg.Store, Source: mnt.store, SourceID: mnt.uid, BlockSize: m.cfg.BlockSize, Fetch: m.cfg.Fetch,
		Peers: m.cfg.Peers, Metrics: m.cfg.CacheMetrics, Log: log,
	}
	if m.cfg.Stored != nil {
		cfg.Dataset = datav1alpha1.MasterDatasetName(mnt.namespace, mnt.name, mnt.uid)
		cfg.Root = datav1alpha1.MasterDatasetRoot(mnt.namespace, mnt.name, mnt.uid)
		cfg.Stored = m.cfg.Stored
	}
	if pinned := m.cfg.Pinned; pinned != nil {
		dataset := datav1alpha1.MasterDatasetName(mnt.namespace, mnt.name, mnt.uid)
		cfg.Pinned = func(file string, index, blocks int64) bool { return pinned(dataset, file, index, blocks) }
	}
	if mnt.cache, err = cache.New(cfg); err != nil {
		return status.Errorf(codes.Internal, "Dataset %s: %v", mnt.dataset(), err)
	}
	return nil
}

// fsConfig is the file system's configuration for mnt, whose cache is open.
func (m *Mounter) fsConfig(mnt *mount, log logr.Logger) fusefs.Config {
	return fusefs.Config{
		Objects:            m.mountLister(mnt, log),
		Blocks:             mnt.cache,
		BlockSize:          m.cfg.BlockSize,
		Local:              localBlocks{store: m.cfg.Store, sourceID: mnt.uid},
		DisablePassthrough: m.cfg.DisablePassthrough,
		Name:               "strata:" + mnt.dataset(),
		Metrics:            m.fm,
		Loads:              m.loads,
		Log:                log,
	}
}

// mountLister lists mnt's source for its mount: it shows the tree another node's mount of the
// Dataset shows, if one does (one tree on every node until the next sync), else lists the
// source, keeping each good listing; a source that cannot be reached is answered with the last
// good listing.
func (m *Mounter) mountLister(mnt *mount, log logr.Logger) *listings.Lister {
	return &listings.Lister{Source: mnt.store, UID: mnt.uid, Store: m.cfg.Listings, Peers: m.cfg.ListingPeers,
		Fallback: true, Current: true, Log: log}
}

// syncLister lists mnt's source afresh for a sync, or takes the listing the worker at
// listingFrom took for the same sync, so that every node shows one tree.
func (m *Mounter) syncLister(mnt *mount, listingFrom string, log logr.Logger) *listings.Lister {
	var source listings.Source = mnt.store
	if listingFrom != "" && m.cfg.ListingPeers != nil {
		source = listings.FromPeer{Peers: m.cfg.ListingPeers, Addr: listingFrom, UID: mnt.uid, Source: mnt.store, Log: log}
	}
	return &listings.Lister{Source: source, UID: mnt.uid, Store: m.cfg.Listings, Peers: m.cfg.ListingPeers, Log: log}
}

// storeError turns an under-store failure in doing something ("mounting") to a Dataset
// into a status that says what to fix.
func storeError(doing, dataset string, err error) error {
	code, hint := codes.Unavailable, "try again later"
	// field names a field of the source the hint points at, or of the mount that failed.
	field := func(name string) string { return "spec.source." + name }
	if me := (*understore.MountError)(nil); errors.As(err, &me) {
		field = func(name string) string { return fmt.Sprintf("the %s of the spec.mounts entry at /%s", name, me.Path) }
	}
	switch {
	case errors.Is(err, understore.ErrMissingCredentials):
		code, hint = codes.InvalidArgument, "give "+field("secretRef")+" a Secret with the keys named"
	case errors.Is(err, understore.ErrInvalidPath):
		code, hint = codes.InvalidArgument, "fix the Dataset's "+field("uri")
	case errors.Is(err, understore.ErrOutsideRoots):
		code, hint = codes.FailedPrecondition, "file:// sources must lie under one of the TierPool's fileSourceRoots"
	case errors.Is(err, understore.ErrAccessDenied):
		code, hint = codes.FailedPrecondition, "check the credentials in the Secret of "+field("secretRef")+" (or the role of "+field("webIdentity")+"), and that they may list and read the bucket or path (without either, the bucket is read anonymously, so it must be public)"
	case errors.Is(err, understore.ErrNotFound):
		code, hint = codes.FailedPrecondition, "check "+field("uri")+": the bucket or path does not exist"
	case errors.Is(err, understore.ErrUnreachable):
		code, hint = codes.Unavailable, "check "+field("endpoint")+" and that this node can reach it"
	case errors.Is(err, errors.ErrUnsupported):
		code, hint = codes.FailedPrecondition, "the source cannot be listed, so it cannot be mounted as a folder: an http(s) source must be a folder whose server answers with HTML directory indexes"
	case errors.Is(err, context.DeadlineExceeded):
		code, hint = codes.DeadlineExceeded, "listing the source took too long"
	case errors.Is(err, context.Canceled):
		code, hint = codes.Canceled, "the request was cancelled"
	}
	return status.Errorf(code, "%s Dataset %s: %v; %s", doing, dataset, err, hint)
}

// localBlocks opens the blocks of one Dataset that the tiers hold.
type localBlocks struct {
	store    BlockStore
	sourceID string
}

func (l localBlocks) OpenBlock(ctx context.Context, file, etag string, index int64) (*os.File, error) {
	f, _, err := l.store.OpenBlock(ctx, cache.BlockID(l.sourceID, file, etag, index))
	return f, err
}

// release stops the cache and closes the store, whatever of them exists, once.
func (mnt *mount) release(log logr.Logger) {
	mnt.released.Do(func() {
		if mnt.cache != nil {
			mnt.cache.Close()
		}
		if mnt.store != nil {
			if err := mnt.store.Close(); err != nil {
				log.Error(err, "closing the under-store", "store", mnt.store.String())
			}
		}
	})
}

// forget drops a mount whose file system has ended.
func (m *Mounter) forget(mnt *mount) {
	m.mu.Lock()
	if m.mounts[mnt.uid] == mnt {
		delete(m.mounts, mnt.uid)
	}
	m.mu.Unlock()
	mnt.release(m.log)
	m.unhold(mnt)
	_ = os.Remove(mnt.path) // a mount point left behind is cleared at the next mount
}

// UnmountDataset implements workerpb.MounterServer. If pods on the node still mount the
// Dataset (their bind mounts), its folder is unmounted and the call succeeds, but the file
// system is served until the last of them goes, so that no pod loses its files.
func (m *Mounter) UnmountDataset(ctx context.Context, req *workerpb.UnmountDatasetRequest) (*workerpb.UnmountDatasetResponse, error) {
	uid := req.GetUid()
	mnt, unlock, err := m.lockedMount(ctx, uid)
	if err != nil {
		return nil, err
	}
	defer unlock()
	if mnt == nil {
		// Not ours; a mount point left there by an earlier worker goes too.
		if err := m.clearPath(filepath.Join(m.cfg.MountsDir, uid), m.log.WithValues("uid", uid)); err != nil {
			return nil, status.Errorf(codes.Internal, "clearing the mount point of Dataset uid %s: %v", uid, err)
		}
		return &workerpb.UnmountDatasetResponse{}, nil
	}
	if m.cfg.KeepIdle > 0 && !mnt.output && !mnt.deleted.Load() {
		m.keepIdle(mnt)
		return &workerpb.UnmountDatasetResponse{}, nil
	}
	if err := m.unmount(ctx, mnt); err != nil {
		return nil, err
	}
	return &workerpb.UnmountDatasetResponse{}, nil
}

// keepIdle leaves mnt mounted, with no pod of the node using it, for Config.KeepIdle: a
// kernel drops a FUSE file system's page cache with the file system, so unmounting at once
// would send every byte the next pod reads through the worker again (on this project's
// benchmark, half of tmpfs's speed instead of tmpfs's). The caller holds its UID's lock.
func (m *Mounter) keepIdle(mnt *mount) {
	mnt.stopIdle()
	var timer *time.Timer
	timer = time.AfterFunc(m.cfg.KeepIdle, func() { m.unmountIdle(mnt, timer) })
	mnt.idle = timer
	m.log.Info("no pod of the node mounts the Dataset; keeping it mounted a while for the next one",
		"dataset", mnt.dataset(), "uid", mnt.uid, "for", m.cfg.KeepIdle.String())
}

// stopIdle tells whether mnt was idle, and ends that; the caller holds its UID's lock.
func (mnt *mount) stopIdle() bool {
	if mnt.idle == nil {
		return false
	}
	mnt.idle.Stop()
	mnt.idle = nil
	return true
}

// unmountIdle unmounts mnt if it is still the Dataset's mount and idle since timer was set.
// Close unmounts what is left when the worker stops.
func (m *Mounter) unmountIdle(mnt *mount, timer *time.Timer) {
	log := m.log.WithValues("dataset", mnt.dataset(), "uid", mnt.uid)
	ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
	defer cancel()
	unlock, err := m.lock(ctx, mnt.uid)
	if err != nil {
		// A mount or unmount of the Dataset holds the lock, and decides.
		log.Info("an idle Dataset's mount was busy with another call; leaving it to that call", "reason", err.Error())
		return
	}
	defer unlock()
	m.mu.Lock()
	current := !m.closed && m.mounts[mnt.uid] == mnt
	m.mu.Unlock()
	if !current || mnt.idle != timer {
		return
	}
	mnt.idle = nil
	if err := m.unmount(ctx, mnt); err != nil {
		log.Error(err, "unmounting an idle Dataset; trying again later")
		m.keepIdle(mnt)
		return
	}
	log.Info("unmounted a Dataset no pod of the node mounted for a while", "idleFor", m.cfg.KeepIdle.String())
}

// unmount unmounts mnt; the caller holds its UID's lock.
func (m *Mounter) unmount(ctx context.Context, mnt *mount) error {
	log := m.log.WithValues("dataset", mnt.dataset(), "uid", mnt.uid, "path", mnt.path)
	dctx, cancel := context.WithTimeout(ctx, m.cfg.DrainTimeout)
	defer cancel()
	err := mnt.fs.Unmount(dctx)
	switch {
	case err == nil:
		m.forget(mnt)
		log.Info("unmounted Dataset")
		return nil
	case errors.Is(err, fuseconn.ErrStillMounted):
		m.mu.Lock()
		delete(m.mounts, mnt.uid)
		// Close waits for the drains it knows of; once it has begun, none may start.
		closed := m.closed
		if !closed {
			m.draining[mnt] = struct{}{}
			m.wg.Add(1)
		}
		m.mu.Unlock()
		_ = os.Remove(mnt.path)
		if closed {
			m.abort(mnt)
			mnt.release(log)
			return nil
		}
		log.Info("unmounted Dataset; pods on the node still mount it, so it is served until they are gone")
		go m.drain(mnt, log)
		return nil
	case errors.Is(err, fuseconn.ErrBusy):
		return status.Errorf(codes.FailedPrecondition,
			"Dataset %s at %s is busy: a process on the node has a file open in it or its working directory there; stop it, then unmount again", mnt.dataset(), mnt.path)
	default:
		return status.Errorf(codes.Internal, "unmounting Dataset %s: %v", mnt.dataset(), err)
	}
}

// drain waits until the kernel ends a file system that pods still mounted, then releases it.
func (m *Mounter) drain(mnt *mount, log logr.Logger) {
	defer m.wg.Done()
	<-mnt.fs.Stopped()
	mnt.release(log)
	m.mu.Lock()
	delete(m.draining, mnt)
	m.mu.Unlock()
	select {
	case <-mnt.fs.Done():
		m.unhold(mnt)
		log.Info("the last mount of the Dataset is gone; released it")
	default:
		log.Info("left a Dataset that pods still mount to the next worker")
	}
}

// Close stops serving every Dataset, for a worker that stops. Mounts the file descriptor
// store holds (Config.Handovers) stay mounted, their requests waiting in the kernel for the
// next worker. The others are unmounted; those still busy or held by pods are detached and
// their connections aborted: the process that serves them is going away, so they would fail
// anyway (with ENOTCONN), and detaching leaves the mount points free for the next worker.
// Close waits for the file systems to end.
func (m *Mounter) Close() error {
	m.mu.Lock()
	m.closed = true
	var all []*mount
	for _, mnt := range m.mounts {
		all = append(all, mnt)
	}
	m.mu.Unlock()

	var errs []error
	for _, mnt := range all {
		ctx, cancel := context.WithTimeout(context.Background(), closeTimeout)
		unlock, err := m.lock(ctx, mnt.uid)
		if err != nil {
			cancel()
			errs = append(errs, err)
			continue
		}
		m.mu.Lock()
		current := m.mounts[mnt.uid] == mnt
		m.mu.Unlock()
		if !current {
			// Unmounted by a call that held the lock before us.
			unlock()
			cancel()
			continue
		}
		// An idle mount is unmounted rather than left to the next worker, which could not tell
		// that no pod mounts it.
		if !mnt.stopIdle() && m.suspendHeld(mnt) {
			unlock()
			cancel()
			continue
		}
		if err := m.unmount(ctx, mnt); err != nil {
			m.log.Info("could not unmount a Dataset cleanly at shutdown; detaching it", "dataset", mnt.dataset(), "reason", err.Error())
			if err := detach(mnt.path); err != nil {
				errs = append(errs, err)
			}
			m.abort(mnt)
			m.forget(mnt)
		}
		unlock()
		cancel()
	}

	m.mu.Lock()
	var draining []*mount
	for mnt := range m.draining {
		draining = append(draining, mnt)
	}
	m.mu.Unlock()
	for _, mnt := range draining {
		if !m.suspendHeld(mnt) {
			m.abort(mnt)
		}
	}
	if len(draining) > 0 {
		// The drains end with their file systems, which abort has ended unless fusectl is
		// missing; then they end when the process exits, and so does this goroutine.
		done := make(chan struct{})
		go func() { m.wg.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(closeTimeout):
			errs = append(errs, fmt.Errorf("%d Dataset file systems still mounted by pods after %s: they end when the worker exits", len(draining), closeTimeout))
		}
	}
	return errors.Join(errs...)
}

// suspendHeld stops serving a mount the store holds, leaving it mounted for the next worker
// (whose Recover takes it over), and reports whether it did.
func (m *Mounter) suspendHeld(mnt *mount) bool {
	m.mu.Lock()
	held := mnt.held
	if held && m.mounts[mnt.uid] == mnt {
		delete(m.mounts, mnt.uid)
	}
	m.mu.Unlock()
	if !held {
		return false
	}
	mnt.fs.Suspend()
	mnt.release(m.log)
	m.log.Info("left the Dataset mounted for the next worker", "dataset", mnt.dataset(), "uid", mnt.uid, "path", mnt.path)
	return true
}

// abort ends a file system's connection, so that its goroutines end; best effort.
func (m *Mounter) abort(mnt *mount) {
	if err := mnt.fs.Abort(); err != nil {
		m.log.Info("could not abort a FUSE connection; it ends when the worker exits", "dataset", mnt.dataset(), "reason", err.Error())
		return
	}
	select {
	case <-mnt.fs.Done():
	case <-time.After(closeTimeout):
	}
}

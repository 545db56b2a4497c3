package client_test

import (
	"bytes"
	"fmt"
	"io"
	"slices"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/internal/pki"
	"github.com/strata-cache/strata/internal/pki/pkitest"
	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/mastertest"
)

// A backup of one master, restored into a new one over the API as the operator does (mutual TLS
// and the master's authorization): the files, Datasets and checkpoints come back, the old
// install's workers are lost and register again, and the state survives the new leader's death.
func TestABackupRestoresIntoANewMaster(t *testing.T) {
	ctx := deadline(t, 2*time.Minute)
	ca := pkitest.New(t)
	opts := mastertest.Options{GRPC: true, TLS: ca}
	old := mastertest.New(t, 3, opts)
	cl := old.Client()
	worker := pki.Worker("pool", "node-1")
	wcl := old.ClientAs(worker)
	tiers := []*masterpb.TierUsage{{Tier: "MEM", CapacityBytes: 1 << 30}}
	if _, err := wcl.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: worker.WorkerID(), Node: "node-1", Tiers: tiers}); err != nil {
		t.Fatal(err)
	}
	if _, err := cl.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: "ns/ds", Root: "/ds"}); err != nil {
		t.Fatal(err)
	}
	const files = 20
	for i := range files {
		p := fmt.Sprintf("/ds/part-%02d", i)
		if _, err := wcl.CreateFile(ctx, &masterpb.CreateFileRequest{Path: p, Dataset: "ns/ds", Written: true}); err != nil {
			t.Fatal(err)
		}
		if _, err := wcl.CommitBlock(ctx, &masterpb.CommitBlockRequest{BlockId: uint64(i + 1), Path: p, Size: 64, Worker: worker.WorkerID(), Tier: "MEM"}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := wcl.CheckpointFile(ctx, &masterpb.CheckpointFileRequest{Path: "/ds/part-00", State: masterpb.CheckpointState_CHECKPOINT_STATE_DONE, Uri: "s3://b/part-00"}); err != nil {
		t.Fatal(err)
	}

	if _, _, err := wcl.Backup(ctx); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a worker's backup: %v, want PermissionDenied", err)
	}
	header, backup := takeBackup(t, cl)
	if header.Index == 0 || header.Size != int64(backup.Len()) || header.TakenBy == "" {
		t.Fatalf("backup header %v for %d bytes", header, backup.Len())
	}
	// Written after the backup: not in it.
	if _, err := wcl.CreateFile(ctx, &masterpb.CreateFileRequest{Path: "/ds/after", Dataset: "ns/ds"}); err != nil {
		t.Fatal(err)
	}

	fresh := mastertest.New(t, 3, opts)
	fcl := fresh.Client()
	if _, err := fresh.ClientAs(worker).Restore(ctx, bytes.NewReader(backup.Bytes())); status.Code(err) != codes.PermissionDenied {
		t.Errorf("a worker's restore: %v, want PermissionDenied", err)
	}
	// The new install's workers registered and reported a block they cache from a source: the
	// restore replaces that record (they report it again when they register after it).
	fwcl := fresh.ClientAs(worker)
	if _, err := fwcl.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: worker.WorkerID(), Node: "node-1", Tiers: tiers}); err != nil {
		t.Fatal(err)
	}
	if _, err := fcl.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: "ns/input", Root: "/input"}); err != nil {
		t.Fatal(err)
	}
	if _, err := fwcl.CreateFile(ctx, &masterpb.CreateFileRequest{Path: "/input/cached", Dataset: "ns/input"}); err != nil {
		t.Fatal(err)
	}
	resp, err := fcl.Restore(ctx, bytes.NewReader(backup.Bytes()))
	if err != nil {
		t.Fatal(err)
	}
	if resp.BackupIndex != header.Index || resp.Datasets != 1 || resp.Files != files || !slices.Equal(resp.WorkersMarkedLost, []string{worker.WorkerID()}) ||
		resp.ReplacedDatasets != 1 || resp.ReplacedFiles != 1 {
		t.Errorf("restore: %v; want index %d, 1 Dataset, %d files, worker %s lost, 1 Dataset and 1 file replaced", resp, header.Index, files, worker.WorkerID())
	}
	if _, err := fcl.GetFile(ctx, &masterpb.GetFileRequest{Path: "/input/cached"}); status.Code(err) != codes.NotFound {
		t.Errorf("the new install's record of a cached block after the restore: %v, want NotFound", err)
	}

	// The new leader dies: a follower has the state (raft sent it the restored snapshot), and
	// the dead one restarts from its disk.
	leader, err := fresh.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	fresh.Kill(leader)
	assertRestored(t, fcl, files)
	fresh.Restart(leader)
	if err := fresh.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	assertRestored(t, fcl, files)

	// The worker is told to register again, and is alive once it has.
	hb, err := fwcl.Heartbeat(ctx, &masterpb.HeartbeatRequest{Worker: worker.WorkerID(), Tiers: tiers})
	if err != nil || hb.Command != masterpb.WorkerCommand_WORKER_COMMAND_REGISTER {
		t.Errorf("heartbeat of the backup's worker: %v, %v; want REGISTER", hb, err)
	}
	if w, err := fwcl.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: worker.WorkerID(), Node: "node-1", Tiers: tiers}); err != nil || w.State != masterpb.WorkerState_WORKER_STATE_ALIVE {
		t.Errorf("registering again: %v, %v", w, err)
	}
	// New files get new ids.
	f, err := fwcl.CreateFile(ctx, &masterpb.CreateFileRequest{Path: "/ds/new", Dataset: "ns/ds", Written: true})
	if err != nil {
		t.Fatal(err)
	}
	old0, err := fcl.GetFile(ctx, &masterpb.GetFileRequest{Path: "/ds/part-19"})
	if err != nil || f.Id <= old0.Id {
		t.Errorf("a file made after the restore has id %d, the backup's last %v (%v)", f.Id, old0, err)
	}

	// The same backup again, as a caller that did not learn how the first call ended asks: it
	// is recognised, and the worker that registered since is not marked lost again.
	again, err := fcl.Restore(ctx, bytes.NewReader(backup.Bytes()))
	if err != nil || !again.AlreadyRestored || len(again.WorkersMarkedLost) != 0 || again.BackupIndex != header.Index {
		t.Errorf("the same restore again: %v, %v; want it recognised, no worker marked lost", again, err)
	}
	if w, err := fwcl.Heartbeat(ctx, &masterpb.HeartbeatRequest{Worker: worker.WorkerID(), Tiers: tiers}); err != nil || w.Command != masterpb.WorkerCommand_WORKER_COMMAND_NONE {
		t.Errorf("the worker after the second call: %v, %v; want it alive", w, err)
	}

	// Another backup: a master that holds files a pod wrote takes none.
	_, later := takeBackup(t, cl)
	_, err = fcl.Restore(ctx, bytes.NewReader(later.Bytes()))
	if status.Code(err) != codes.FailedPrecondition || !strings.Contains(err.Error(), "it holds 21 file(s) written by pods") {
		t.Errorf("a restore into a master that holds files: %v, want FailedPrecondition naming what it holds", err)
	}
}

func takeBackup(t *testing.T, cl *client.Client) (*masterpb.BackupHeader, *bytes.Buffer) {
	t.Helper()
	header, rc, err := cl.Backup(deadline(t, 30*time.Second))
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = rc.Close() }()
	var backup bytes.Buffer
	if _, err := io.Copy(&backup, rc); err != nil {
		t.Fatal(err)
	}
	return header, &backup
}

func assertRestored(t *testing.T, cl *client.Client, files int) {
	t.Helper()
	ctx := deadline(t, 30*time.Second)
	list, err := cl.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: "/ds"})
	if err != nil || len(list.Entries) != files {
		var paths []string
		for _, e := range list.GetEntries() {
			paths = append(paths, e.GetPath())
		}
		t.Fatalf("the restored files: %v, %v; want %d (and not the one written after the backup)", paths, err, files)
	}
	f, err := cl.GetFile(ctx, &masterpb.GetFileRequest{Path: "/ds/part-00"})
	if err != nil || f.GetCheckpointUri() != "s3://b/part-00" {
		t.Errorf("the checkpointed file: %v, %v", f, err)
	}
	locs, err := cl.GetBlockLocations(ctx, &masterpb.GetBlockLocationsRequest{Path: "/ds/part-01"})
	if err != nil || len(locs.Blocks) != 1 || len(locs.Blocks[0].Locations) != 1 || !locs.Blocks[0].Locations[0].Lost {
		t.Errorf("the block of the old install's worker: %v, %v; want its copy lost", locs, err)
	}
	if _, err := cl.GetDataset(ctx, &masterpb.GetDatasetRequest{Name: "ns/ds"}); err != nil {
		t.Errorf("the restored Dataset: %v", err)
	}
}

// A stream that is not a whole backup replaces nothing, and says why.
func TestARestoreOfABrokenBackupChangesNothing(t *testing.T) {
	ctx := deadline(t, time.Minute)
	src := mastertest.New(t, 1, mastertest.Options{GRPC: true})
	if _, err := src.Client().RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: "ns/ds", Root: "/ds"}); err != nil {
		t.Fatal(err)
	}
	_, backup := takeBackup(t, src.Client())
	flipped := bytes.Clone(backup.Bytes())
	flipped[len(flipped)/2] ^= 0x40
	for name, stream := range map[string][]byte{
		"truncated":     backup.Bytes()[:backup.Len()-3],
		"a bit flipped": flipped,
		"not a backup":  []byte("hello"),
		"empty":         nil,
	} {
		t.Run(name, func(t *testing.T) {
			dst := mastertest.New(t, 1, mastertest.Options{GRPC: true})
			_, err := dst.Client().Restore(ctx, bytes.NewReader(stream))
			if status.Code(err) != codes.InvalidArgument || !strings.Contains(err.Error(), "not an intact backup") {
				t.Errorf("restore: %v, want InvalidArgument, not an intact backup", err)
			}
			if _, err := dst.Client().RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: "ns/other", Root: "/other"}); err != nil {
				t.Errorf("the master after a refused restore: %v", err)
			}
		})
	}
}

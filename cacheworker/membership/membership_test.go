package membership

import (
	"context"
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/go-logr/logr"
	. "github.com/onsi/gomega"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"

	"github.com/strata-cache/strata/cacheworker/tierstore"
	"github.com/strata-cache/strata/master/masterpb"
)

func TestNewRefusesAnIncompleteConfig(t *testing.T) {
	cases := map[string]struct {
		cfg     Config
		wantErr string
	}{
		"a worker without an id":       {cfg: Config{Address: "a:1", Interval: time.Second}, wantErr: "needs an id"},
		"a worker without an address":  {cfg: Config{ID: "p/n", Interval: time.Second}, wantErr: "data-plane address"},
		"a heartbeat interval of zero": {cfg: Config{ID: "p/n", Address: "a:1"}, wantErr: "must be positive"},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			_, err := New(tc.cfg, &fakeMaster{}, fakeStore{}, prometheus.NewRegistry())
			NewWithT(t).Expect(err).To(MatchError(ContainSubstring(tc.wantErr)))
		})
	}
}

// fakeMaster fails its first registrations, then answers heartbeats with what the test says.
type fakeMaster struct {
	mu            sync.Mutex
	failRegister  int
	registrations []*masterpb.RegisterWorkerRequest
	heartbeats    int
	sayRegisterAt int // heartbeat number answered with WORKER_COMMAND_REGISTER
}

func (f *fakeMaster) RegisterWorker(_ context.Context, req *masterpb.RegisterWorkerRequest) (*masterpb.Worker, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.failRegister > 0 {
		f.failRegister--
		return nil, errors.New("master unreachable")
	}
	f.registrations = append(f.registrations, req)
	return &masterpb.Worker{Id: req.GetId()}, nil
}

func (f *fakeMaster) Heartbeat(context.Context, *masterpb.HeartbeatRequest) (*masterpb.HeartbeatResponse, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.heartbeats++
	if f.heartbeats == f.sayRegisterAt {
		return &masterpb.HeartbeatResponse{Command: masterpb.WorkerCommand_WORKER_COMMAND_REGISTER}, nil
	}
	return &masterpb.HeartbeatResponse{}, nil
}

func (f *fakeMaster) count() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.registrations)
}

type fakeStore struct{}

func (fakeStore) Stats() []tierstore.TierStats {
	return []tierstore.TierStats{{Name: "mem", Quota: 100, Used: 40}}
}

func (fakeStore) Blocks() []tierstore.BlockInfo { return []tierstore.BlockInfo{{ID: "b1"}, {ID: "b2"}} }

// TestRunRetriesAndRegistersAgain: registration survives an unreachable master, and the worker
// registers again, reporting its blocks, when a heartbeat says the master lost track of it.
func TestRunRetriesAndRegistersAgain(t *testing.T) {
	g := NewWithT(t)
	master := &fakeMaster{failRegister: 2, sayRegisterAt: 3}
	var reportedMu sync.Mutex
	var reported []int
	reg := prometheus.NewRegistry()
	m, err := New(Config{
		ID: "pool/node", Address: "10.0.0.1:7100", Node: "node", Interval: 10 * time.Millisecond, Log: logr.Discard(),
		Report: func(_ context.Context, blocks []tierstore.BlockInfo) (int, error) {
			reportedMu.Lock()
			defer reportedMu.Unlock()
			reported = append(reported, len(blocks))
			return len(blocks), nil
		},
	}, master, fakeStore{}, reg)
	g.Expect(err).NotTo(HaveOccurred())
	g.Expect(m.Registered()).To(BeFalse(), "not ready before the master knows the worker")

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- m.Run(ctx) }()
	g.Eventually(master.count).WithTimeout(5*time.Second).Should(Equal(2), "registered after two failures, then again on command")
	cancel()
	g.Expect(<-done).To(Succeed())

	g.Expect(m.Registered()).To(BeTrue())
	g.Expect(master.registrations[0]).To(And(HaveField("Id", "pool/node"), HaveField("Address", "10.0.0.1:7100"),
		HaveField("Node", "node"), HaveField("Tiers", ConsistOf(And(HaveField("CapacityBytes", int64(100)), HaveField("UsedBytes", int64(40))))),
	))
	reportedMu.Lock()
	g.Expect(reported).To(Equal([]int{2, 2}), "every registration reports every block")
	reportedMu.Unlock()
	g.Expect(testutil.ToFloat64(m.registrations)).To(Equal(2.0))
}

package liveness

import (
	"context"
	"sort"
	"testing"
	"time"

	"github.com/strata-cache/strata/master/masterpb"
)

type fakeStore struct {
	leader      bool
	leaderSince time.Time
	workers     []*masterpb.Worker
	// heard are the heartbeats in the leader's memory, by worker.
	heard  map[string]time.Time
	marked []string
}

func (f *fakeStore) LastHeartbeat(worker string) time.Time { return f.heard[worker] }

func (f *fakeStore) IsLeader() bool         { return f.leader }
func (f *fakeStore) LeaderSince() time.Time { return f.leaderSince }
func (f *fakeStore) Workers(context.Context) ([]*masterpb.Worker, error) {
	return f.workers, nil
}

func (f *fakeStore) MarkWorkerLost(_ context.Context, worker, _ string) (*masterpb.MarkWorkerLostResponse, error) {
	f.marked = append(f.marked, worker)
	return &masterpb.MarkWorkerLostResponse{}, nil
}

func TestCheck(t *testing.T) {
	now := time.Date(2025, 1, 1, 12, 0, 0, 0, time.UTC)
	alive := func(id string, lastHeartbeat time.Duration) *masterpb.Worker {
		return &masterpb.Worker{Id: id, State: masterpb.WorkerState_WORKER_STATE_ALIVE, LastHeartbeatUnixNano: now.Add(-lastHeartbeat).UnixNano()}
	}
	tests := map[string]struct {
		leader      bool
		leaderFor   time.Duration
		workers     []*masterpb.Worker
		heard       map[string]time.Duration // ago, in the leader's memory
		wantLost    []string
		wantMarkErr bool
		wantMarked  []string
	}{
		"a worker silent for longer than the timeout is declared lost": {
			leader: true, leaderFor: time.Hour,
			workers:  []*masterpb.Worker{alive("w1", 31*time.Second), alive("w2", time.Second)},
			wantLost: []string{"w1"}, wantMarked: []string{"w1"},
		},
		"a worker heard from within the timeout stays alive": {
			leader: true, leaderFor: time.Hour,
			workers: []*masterpb.Worker{alive("w1", 29*time.Second)},
		},
		"a heartbeat in the leader's memory counts, however old the log's": {
			leader: true, leaderFor: time.Hour,
			workers: []*masterpb.Worker{alive("w1", time.Hour)}, heard: map[string]time.Duration{"w1": 5 * time.Second},
		},
		"a worker silent in the leader's memory too is declared lost": {
			leader: true, leaderFor: time.Hour,
			workers: []*masterpb.Worker{alive("w1", time.Hour)}, heard: map[string]time.Duration{"w1": 31 * time.Second},
			wantLost: []string{"w1"}, wantMarked: []string{"w1"},
		},
		"a new leader gives every worker a full timeout": {
			leader: true, leaderFor: 10 * time.Second,
			workers: []*masterpb.Worker{alive("w1", time.Hour)},
		},
		"a new leader declares lost once its own timeout passed": {
			leader: true, leaderFor: 31 * time.Second,
			workers:  []*masterpb.Worker{alive("w1", time.Hour)},
			wantLost: []string{"w1"}, wantMarked: []string{"w1"},
		},
		"a follower leaves workers to the leader": {
			leader:  false,
			workers: []*masterpb.Worker{alive("w1", time.Hour)},
		},
		"a loss left half-recorded by the previous leader is finished": {
			leader: true, leaderFor: time.Second,
			workers:    []*masterpb.Worker{{Id: "w1", State: masterpb.WorkerState_WORKER_STATE_LOST, LossPending: true}},
			wantMarked: []string{"w1"},
		},
		"a worker already lost is left alone": {
			leader: true, leaderFor: time.Hour,
			workers: []*masterpb.Worker{{Id: "w1", State: masterpb.WorkerState_WORKER_STATE_LOST}},
		},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			fs := &fakeStore{leader: tc.leader, workers: tc.workers, heard: map[string]time.Time{}}
			for w, ago := range tc.heard {
				fs.heard[w] = now.Add(-ago)
			}
			if tc.leader {
				fs.leaderSince = now.Add(-tc.leaderFor)
			}
			d := New(fs, Config{Timeout: 30 * time.Second, Now: func() time.Time { return now }})
			lost, err := d.Check(context.Background())
			if err != nil {
				t.Fatal(err)
			}
			sort.Strings(lost)
			if !equal(lost, tc.wantLost) || !equal(fs.marked, tc.wantMarked) {
				t.Errorf("lost %v marked %v, want lost %v marked %v", lost, fs.marked, tc.wantLost, tc.wantMarked)
			}
		})
	}
}

func equal(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	for i := range a {
		if a[i] != b[i] {
			return false
		}
	}
	return true
}

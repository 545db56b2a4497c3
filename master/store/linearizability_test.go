package store_test

import (
	"context"
	"errors"
	"fmt"
	"math"
	"math/rand"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/anishathalye/porcupine"

	"github.com/strata-cache/strata/master/fsm"
	"github.com/strata-cache/strata/master/mastertest"
)

// The history is checked against a model of one file per key: absent (""), or present with the
// client token of the create that made it. Reads return that token, so a read tells which
// create it observed.

type opKind int

const (
	opCreate opKind = iota
	opDelete
	opGet
)

type kvInput struct {
	kind  opKind
	key   string
	token string
}

type kvOutput struct {
	// unknown: the call failed in a way that leaves its effect unknown (the leader died or
	// stepped down mid-commit, or the call timed out).
	unknown bool
	// failed: the state machine refused it (create of an existing file, delete of a missing one).
	failed bool
	value  string
}

var fileModel = porcupine.NondeterministicModel{
	Partition: func(history []porcupine.Operation) [][]porcupine.Operation {
		byKey := map[string][]porcupine.Operation{}
		var keys []string
		for _, op := range history {
			k := op.Input.(kvInput).key
			if _, ok := byKey[k]; !ok {
				keys = append(keys, k)
			}
			byKey[k] = append(byKey[k], op)
		}
		var out [][]porcupine.Operation
		for _, k := range keys {
			out = append(out, byKey[k])
		}
		return out
	},
	Init: func() []interface{} { return []interface{}{""} },
	Step: func(state, input, output interface{}) []interface{} {
		st, in, out := state.(string), input.(kvInput), output.(kvOutput)
		switch in.kind {
		case opCreate:
			switch {
			case out.unknown && st == "":
				return []interface{}{st, in.token}
			case out.unknown, out.failed && st != "":
				return []interface{}{st}
			case !out.failed && st == "":
				return []interface{}{in.token}
			}
		case opDelete:
			switch {
			case out.unknown && st != "":
				return []interface{}{st, ""}
			case out.unknown, out.failed && st == "":
				return []interface{}{st}
			case !out.failed && st != "":
				return []interface{}{""}
			}
		case opGet:
			if out.value == st {
				return []interface{}{st}
			}
		}
		return nil
	},
	DescribeOperation: func(input, output interface{}) string {
		in, out := input.(kvInput), output.(kvOutput)
		name := [...]string{"create", "delete", "get"}[in.kind]
		return fmt.Sprintf("%s(%s, %s) -> %+v", name, in.key, in.token, out)
	},
}

// recorder collects the history of all clients.
type recorder struct {
	start time.Time
	mu    sync.Mutex
	ops   []porcupine.Operation
	// acked are the unique files whose create was acknowledged: none may be lost.
	acked []string
	count atomic.Int64
}

func (r *recorder) now() int64 { return int64(time.Since(r.start)) }

func (r *recorder) add(client int, in kvInput, call int64, out kvOutput) {
	ret := r.now()
	if out.unknown {
		// An operation whose outcome is unknown may take effect at any later time.
		ret = math.MaxInt64
	}
	r.mu.Lock()
	r.ops = append(r.ops, porcupine.Operation{ClientId: client, Input: in, Call: call, Output: out, Return: ret})
	r.mu.Unlock()
	r.count.Add(1)
}

// classify turns an Apply error into a history output.
func classify(err error) kvOutput {
	switch {
	case err == nil:
		return kvOutput{}
	case errors.Is(err, fsm.ErrAlreadyExists), errors.Is(err, fsm.ErrNotFound):
		return kvOutput{failed: true}
	default:
		return kvOutput{unknown: true}
	}
}

// runClient issues random operations on a few shared keys until stop closes, plus creates of
// unique files whose acknowledgement is remembered.
func runClient(ctx context.Context, c *mastertest.Cluster, r *recorder, id int, keys []string, stop <-chan struct{}) {
	rng := rand.New(rand.NewSource(int64(id)))
	for n := 0; ; n++ {
		select {
		case <-stop:
			return
		case <-ctx.Done():
			return
		default:
		}
		opCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if n%4 == 3 {
			p := fmt.Sprintf("/acked/c%d-%d", id, n)
			if _, err := c.Apply(opCtx, createCmd(p, "")); err == nil {
				r.mu.Lock()
				r.acked = append(r.acked, p)
				r.mu.Unlock()
			}
			cancel()
			continue
		}
		in := kvInput{kind: opKind(rng.Intn(3)), key: keys[rng.Intn(len(keys))], token: fmt.Sprintf("c%d-%d", id, n)}
		call := r.now()
		switch in.kind {
		case opCreate:
			_, err := c.Apply(opCtx, createCmd(in.key, in.token))
			r.add(id, in, call, classify(err))
		case opDelete:
			_, err := c.Apply(opCtx, deleteCmd(in.key))
			r.add(id, in, call, classify(err))
		case opGet:
			// A read that cannot be made linearizable is dropped: it has no effect to account for.
			if out, ok := linearizableGet(opCtx, c, in.key); ok {
				r.add(id, in, call, out)
			}
		}
		cancel()
	}
}

func linearizableGet(ctx context.Context, c *mastertest.Cluster, key string) (kvOutput, bool) {
	leader, err := c.Leader(ctx)
	if err != nil {
		return kvOutput{}, false
	}
	var out kvOutput
	err = leader.Store.Read(ctx, false, func(m *fsm.FSM) error {
		f, err := m.GetFile(key)
		switch {
		case errors.Is(err, fsm.ErrNotFound):
			return nil
		case err != nil:
			return err
		}
		out.value = f.ClientToken
		return nil
	})
	return out, err == nil
}

// waitOps waits until the clients completed n operations in all.
func waitOps(ctx context.Context, t *testing.T, r *recorder, n int64) {
	t.Helper()
	tick := time.NewTicker(5 * time.Millisecond)
	defer tick.Stop()
	for r.count.Load() < n {
		select {
		case <-ctx.Done():
			t.Fatalf("waiting for %d operations (at %d): %v", n, r.count.Load(), ctx.Err())
		case <-tick.C:
		}
	}
}

func TestLinearizableUnderFailures(t *testing.T) {
	for _, size := range []int{3, 5} {
		t.Run(fmt.Sprintf("%d nodes", size), func(t *testing.T) {
			testLinearizable(t, size)
		})
	}
}

func testLinearizable(t *testing.T, size int) {
	ctx := deadline(t, 90*time.Second)
	c := mastertest.New(t, size, mastertest.Options{})
	keys := []string{"/lin/a", "/lin/b", "/lin/c", "/lin/d"}
	r := &recorder{start: time.Now()}
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for id := 0; id < 4; id++ {
		wg.Add(1)
		go func(id int) {
			defer wg.Done()
			runClient(ctx, c, r, id, keys, stop)
		}(id)
	}
	stopped := false
	stopClients := func() {
		if !stopped {
			close(stop)
			wg.Wait()
			stopped = true
		}
	}
	defer stopClients()

	// The schedule advances with the work done, not with time. At every step a quorum stays
	// connected: three replicas lose one at a time, five lose two.
	const phase = 120
	waitOps(ctx, t, r, phase)
	first, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	c.Kill(first) // under concurrent writes
	killed := []*mastertest.Node{first}

	waitOps(ctx, t, r, 2*phase)
	if size < 5 {
		c.Restart(first)
		killed = nil
	}
	leader, err := c.Leader(ctx)
	if err != nil {
		t.Fatal(err)
	}
	cut := c.Followers(leader)[0]
	c.Partition(cut)

	waitOps(ctx, t, r, 3*phase)
	if size >= 5 {
		c.Restart(first)
		killed = nil
		second, err := c.LeaderExcept(ctx, cut)
		if err != nil {
			t.Fatal(err)
		}
		c.Kill(second)
		killed = append(killed, second)
		waitOps(ctx, t, r, 4*phase)
	}
	c.Heal(cut)
	for _, n := range killed {
		c.Restart(n)
	}
	waitOps(ctx, t, r, r.count.Load()+phase)
	stopClients()

	if err := c.WaitConverged(ctx); err != nil {
		t.Fatal(err)
	}
	// Final reads close the history, so that a lost write shows up as a violation.
	for _, k := range keys {
		in := kvInput{kind: opGet, key: k}
		call := r.now()
		out, ok := linearizableGet(ctx, c, k)
		if !ok {
			t.Fatalf("final read of %s failed", k)
		}
		r.add(99, in, call, out)
	}

	unknown := 0
	for _, op := range r.ops {
		if op.Output.(kvOutput).unknown {
			unknown++
		}
	}
	t.Logf("%d operations (%d with unknown outcome), %d acknowledged unique creates", len(r.ops), unknown, len(r.acked))
	res, info := porcupine.CheckOperationsVerbose(fileModel.ToModel(), r.ops, 60*time.Second)
	if res != porcupine.Ok {
		t.Errorf("the history is not linearizable (result %v)", res)
		for i, part := range info.PartialLinearizationsOperations() {
			if i < 2 {
				t.Logf("partial linearization %d: %v", i, part)
			}
		}
	}

	// No acknowledged write is lost, on any replica.
	for _, n := range c.Nodes {
		err := n.Store.Read(ctx, true, func(m *fsm.FSM) error {
			for _, p := range r.acked {
				if ok, err := m.Exists(p); err != nil || !ok {
					return fmt.Errorf("acknowledged create of %s is missing (%w)", p, err)
				}
			}
			return nil
		})
		if err != nil {
			t.Errorf("%s: %v", n.ID, err)
		}
	}
}

// TestModelCatchesLostWrites makes sure the checker would notice the failure this file hunts:
// an acknowledged create that a later read does not see.
func TestModelCatchesLostWrites(t *testing.T) {
	history := []porcupine.Operation{
		{ClientId: 0, Input: kvInput{kind: opCreate, key: "/k", token: "t1"}, Call: 0, Output: kvOutput{}, Return: 10},
		{ClientId: 1, Input: kvInput{kind: opGet, key: "/k"}, Call: 20, Output: kvOutput{value: ""}, Return: 30},
	}
	if res := porcupine.CheckOperations(fileModel.ToModel(), history); res {
		t.Error("a read missing an acknowledged create passed the check")
	}
	// With the create's outcome unknown, the same read is fine.
	history[0].Output, history[0].Return = kvOutput{unknown: true}, math.MaxInt64
	if res := porcupine.CheckOperations(fileModel.ToModel(), history); !res {
		t.Error("an unknown-outcome create that never happened failed the check")
	}
}

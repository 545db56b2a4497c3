package controllers

import (
	"sync"

	"k8s.io/apimachinery/pkg/types"
)

// uidMemo remembers one value per Dataset UID, for reconciles that run concurrently: what a
// reconcile learnt at some cost (a listing, the workers' answers) that the next may reuse.
type uidMemo[T any] struct {
	mu   sync.Mutex
	last map[types.UID]T
}

func (m *uidMemo[T]) load(uid types.UID) (T, bool) {
	m.mu.Lock()
	defer m.mu.Unlock()
	v, ok := m.last[uid]
	return v, ok
}

func (m *uidMemo[T]) put(uid types.UID, v T) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if m.last == nil {
		m.last = map[types.UID]T{}
	}
	m.last[uid] = v
}

// update changes the value of uid in place, if there is one.
func (m *uidMemo[T]) update(uid types.UID, change func(*T)) {
	m.mu.Lock()
	defer m.mu.Unlock()
	if v, ok := m.last[uid]; ok {
		change(&v)
		m.last[uid] = v
	}
}

func (m *uidMemo[T]) forget(uid types.UID) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.last, uid)
}

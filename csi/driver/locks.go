package driver

import "sync"

// inFlight holds the operations under way, by key, so that a second call for the same thing
// is answered Aborted at once (the CO retries it) instead of racing the first.
type inFlight struct {
	mu   sync.Mutex
	keys map[string]struct{}
}

func newInFlight() *inFlight { return &inFlight{keys: map[string]struct{}{}} }

// TryAcquire takes key if no operation holds it and says whether it did.
func (l *inFlight) TryAcquire(key string) bool {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, busy := l.keys[key]; busy {
		return false
	}
	l.keys[key] = struct{}{}
	return true
}

// Release gives key back.
func (l *inFlight) Release(key string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	delete(l.keys, key)
}

// keyedMutex serialises the short critical sections of one key (a Dataset's uid) and lets
// different keys run in parallel. Entries are dropped when nobody holds or waits for them.
type keyedMutex struct {
	mu    sync.Mutex
	locks map[string]*keyedEntry
}

type keyedEntry struct {
	mu    sync.Mutex
	users int
}

func newKeyedMutex() *keyedMutex { return &keyedMutex{locks: map[string]*keyedEntry{}} }

// Lock locks key and returns the function that unlocks it.
func (k *keyedMutex) Lock(key string) (unlock func()) {
	k.mu.Lock()
	e := k.locks[key]
	if e == nil {
		e = &keyedEntry{}
		k.locks[key] = e
	}
	e.users++
	k.mu.Unlock()

	e.mu.Lock()
	return func() {
		e.mu.Unlock()
		k.mu.Lock()
		if e.users--; e.users == 0 {
			delete(k.locks, key)
		}
		k.mu.Unlock()
	}
}

package store

import (
	"testing"
	"time"
)

func TestTheReadLease(t *testing.T) {
	start := time.Unix(1000, 0)
	const lease = 50 * time.Millisecond
	cases := []struct {
		name  string
		setup func(l *readLease)
		term  uint64
		at    time.Time
		valid bool
	}{
		{name: "none taken", setup: func(*readLease) {}, term: 1, at: start},
		{name: "within", setup: func(l *readLease) { l.extend(1, start, lease) }, term: 1, at: start.Add(lease - 1), valid: true},
		{name: "at its end", setup: func(l *readLease) { l.extend(1, start, lease) }, term: 1, at: start.Add(lease)},
		{name: "in a later term", setup: func(l *readLease) { l.extend(1, start, lease) }, term: 2, at: start},
		{name: "an older round does not shorten it", setup: func(l *readLease) {
			l.extend(1, start, lease)
			l.extend(1, start.Add(-lease), lease)
		}, term: 1, at: start.Add(lease - 1), valid: true},
		{name: "a round of a new term replaces it", setup: func(l *readLease) {
			l.extend(1, start.Add(time.Hour), lease)
			l.extend(2, start, lease)
		}, term: 2, at: start.Add(lease - 1), valid: true},
		{name: "revoked", setup: func(l *readLease) {
			l.extend(1, start, lease)
			l.revoke()
		}, term: 1, at: start},
		{name: "no round extends a revoked one", setup: func(l *readLease) {
			l.revoke()
			l.extend(1, start, lease)
		}, term: 1, at: start},
		{name: "reset after a revocation, then taken", setup: func(l *readLease) {
			l.revoke()
			l.reset()
			l.extend(1, start, lease)
		}, term: 1, at: start, valid: true},
		{name: "turned off", setup: func(l *readLease) { l.extend(1, start, -1) }, term: 1, at: start},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			var l readLease
			tc.setup(&l)
			if got := l.valid(tc.term, tc.at); got != tc.valid {
				t.Errorf("valid = %v, want %v", got, tc.valid)
			}
		})
	}
}

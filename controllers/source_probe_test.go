package controllers

import (
	"testing"
	"time"

	. "github.com/onsi/gomega"
)

func TestProbeMemoReusesAProbeOnlyForTheSameSpecAndSecret(t *testing.T) {
	at := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	sum := &sourceSummary{files: 2, bytes: 10, complete: true}
	cases := map[string]struct {
		generation int64
		secret     string
		now        time.Time
		reused     bool
	}{
		"the same spec and Secret, soon after":    {generation: 3, secret: "v1", now: at.Add(time.Minute), reused: true},
		"a changed spec is probed again":          {generation: 4, secret: "v1", now: at.Add(time.Minute)},
		"a changed Secret is probed again":        {generation: 3, secret: "v2", now: at.Add(time.Minute)},
		"a probe older than probeReuse is redone": {generation: 3, secret: "v1", now: at.Add(probeReuse + time.Second)},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			var m probeMemo
			m.put("uid", probeRecord{generation: 3, secretVersion: "v1", at: at, summary: sum})
			got, ok := m.get("uid", tc.generation, tc.secret, tc.now)
			g.Expect(ok).To(Equal(tc.reused))
			if tc.reused {
				g.Expect(got).To(Equal(sum))
			}
		})
	}
	var m probeMemo
	m.put("uid", probeRecord{generation: 3, secretVersion: "v1", at: at, summary: sum})
	m.forget("uid")
	_, ok := m.get("uid", 3, "v1", at)
	NewWithT(t).Expect(ok).To(BeFalse(), "a deleted Dataset's probe is forgotten")
}

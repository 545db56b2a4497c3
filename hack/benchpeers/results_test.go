package main

import (
	"strings"
	"testing"
)

func TestMedianOfRounds(t *testing.T) {
	for _, tc := range []struct {
		name   string
		values []float64
		want   float64
	}{
		{"one round", []float64{5}, 5},
		{"odd rounds, unsorted", []float64{9, 1, 5}, 5},
		{"even rounds: the mean of the middle two", []float64{4, 1, 10, 2}, 3},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := newResults()
			for _, v := range tc.values {
				r.values["hot-seq"] = appendMeasure(r.values["hot-seq"], "strata", measure{value: v, unit: "MB/s"})
			}
			got, ok := r.median("hot-seq", "strata")
			if !ok || got.value != tc.want {
				t.Fatalf("median of %v = %v (%v), want %v", tc.values, got.value, ok, tc.want)
			}
		})
	}
	if _, ok := newResults().median("hot-seq", "rclone"); ok {
		t.Fatal("a system never measured has a median")
	}
}

func appendMeasure(bySystem map[string][]measure, system string, m measure) map[string][]measure {
	if bySystem == nil {
		bySystem = map[string][]measure{}
	}
	bySystem[system] = append(bySystem[system], m)
	return bySystem
}

// Each workload is summed up against its baseline, a line per other system measured, and a
// workload whose baseline was not measured has no line.
func TestSummaryComparesWithTheBaseline(t *testing.T) {
	r := newResults()
	set := func(workload, system string, v float64) {
		r.values[workload] = appendMeasure(r.values[workload], system, measure{value: v, unit: "MB/s"})
	}
	set("cold-seq", "minio", 400)
	set("cold-seq", "strata", 300)
	set("cold-seq", "rclone", 200)
	set("hot-seq", "strata", 900) // no tmpfs figure: no line

	lines := []string{}
	for line := range strings.Lines(r.table()) {
		if strings.HasPrefix(line, "workload=") {
			lines = append(lines, strings.TrimSpace(line))
		}
	}
	want := []string{
		"workload=cold-seq strata=300.0 minio=400.0 ratio=0.75",
		"workload=cold-seq rclone=200.0 minio=400.0 ratio=0.50",
	}
	if strings.Join(lines, "\n") != strings.Join(want, "\n") {
		t.Fatalf("summary:\n%s\nwant:\n%s", strings.Join(lines, "\n"), strings.Join(want, "\n"))
	}
}

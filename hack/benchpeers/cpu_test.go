package main

import (
	"strings"
	"testing"
)

func TestParseProcStat(t *testing.T) {
	for _, tc := range []struct {
		name, text string
		want       cpuTimes
		wantErr    string
	}{
		{
			name: "idle and iowait are not busy; guest is in user already",
			text: "cpu  100 5 50 800 40 3 2 1 7 0\ncpu0 50 2 25 400 20 1 1 0 3 0\ncpu1 50 3 25 400 20 2 1 1 4 0\nintr 1 2 3\n",
			want: cpuTimes{busy: 100 + 5 + 50 + 3 + 2 + 1, total: 1001, cpus: 2},
		},
		{name: "no cpu line", text: "cpu0 1 2 3 4 5 6 7 8\n", wantErr: "no cpu line"},
		{name: "a short cpu line", text: "cpu 1 2 3\n", wantErr: "4 fields"},
		{name: "not a number", text: "cpu 1 2 x 4 5 6 7 8\n", wantErr: "field 3"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parseProcStat(tc.text)
			if tc.wantErr != "" {
				if err == nil || !strings.Contains(err.Error(), tc.wantErr) {
					t.Fatalf("error %v, want one saying %q", err, tc.wantErr)
				}
				return
			}
			if err != nil || got != tc.want {
				t.Fatalf("got %+v, %v; want %+v", got, err, tc.want)
			}
		})
	}
}

func TestParsePidStat(t *testing.T) {
	// Fields 14 and 15 (utime, stime) are 1234 and 567 in each.
	tail := " S 1 2 3 4 5 6 7 8 9 10 1234 567 0 0 20 0 12 0 99 1000 50"
	for _, tc := range []struct {
		name, text string
		want       uint64
		wantErr    bool
	}{
		{name: "a plain name", text: "4242 (worker)" + tail, want: 1801},
		{name: "a name with spaces and parentheses", text: "4242 (a (b) c)" + tail, want: 1801},
		{name: "no name", text: "4242 worker" + tail, wantErr: true},
		{name: "cut short", text: "4242 (worker) S 1 2 3", wantErr: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got, err := parsePidStat(tc.text)
			if (err != nil) != tc.wantErr || got != tc.want {
				t.Fatalf("got %d, %v; want %d (an error: %v)", got, err, tc.want, tc.wantErr)
			}
		})
	}
}

// The cores busy between two samples: the ticks of all CPUs over their number are the
// interval's length, and a process's ticks over it are the cores it kept busy.
func TestCoresBusyBetweenTwoSamples(t *testing.T) {
	a := cpuSample{host: cpuTimes{busy: 1000, total: 5000, cpus: 2}, procs: map[string]uint64{"reader": 100, "strata worker": 300, "gone": 5}}
	b := cpuSample{host: cpuTimes{busy: 1380, total: 5400, cpus: 2}, procs: map[string]uint64{"reader": 150, "strata worker": 420, "new": 40}}
	got := cpuBetween(a, b) // 200 ticks long: 380 busy of 400
	if got.Host != 1.9 {
		t.Errorf("host %v cores, want 1.9", got.Host)
	}
	want := map[string]float64{"reader": 0.25, "strata worker": 0.6}
	if len(got.Procs) != len(want) || got.Procs["reader"] != 0.25 || got.Procs["strata worker"] != 0.6 {
		t.Errorf("processes %v, want %v (a process in one sample only is not counted)", got.Procs, want)
	}
	if s := got.String(); s != "host=1.90 strata-worker=0.60 reader=0.25" {
		t.Errorf("printed %q", s)
	}
	if got := cpuBetween(a, a); got.Host != 0 || len(got.Procs) != 0 {
		t.Errorf("no time between the samples: %+v", got)
	}
}

func TestCPUMedianOfRounds(t *testing.T) {
	r := newResults()
	for _, use := range []cpuUse{
		{Host: 1.9, Procs: map[string]float64{"reader": 0.5, "minio": 0.4}},
		{Host: 1.5, Procs: map[string]float64{"reader": 0.7}},
		{Host: 2.0, Procs: map[string]float64{"reader": 0.6, "minio": 0.2, "strata master": 0.01}},
	} {
		r.values["cold-seq"] = appendMeasure(r.values["cold-seq"], "strata", measure{value: 1, unit: "MB/s", cpu: use})
	}
	got, ok := r.cpuMedian("cold-seq", "strata")
	if !ok || got.String() != "host=1.90 reader=0.60 minio=0.20" {
		t.Fatalf("median %v (%v), want host=1.90 reader=0.60 minio=0.20 (a round without minio counts as 0, and a process "+
			"busy in one round of three is not listed)", got, ok)
	}
}

// The host this runs on (Linux: the benchmark needs FUSE) has a /proc/stat this parses, and the
// benchmark's own process is seen.
func TestSampleThisHost(t *testing.T) {
	s, err := sampleCPU()
	if err != nil {
		t.Fatal(err)
	}
	if s.host.total == 0 || s.host.cpus == 0 {
		t.Errorf("host sample %+v", s.host)
	}
	if _, ok := s.procs["reader"]; !ok {
		t.Errorf("the benchmark's own process was not sampled: %v", s.procs)
	}
}

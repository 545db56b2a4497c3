package main

import (
	"fmt"
	"os"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
)

// What bounds a figure on a host of two cores is often the CPU itself: the reader, the FUSE
// server, the store and the kernel's copies share it. Each measure therefore also says how
// busy the host's CPUs were meanwhile (from /proc/stat, which counts the kernel's work too:
// interrupts, page copies on behalf of any process) and how much of it each process of the
// benchmark took (from /proc/<pid>/stat), in cores: 2.0 on this host is every core busy.

// cpuTimes is what /proc/stat says the host's CPUs did since boot, in clock ticks of all
// CPUs together.
type cpuTimes struct {
	busy, total uint64
	cpus        int
}

// parseProcStat reads the aggregate "cpu" line of /proc/stat: user, nice, system, idle,
// iowait, irq, softirq, steal (guest time is counted in user already). Idle and iowait are
// not busy.
func parseProcStat(text string) (cpuTimes, error) {
	var t cpuTimes
	found := false
	for line := range strings.Lines(text) {
		fields := strings.Fields(line)
		switch {
		case len(fields) == 0:
		case fields[0] == "cpu":
			if len(fields) < 9 {
				return cpuTimes{}, fmt.Errorf("/proc/stat: a cpu line of %d fields: %q", len(fields), line)
			}
			for i, f := range fields[1:9] {
				v, err := strconv.ParseUint(f, 10, 64)
				if err != nil {
					return cpuTimes{}, fmt.Errorf("/proc/stat: field %d of the cpu line: %w", i+1, err)
				}
				t.total += v
				if i != 3 && i != 4 { // idle, iowait
					t.busy += v
				}
			}
			found = true
		case strings.HasPrefix(fields[0], "cpu"):
			t.cpus++
		}
	}
	if !found {
		return cpuTimes{}, fmt.Errorf("/proc/stat has no cpu line")
	}
	return t, nil
}

// parsePidStat returns the user and system ticks of a process from its /proc/<pid>/stat: the
// 14th and 15th fields, counted after its name, which is in parentheses and may hold spaces
// and parentheses itself.
func parsePidStat(text string) (uint64, error) {
	end := strings.LastIndexByte(text, ')')
	if end < 0 {
		return 0, fmt.Errorf("/proc/<pid>/stat without a name: %q", text)
	}
	fields := strings.Fields(text[end+1:]) // from the 3rd field, the state
	if len(fields) < 13 {
		return 0, fmt.Errorf("/proc/<pid>/stat: %d fields after the name", len(fields))
	}
	var ticks uint64
	for _, f := range fields[11:13] { // utime, stime
		v, err := strconv.ParseUint(f, 10, 64)
		if err != nil {
			return 0, fmt.Errorf("/proc/<pid>/stat: %w", err)
		}
		ticks += v
	}
	return ticks, nil
}

// cpuUse is how many cores were busy during a measure: the whole host's, and each process's.
type cpuUse struct {
	Host  float64            `json:"host"`
	Procs map[string]float64 `json:"processes"`
}

// watched are the processes whose CPU is accounted, by name: the benchmark itself (the
// reader) and every process it started, while they run.
var watched = struct {
	mu   sync.Mutex
	pids map[string]int
}{pids: map[string]int{"reader": os.Getpid()}}

func watch(name string, pid int) {
	watched.mu.Lock()
	defer watched.mu.Unlock()
	watched.pids[name] = pid
}

func unwatch(name string) {
	watched.mu.Lock()
	defer watched.mu.Unlock()
	delete(watched.pids, name)
}

// minCores is the least a process must have taken to be listed: less is a tick or none.
const minCores = 0.005

// cpuSample is the host's and the watched processes' ticks at one moment.
type cpuSample struct {
	host  cpuTimes
	procs map[string]uint64
}

func sampleCPU() (cpuSample, error) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return cpuSample{}, err
	}
	host, err := parseProcStat(string(b))
	if err != nil {
		return cpuSample{}, err
	}
	s := cpuSample{host: host, procs: map[string]uint64{}}
	watched.mu.Lock()
	defer watched.mu.Unlock()
	for name, pid := range watched.pids {
		b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
		if err != nil {
			continue // gone meanwhile: not part of this measure
		}
		if ticks, err := parsePidStat(string(b)); err == nil {
			s.procs[name] = ticks
		}
	}
	return s, nil
}

// cpuBetween is the cores busy from a to b. A tick of /proc/stat is one CPU's, so the ticks
// of all CPUs in the interval, divided by their number, are its length in ticks.
func cpuBetween(a, b cpuSample) cpuUse {
	cpus := b.host.cpus
	if cpus == 0 {
		cpus = runtime.NumCPU()
	}
	elapsed := float64(b.host.total-a.host.total) / float64(cpus)
	if elapsed <= 0 {
		return cpuUse{}
	}
	use := cpuUse{Host: float64(b.host.busy-a.host.busy) / elapsed, Procs: map[string]float64{}}
	for name, after := range b.procs {
		if before, ok := a.procs[name]; ok && after >= before {
			if cores := float64(after-before) / elapsed; cores >= minCores {
				use.Procs[name] = cores
			}
		}
	}
	return use
}

// metered runs a workload and adds to its measure the CPU it kept busy.
func metered(run func() (measure, error)) (measure, error) {
	before, err := sampleCPU()
	if err != nil {
		return measure{}, fmt.Errorf("reading the CPU's times: %w", err)
	}
	m, err := run()
	if err != nil {
		return m, err
	}
	after, err := sampleCPU()
	if err != nil {
		return measure{}, fmt.Errorf("reading the CPU's times: %w", err)
	}
	m.cpu = cpuBetween(before, after)
	return m, nil
}

// String is the host's cores, then each process's that took any, the busiest first: "host=1.98 reader=0.61 …".
func (u cpuUse) String() string {
	names := make([]string, 0, len(u.Procs))
	for name, cores := range u.Procs {
		if cores >= minCores {
			names = append(names, name)
		}
	}
	slices.SortFunc(names, func(a, b string) int {
		if u.Procs[a] != u.Procs[b] {
			if u.Procs[a] > u.Procs[b] {
				return -1
			}
			return 1
		}
		return strings.Compare(a, b)
	})
	var w strings.Builder
	fmt.Fprintf(&w, "host=%.2f", u.Host)
	for _, name := range names {
		fmt.Fprintf(&w, " %s=%.2f", strings.ReplaceAll(name, " ", "-"), u.Procs[name])
	}
	return w.String()
}

// Package callerpod says which pod, and which of its containers, a process belongs to, from the
// cgroup the kubelet put it in. The output file system uses it to tell the attempts of a
// Lineage's step apart: a pod killed mid-write and the pod its Job retries it with write the same
// paths, and only the files of the one that succeeds may become the output.
//
// The worker sees the processes of every pod of its node only when it shares the node's PID
// namespace (hostPID): the kernel gives a FUSE server the caller's PID in the namespace of the
// process that mounted, and 0 for a caller outside it.
package callerpod

import (
	"bufio"
	"bytes"
	"fmt"
	"os"
	"path"
	"regexp"
	"strings"
)

// Caller is the pod and container a process runs in.
type Caller struct {
	// PodUID is the pod's UID, as its API object has it.
	PodUID string
	// Container is the ID of the container, as the container runtime names it.
	Container string
}

// podSegment matches the cgroup folder of a pod: "pod<uid>" with the cgroupfs driver,
// "kubepods-<qos>-pod<uid with underscores>.slice" with the systemd one.
var podSegment = regexp.MustCompile(`pod([0-9a-f]{8}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{4}[-_][0-9a-f]{12})(\.slice)?$`)

// runtimePrefixes are what container runtimes put before a container's ID in its systemd scope.
var runtimePrefixes = []string{"cri-containerd-", "crio-", "docker-", "containerd-"}

// Parse reads a /proc/<pid>/cgroup file. ok is false for a process that is not in a pod's
// container: on the node itself, or in a pod's own cgroup folder (its sandbox).
func Parse(cgroupFile []byte) (c Caller, ok bool) {
	sc := bufio.NewScanner(bytes.NewReader(cgroupFile))
	for sc.Scan() {
		// hierarchy-ID:controllers:path; cgroup v2 has one line, "0::<path>". With v1, any
		// hierarchy shows the pod and container.
		parts := strings.SplitN(sc.Text(), ":", 3)
		if len(parts) != 3 {
			continue
		}
		if c, ok := fromPath(parts[2]); ok {
			return c, true
		}
	}
	return Caller{}, false
}

// fromPath finds the pod and container in a cgroup path: the container's folder sits in the pod's.
func fromPath(p string) (Caller, bool) {
	container := path.Base(p)
	m := podSegment.FindStringSubmatch(path.Dir(p))
	if m == nil || container == "" || container == "." || container == "/" {
		return Caller{}, false
	}
	container = strings.TrimSuffix(container, ".scope")
	for _, prefix := range runtimePrefixes {
		container = strings.TrimPrefix(container, prefix)
	}
	return Caller{PodUID: strings.ReplaceAll(m[1], "_", "-"), Container: container}, true
}

// Of is the pod and container of process pid (of the caller's PID namespace); ok is false for
// PID 0 (a caller the mount's PID namespace cannot see), a process gone, or one in no pod.
func Of(pid uint32) (c Caller, ok bool, err error) {
	if pid == 0 {
		return Caller{}, false, nil
	}
	data, err := os.ReadFile(fmt.Sprintf("/proc/%d/cgroup", pid))
	if err != nil {
		if os.IsNotExist(err) {
			return Caller{}, false, nil
		}
		return Caller{}, false, fmt.Errorf("reading the cgroup of process %d: %w", pid, err)
	}
	c, ok = Parse(data)
	return c, ok, nil
}

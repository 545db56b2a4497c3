package callerpod

import (
	"os"
	"testing"
)

func TestParse(t *testing.T) {
	const uid = "3f1e1c1a-6b7d-4c2e-9f3a-0a1b2c3d4e5f"
	tests := map[string]struct {
		file string
		want Caller
		ok   bool
	}{
		"cgroup v2, systemd driver, containerd": {
			file: "0::/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod3f1e1c1a_6b7d_4c2e_9f3a_0a1b2c3d4e5f.slice/cri-containerd-4a5b6c.scope\n",
			want: Caller{PodUID: uid, Container: "4a5b6c"}, ok: true,
		},
		"cgroup v2, cgroupfs driver": {
			file: "0::/kubepods/burstable/pod3f1e1c1a-6b7d-4c2e-9f3a-0a1b2c3d4e5f/4a5b6c\n",
			want: Caller{PodUID: uid, Container: "4a5b6c"}, ok: true,
		},
		"guaranteed pods sit right under kubepods": {
			file: "0::/kubepods.slice/kubepods-pod3f1e1c1a_6b7d_4c2e_9f3a_0a1b2c3d4e5f.slice/crio-77.scope\n",
			want: Caller{PodUID: uid, Container: "77"}, ok: true,
		},
		"cgroup v1 lines": {
			file: "12:pids:/kubepods/besteffort/pod3f1e1c1a-6b7d-4c2e-9f3a-0a1b2c3d4e5f/docker-99.scope\n1:name=systemd:/\n",
			want: Caller{PodUID: uid, Container: "99"}, ok: true,
		},
		"a process of the node":        {file: "0::/system.slice/containerd.service\n"},
		"the pod's own folder is none": {file: "0::/kubepods/besteffort/pod3f1e1c1a-6b7d-4c2e-9f3a-0a1b2c3d4e5f\n"},
		"empty":                        {file: ""},
		"not a UID":                    {file: "0::/kubepods/podxyz/abc\n"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, ok := Parse([]byte(tc.file))
			if got != tc.want || ok != tc.ok {
				t.Errorf("got %+v, %v; want %+v, %v", got, ok, tc.want, tc.ok)
			}
		})
	}
}

func TestOfAProcessOutsideAnyPod(t *testing.T) {
	if _, ok, err := Of(0); ok || err != nil {
		t.Errorf("PID 0: got %v, %v; want not in a pod", ok, err)
	}
	if _, ok, err := Of(uint32(os.Getpid())); err != nil {
		t.Errorf("this process: %v", err)
	} else if ok {
		t.Skip("the tests run in a pod")
	}
}

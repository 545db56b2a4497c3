package controllers

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
)

func TestNeverStarted(t *testing.T) {
	waiting := func(name, reason string) corev1.ContainerStatus {
		return corev1.ContainerStatus{Name: name, State: corev1.ContainerState{Waiting: &corev1.ContainerStateWaiting{Reason: reason}}}
	}
	running := corev1.ContainerStatus{Name: "master", State: corev1.ContainerState{Running: &corev1.ContainerStateRunning{}}}
	done := corev1.ContainerStatus{Name: "init", State: corev1.ContainerState{Terminated: &corev1.ContainerStateTerminated{ExitCode: 0}}}
	for _, tc := range []struct {
		name    string
		status  corev1.PodStatus
		stalled bool
		why     string
	}{
		{name: "just created: nothing reported yet", status: corev1.PodStatus{Phase: corev1.PodPending}},
		{name: "not scheduled", status: corev1.PodStatus{Phase: corev1.PodPending, Conditions: []corev1.PodCondition{
			{Type: corev1.PodScheduled, Status: corev1.ConditionFalse, Message: "0/3 nodes are available"}}},
			stalled: true, why: "not scheduled: 0/3 nodes are available"},
		{name: "its image cannot be pulled", status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{waiting("master", "ImagePullBackOff")}},
			stalled: true, why: "master: ImagePullBackOff"},
		{name: "an init container crashes", status: corev1.PodStatus{
			InitContainerStatuses: []corev1.ContainerStatus{waiting("init", "CrashLoopBackOff")},
			ContainerStatuses:     []corev1.ContainerStatus{waiting("master", "PodInitializing")}},
			stalled: true, why: "init: CrashLoopBackOff"},
		{name: "its init container done, the master crashes", status: corev1.PodStatus{
			InitContainerStatuses: []corev1.ContainerStatus{done},
			ContainerStatuses:     []corev1.ContainerStatus{waiting("master", "CrashLoopBackOff")}},
			stalled: true, why: "master: CrashLoopBackOff"},
		{name: "being created", status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{waiting("master", "ContainerCreating")}}},
		{name: "running, not ready: catching up", status: corev1.PodStatus{ContainerStatuses: []corev1.ContainerStatus{running}}},
		{name: "ready, whatever its containers say", status: corev1.PodStatus{
			Conditions:        []corev1.PodCondition{{Type: corev1.PodReady, Status: corev1.ConditionTrue}},
			ContainerStatuses: []corev1.ContainerStatus{waiting("master", "CrashLoopBackOff")}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			why, stalled := neverStarted(&corev1.Pod{Status: tc.status})
			if stalled != tc.stalled || why != tc.why {
				t.Errorf("neverStarted = %q, %v; want %q, %v", why, stalled, tc.why, tc.stalled)
			}
		})
	}
}

// Package cluster decides, when a master replica starts, whether it resumes, joins a running
// cluster or bootstraps a new one. Every pod of the StatefulSet runs the same command; the
// ordinal in the pod name tells the one allowed to bootstrap.
package cluster

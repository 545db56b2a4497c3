// Command pause is the sandbox process of every pod in the project's offline Kind clusters,
// standing in for registry.k8s.io/pause, which cannot be pulled here. Like the original it holds
// the pod's namespaces open, reaps the zombies of processes that share its PID namespace, and
// exits on SIGINT or SIGTERM.
package main

import (
	"os"
	"os/signal"
	"syscall"
)

func main() {
	signals := make(chan os.Signal, 8)
	signal.Notify(signals, syscall.SIGINT, syscall.SIGTERM, syscall.SIGCHLD)
	for sig := range signals {
		if sig != syscall.SIGCHLD {
			os.Exit(0)
		}
		reapChildren()
	}
}

// reapChildren waits for every child that has exited, without blocking on live ones.
func reapChildren() {
	for {
		var status syscall.WaitStatus
		pid, err := syscall.Wait4(-1, &status, syscall.WNOHANG, nil)
		if pid <= 0 || err != nil {
			return
		}
	}
}

// Package daemon is what every long-running Strata binary does around its own work: a JSON
// logger at the chosen verbosity, a context that SIGINT and SIGTERM cancel, and exit status 1
// with the error logged when the work fails.
package daemon

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/go-logr/logr"
	"github.com/go-logr/zapr"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Main runs work until it returns or a signal cancels its context, then exits the process:
// 0 on success, 1 on error. verbosity is 0 for info, 1 for debug, 2 for trace.
func Main(name string, verbosity int, work func(ctx context.Context, log logr.Logger) error) {
	config := zap.NewProductionConfig()
	config.Level = zap.NewAtomicLevelAt(zapcore.Level(-verbosity))
	zl, err := config.Build()
	if err != nil {
		_, _ = fmt.Fprintf(os.Stderr, "%s: building logger: %v\n", name, err)
		os.Exit(1)
	}
	log := zapr.NewLogger(zl).WithName(name)

	ctx, stop := signal.NotifyContext(context.Background(), syscall.SIGINT, syscall.SIGTERM)
	err = work(ctx, log)
	stop()
	if err != nil {
		log.Error(err, name+" stopped")
	}
	_ = zl.Sync()
	if err != nil {
		os.Exit(1)
	}
}

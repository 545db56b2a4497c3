package logadapter

import (
	"fmt"
	"io"
	"log"
	"strings"
	"sync/atomic"

	"github.com/go-logr/logr"
	"github.com/hashicorp/go-hclog"
)

// HCLog is an hclog.Logger that writes to a logr.Logger. hclog's levels map to logr verbosity:
// Error goes to Error, Warn and Info to V(0), Debug to V(1) and Trace to V(2), so that the
// raft library's chatter shows only when the operator raises the verbosity.
type HCLog struct {
	log   logr.Logger
	name  string
	args  []interface{}
	level *atomic.Int32
}

var _ hclog.Logger = (*HCLog)(nil)

// NewHCLog returns an hclog.Logger writing to l at or above level.
func NewHCLog(l logr.Logger, level hclog.Level) *HCLog {
	lv := &atomic.Int32{}
	lv.Store(int32(level))
	return &HCLog{log: l, level: lv}
}

// Log implements hclog.Logger.
func (h *HCLog) Log(level hclog.Level, msg string, args ...interface{}) {
	if level == hclog.Off || level < hclog.Level(h.level.Load()) {
		return
	}
	kv := append(append([]interface{}{}, h.args...), args...)
	kv = sanitize(kv)
	switch {
	case level >= hclog.Error:
		h.log.Error(nil, msg, kv...)
	case level >= hclog.Info:
		if level == hclog.Warn {
			kv = append(kv, "level", "warn")
		}
		h.log.Info(msg, kv...)
	case level == hclog.Debug:
		h.log.V(1).Info(msg, kv...)
	default:
		h.log.V(2).Info(msg, kv...)
	}
}

// sanitize turns hclog's odd-length argument lists (a lone value means "extra") into key-value
// pairs and renders values that logr sinks could not serialize, such as hclog.Format.
func sanitize(kv []interface{}) []interface{} {
	if len(kv)%2 == 1 {
		kv = append(kv[:len(kv)-1:len(kv)-1], "extra", kv[len(kv)-1])
	}
	for i := 1; i < len(kv); i += 2 {
		switch v := kv[i].(type) {
		case hclog.Format:
			if len(v) > 0 {
				if f, ok := v[0].(string); ok {
					kv[i] = fmt.Sprintf(f, v[1:]...)
				}
			}
		case error:
			kv[i] = v.Error()
		}
	}
	return kv
}

// Trace implements hclog.Logger.
func (h *HCLog) Trace(msg string, args ...interface{}) { h.Log(hclog.Trace, msg, args...) }

// Debug implements hclog.Logger.
func (h *HCLog) Debug(msg string, args ...interface{}) { h.Log(hclog.Debug, msg, args...) }

// Info implements hclog.Logger.
func (h *HCLog) Info(msg string, args ...interface{}) { h.Log(hclog.Info, msg, args...) }

// Warn implements hclog.Logger.
func (h *HCLog) Warn(msg string, args ...interface{}) { h.Log(hclog.Warn, msg, args...) }

// Error implements hclog.Logger.
func (h *HCLog) Error(msg string, args ...interface{}) { h.Log(hclog.Error, msg, args...) }

// IsTrace implements hclog.Logger.
func (h *HCLog) IsTrace() bool { return hclog.Level(h.level.Load()) <= hclog.Trace }

// IsDebug implements hclog.Logger.
func (h *HCLog) IsDebug() bool { return hclog.Level(h.level.Load()) <= hclog.Debug }

// IsInfo implements hclog.Logger.
func (h *HCLog) IsInfo() bool { return hclog.Level(h.level.Load()) <= hclog.Info }

// IsWarn implements hclog.Logger.
func (h *HCLog) IsWarn() bool { return hclog.Level(h.level.Load()) <= hclog.Warn }

// IsError implements hclog.Logger.
func (h *HCLog) IsError() bool { return hclog.Level(h.level.Load()) <= hclog.Error }

// ImpliedArgs implements hclog.Logger.
func (h *HCLog) ImpliedArgs() []interface{} { return h.args }

// With implements hclog.Logger.
func (h *HCLog) With(args ...interface{}) hclog.Logger {
	c := *h
	c.args = append(append([]interface{}{}, h.args...), args...)
	return &c
}

// Name implements hclog.Logger.
func (h *HCLog) Name() string { return h.name }

// Named implements hclog.Logger.
func (h *HCLog) Named(name string) hclog.Logger {
	c := *h
	if c.name != "" {
		c.name += "." + name
	} else {
		c.name = name
	}
	c.log = h.log.WithName(name)
	return &c
}

// ResetNamed implements hclog.Logger. logr names only grow, so the reset keeps the logr
// logger's own name and replaces the part hclog added.
func (h *HCLog) ResetNamed(name string) hclog.Logger {
	c := *h
	c.name = name
	c.log = h.log.WithName(name)
	return &c
}

// SetLevel implements hclog.Logger.
func (h *HCLog) SetLevel(level hclog.Level) { h.level.Store(int32(level)) }

// GetLevel implements hclog.Logger.
func (h *HCLog) GetLevel() hclog.Level { return hclog.Level(h.level.Load()) }

// StandardLogger implements hclog.Logger.
func (h *HCLog) StandardLogger(opts *hclog.StandardLoggerOptions) *log.Logger {
	return log.New(h.StandardWriter(opts), "", 0)
}

// StandardWriter implements hclog.Logger.
func (h *HCLog) StandardWriter(*hclog.StandardLoggerOptions) io.Writer {
	return writerFunc(func(p []byte) (int, error) {
		h.Info(strings.TrimRight(string(p), "\n"))
		return len(p), nil
	})
}

type writerFunc func(p []byte) (int, error)

func (f writerFunc) Write(p []byte) (int, error) { return f(p) }

package logadapter

import (
	"fmt"
	"strings"

	"github.com/go-logr/logr"
)

// Badger is a badger.Logger that writes to a logr.Logger. Badger's Info messages (compaction,
// value-log replay) are routine, so they go to V(1); Debug goes to V(2).
type Badger struct {
	log logr.Logger
}

// NewBadger returns a badger.Logger writing to l.
func NewBadger(l logr.Logger) *Badger { return &Badger{log: l} }

// Errorf implements badger.Logger.
func (b *Badger) Errorf(f string, args ...interface{}) { b.log.Error(nil, msg(f, args)) }

// Warningf implements badger.Logger.
func (b *Badger) Warningf(f string, args ...interface{}) {
	b.log.Info(msg(f, args), "level", "warn")
}

// Infof implements badger.Logger.
func (b *Badger) Infof(f string, args ...interface{}) { b.log.V(1).Info(msg(f, args)) }

// Debugf implements badger.Logger.
func (b *Badger) Debugf(f string, args ...interface{}) { b.log.V(2).Info(msg(f, args)) }

func msg(f string, args []interface{}) string {
	return strings.TrimRight(fmt.Sprintf(f, args...), "\n")
}

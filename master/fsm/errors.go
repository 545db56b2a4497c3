package fsm

import (
	"errors"
	"fmt"
)

// Outcomes of a command that the caller acts on. They are deterministic: every replica reaches
// the same one for the same entry.
var (
	// ErrNotFound: the file, dataset, block or worker named by the command does not exist.
	ErrNotFound = errors.New("not found")
	// ErrAlreadyExists: the command would create something that exists.
	ErrAlreadyExists = errors.New("already exists")
	// ErrInvalid: the command's arguments are malformed.
	ErrInvalid = errors.New("invalid argument")
	// ErrFailedPrecondition: the state does not allow the command (a worker not alive, a dataset
	// root overlapping another, a file with too many blocks).
	ErrFailedPrecondition = errors.New("failed precondition")
)

// opError is a command's outcome: a kind the caller matches with errors.Is and a message for
// people.
type opError struct {
	kind error
	msg  string
}

func (e *opError) Error() string { return e.msg + ": " + e.kind.Error() }
func (e *opError) Unwrap() error { return e.kind }

func notFound(format string, args ...interface{}) error {
	return &opError{kind: ErrNotFound, msg: fmt.Sprintf(format, args...)}
}

func alreadyExists(format string, args ...interface{}) error {
	return &opError{kind: ErrAlreadyExists, msg: fmt.Sprintf(format, args...)}
}

func invalid(format string, args ...interface{}) error {
	return &opError{kind: ErrInvalid, msg: fmt.Sprintf(format, args...)}
}

func failedPrecondition(format string, args ...interface{}) error {
	return &opError{kind: ErrFailedPrecondition, msg: fmt.Sprintf(format, args...)}
}

// isOutcome tells a command's outcome from a storage failure.
func isOutcome(err error) bool {
	var oe *opError
	return errors.As(err, &oe)
}

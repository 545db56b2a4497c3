package server

import (
	"context"
	"errors"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/master/fsm"
	"github.com/strata-cache/strata/master/masterpb"
	"github.com/strata-cache/strata/master/store"
)

// toStatus maps store and state-machine errors to gRPC statuses.
func toStatus(err error) error {
	if err == nil {
		return nil
	}
	if _, ok := status.FromError(err); ok {
		return err
	}
	var nl *store.NotLeaderError
	switch {
	case errors.As(err, &nl) && nl.LeaderAPIAddr != "":
		return withInfo(codes.FailedPrecondition, err, masterpb.ReasonNotLeader, map[string]string{
			masterpb.MetadataLeaderAddr: nl.LeaderAPIAddr,
			masterpb.MetadataLeaderID:   nl.LeaderID,
		})
	case errors.As(err, &nl):
		return withInfo(codes.Unavailable, err, masterpb.ReasonNoLeader, nil)
	case errors.Is(err, store.ErrLeadershipLost):
		return withInfo(codes.Unavailable, err, masterpb.ReasonLeadershipLost, nil)
	case errors.Is(err, store.ErrShutdown):
		return status.Error(codes.Unavailable, err.Error())
	case errors.Is(err, store.ErrNotEmpty):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, store.ErrBadBackup):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, fsm.ErrNotFound):
		return status.Error(codes.NotFound, err.Error())
	case errors.Is(err, fsm.ErrAlreadyExists):
		return status.Error(codes.AlreadyExists, err.Error())
	case errors.Is(err, fsm.ErrInvalid):
		return status.Error(codes.InvalidArgument, err.Error())
	case errors.Is(err, fsm.ErrFailedPrecondition):
		return status.Error(codes.FailedPrecondition, err.Error())
	case errors.Is(err, context.DeadlineExceeded):
		return status.Error(codes.DeadlineExceeded, err.Error())
	case errors.Is(err, context.Canceled):
		return status.Error(codes.Canceled, err.Error())
	}
	return status.Error(codes.Internal, err.Error())
}

func withInfo(code codes.Code, err error, reason string, md map[string]string) error {
	st := status.New(code, err.Error())
	withDetails, derr := st.WithDetails(&errdetails.ErrorInfo{Reason: reason, Domain: masterpb.ErrorDomain, Metadata: md})
	if derr != nil {
		// Only a details message that cannot be marshalled fails here; the bare code still
		// tells the client to retry elsewhere.
		return st.Err()
	}
	return withDetails.Err()
}

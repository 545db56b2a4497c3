package masterpb

import (
	"context"

	"google.golang.org/genproto/googleapis/rpc/errdetails"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// How a master tells a client where to send a request. A status carries an ErrorInfo in
// ErrorDomain with one of these reasons; NOT_LEADER comes with the leader's gRPC address in
// the metadata key MetadataLeaderAddr.
const (
	ErrorDomain = "master.strata.dev"

	// ReasonNotLeader (FAILED_PRECONDITION): this server is a follower; retry at the leader.
	ReasonNotLeader = "NOT_LEADER"
	// ReasonNoLeader (UNAVAILABLE): no leader is known, an election is probably under way.
	// Nothing was proposed; retry after a pause.
	ReasonNoLeader = "NO_LEADER"
	// ReasonLeadershipLost (UNAVAILABLE): the write was proposed but the leader stepped down
	// before it committed. It may or may not be applied.
	ReasonLeadershipLost = "LEADERSHIP_LOST"

	MetadataLeaderAddr = "leader_addr"
	MetadataLeaderID   = "leader_id"
)

// RedirectInfo returns the master's ErrorInfo of a status error: its reason and, for
// NOT_LEADER, the leader's address. ok is false for other errors.
func RedirectInfo(err error) (reason, leaderAddr string, ok bool) {
	st, isStatus := status.FromError(err)
	if !isStatus {
		return "", "", false
	}
	for _, d := range st.Details() {
		if info, isInfo := d.(*errdetails.ErrorInfo); isInfo && info.Domain == ErrorDomain {
			return info.Reason, info.Metadata[MetadataLeaderAddr], true
		}
	}
	return "", "", false
}

// HeaderSuspectLeader is the request header in which a client names the leader's address that
// just failed it (it died, or did not answer in time): a follower that still names that leader
// waits until it learns another, which it then sends the client to, rather than sending the
// client back to the dead one.
const HeaderSuspectLeader = "strata-suspect-leader"

// WithSuspectLeader adds the header naming addr to a client's outgoing context.
func WithSuspectLeader(ctx context.Context, addr string) context.Context {
	return metadata.AppendToOutgoingContext(ctx, HeaderSuspectLeader, addr)
}

// SuspectLeader is the address a request's header names as a failed leader, or "".
func SuspectLeader(ctx context.Context) string {
	if v := metadata.ValueFromIncomingContext(ctx, HeaderSuspectLeader); len(v) > 0 {
		return v[0]
	}
	return ""
}

package masterpb

import (
	"google.golang.org/genproto/googleapis/rpc/errdetails"
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

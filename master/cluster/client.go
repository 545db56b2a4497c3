package cluster

import (
	"context"

	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
)

// ClientPeers reaches peers through a master client created with their addresses.
type ClientPeers struct {
	Client *client.Client
}

// Probe implements Peers.
func (p ClientPeers) Probe(ctx context.Context, addr string) (*masterpb.LeaderResponse, error) {
	return p.Client.Leader(ctx, addr)
}

// Join implements Peers.
func (p ClientPeers) Join(ctx context.Context, req *masterpb.JoinRequest) (uint64, error) {
	resp, err := p.Client.Join(ctx, req)
	return resp.GetAppliedIndex(), err
}

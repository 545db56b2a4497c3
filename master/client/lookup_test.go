package client

import (
	"context"
	"net"
	"strings"
	"testing"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/master/masterpb"
)

// olderMaster is a master of a version before Lookup: it answers GetFile and ListFiles about
// one file, /d/f, and Lookup with Unimplemented.
type olderMaster struct {
	masterpb.UnimplementedMasterServer
}

var olderMastersFile = &masterpb.File{Path: "/d/f", Size: 3, ClientToken: "t"}

func (olderMaster) GetFile(_ context.Context, req *masterpb.GetFileRequest) (*masterpb.File, error) {
	if req.GetPath() == olderMastersFile.GetPath() {
		return olderMastersFile, nil
	}
	return nil, status.Errorf(codes.NotFound, "file %s not found", req.GetPath())
}

func (olderMaster) ListFiles(_ context.Context, req *masterpb.ListFilesRequest) (*masterpb.ListFilesResponse, error) {
	if strings.HasPrefix(olderMastersFile.GetPath(), req.GetDir()+"/") {
		return &masterpb.ListFilesResponse{Entries: []*masterpb.ListEntry{{Path: olderMastersFile.GetPath(), File: olderMastersFile}}}, nil
	}
	return &masterpb.ListFilesResponse{}, nil
}

// TestLookupAsksAMasterOlderThanLookupTheWayItKnows: during a rolling upgrade that reached the
// workers first, a lookup still tells a file, a folder and nothing apart.
func TestLookupAsksAMasterOlderThanLookupTheWayItKnows(t *testing.T) {
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	s := grpc.NewServer()
	masterpb.RegisterMasterServer(s, olderMaster{})
	go func() { _ = s.Serve(lis) }()
	t.Cleanup(s.Stop)
	c, err := New([]string{lis.Addr().String()}, Options{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })

	tests := map[string]struct {
		path string
		want *masterpb.ListEntry
	}{
		"a file":   {path: "/d/f", want: &masterpb.ListEntry{Path: "/d/f", File: olderMastersFile}},
		"a folder": {path: "/d", want: &masterpb.ListEntry{Path: "/d", Dir: true}},
		"nothing":  {path: "/e"},
	}
	for name, tc := range tests {
		t.Run(name, func(t *testing.T) {
			got, err := c.Lookup(context.Background(), &masterpb.LookupRequest{Path: tc.path, StaleOk: true})
			if tc.want == nil {
				if status.Code(err) != codes.NotFound {
					t.Fatalf("Lookup(%s) = %v, %v; want NotFound", tc.path, got, err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if !proto.Equal(got, tc.want) {
				t.Errorf("Lookup(%s) = %v, want %v", tc.path, got, tc.want)
			}
		})
	}
}

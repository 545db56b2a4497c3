package mounter

import (
	"context"
	"fmt"
	"io"
	"maps"
	"strings"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/proto"

	"github.com/strata-cache/strata/cacheworker/understore"
	"github.com/strata-cache/strata/cacheworker/workerpb"
)

// sourceMounts are the stores req reads, each at its folder of the tree: its mounts, or its
// single source at the root (path "").
func sourceMounts(req *workerpb.MountDatasetRequest) []*workerpb.SourceMount {
	if len(req.GetMounts()) > 0 {
		return req.GetMounts()
	}
	if req.GetSource() == nil {
		return nil
	}
	return []*workerpb.SourceMount{{Source: req.GetSource()}}
}

// validSources checks the stores an input Dataset's request names: a source or mounts, not
// both, each with a URI, the mounts in a layout that hides no object (CheckMountLayout).
func validSources(req *workerpb.MountDatasetRequest) error {
	dataset := req.GetNamespace() + "/" + req.GetName()
	if req.GetSource() != nil && len(req.GetMounts()) > 0 {
		return status.Errorf(codes.InvalidArgument, "Dataset %s names a source and mounts: it reads one or the other", dataset)
	}
	if len(req.GetMounts()) == 0 {
		return nil
	}
	paths := make([]string, len(req.GetMounts()))
	for i, m := range req.GetMounts() {
		if m.GetSource().GetUri() == "" {
			return status.Errorf(codes.InvalidArgument, "Dataset %s: the mount at /%s has no source URI", dataset, m.GetPath())
		}
		paths[i] = m.GetPath()
	}
	if err := understore.CheckMountLayout(paths); err != nil {
		return status.Errorf(codes.InvalidArgument, "Dataset %s: %v", dataset, err)
	}
	return nil
}

// describeSources names the stores of req without their credentials, for messages.
func describeSources(req *workerpb.MountDatasetRequest) string {
	var parts []string
	for _, m := range sourceMounts(req) {
		src := m.GetSource()
		s := src.GetUri()
		if src.GetEndpoint() != "" {
			s += " at " + src.GetEndpoint()
		}
		if src.GetRegion() != "" {
			s += " in " + src.GetRegion()
		}
		if len(req.GetMounts()) > 0 {
			s = "/" + m.GetPath() + "=" + s
		}
		parts = append(parts, s)
	}
	if len(parts) == 0 {
		return "no source"
	}
	return strings.Join(parts, ", ")
}

// sameSources says whether a and b read the same stores at the same folders, whatever their
// credentials.
func sameSources(a, b *workerpb.MountDatasetRequest) bool {
	ma, mb := sourceMounts(a), sourceMounts(b)
	if len(ma) != len(mb) || (a.GetSource() == nil) != (b.GetSource() == nil) {
		return false
	}
	for i := range ma {
		x, y := withoutCredentials(ma[i]), withoutCredentials(mb[i])
		if !proto.Equal(x, y) {
			return false
		}
	}
	return true
}

func withoutCredentials(m *workerpb.SourceMount) *workerpb.SourceMount {
	c := proto.Clone(m).(*workerpb.SourceMount)
	if c.Source != nil {
		c.Source.Credentials = nil
	}
	return c
}

// sameCredentials says whether a and b, which read the same stores, read them with the same
// credentials.
func sameCredentials(a, b *workerpb.MountDatasetRequest) bool {
	ma, mb := sourceMounts(a), sourceMounts(b)
	for i := range ma {
		if !maps.Equal(ma[i].GetSource().GetCredentials(), mb[i].GetSource().GetCredentials()) {
			return false
		}
	}
	return true
}

// openSources opens the stores req reads: its source, or the Union of its mounts. On failure
// it closes what it opened.
func (m *Mounter) openSources(ctx context.Context, req *workerpb.MountDatasetRequest) (understore.Store, error) {
	if len(req.GetMounts()) == 0 {
		return m.openSource(ctx, req.GetSource())
	}
	var opened []understore.Mounted
	closeOpened := func() {
		for _, o := range opened {
			m.closeStore(o.Store)
		}
	}
	for _, sm := range req.GetMounts() {
		s, err := m.openSource(ctx, sm.GetSource())
		if err != nil {
			closeOpened()
			return nil, &understore.MountError{Path: sm.GetPath(), Err: err}
		}
		opened = append(opened, understore.Mounted{Path: sm.GetPath(), Store: s})
	}
	u, err := understore.NewUnion(opened)
	if err != nil {
		closeOpened()
		return nil, fmt.Errorf("%w: %w", understore.ErrInvalidPath, err)
	}
	return u, nil
}

// closeStore closes a store that holds resources (a file:// one) and that nothing uses.
func (m *Mounter) closeStore(s understore.Store) {
	if c, ok := s.(io.Closer); ok {
		if err := c.Close(); err != nil {
			m.log.Error(err, "closing an under-store", "store", s.String())
		}
	}
}

// openSource opens one store as src names it.
func (m *Mounter) openSource(ctx context.Context, src *workerpb.DatasetSource) (understore.Store, error) {
	return understore.Open(ctx, understore.Source{
		URI: src.GetUri(), Endpoint: src.GetEndpoint(), Region: src.GetRegion(),
		Credentials: src.GetCredentials(), FileRoots: m.cfg.FileRoots, ClaimServerTLS: m.cfg.ClaimServerTLS,
	})
}

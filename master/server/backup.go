package server

import (
	"errors"
	"io"

	"github.com/strata-cache/strata/master/masterpb"
)

// backupChunk is the data of one message of a backup or a restore: well under the message size
// limits of both ends.
const backupChunk = 1 << 20

// Backup streams a backup of the whole state (store.Backup): a header, then the snapshot.
func (s *Server) Backup(_ *masterpb.BackupRequest, stream masterpb.Master_BackupServer) error {
	ctx := stream.Context()
	meta, rc, err := s.store.Backup(ctx)
	if err != nil {
		return toStatus(err)
	}
	defer func() { _ = rc.Close() }()
	header := &masterpb.BackupHeader{Index: meta.Index, Term: meta.Term, Size: meta.Size, TakenBy: s.store.ID()}
	if err := stream.Send(&masterpb.BackupChunk{Header: header}); err != nil {
		return err
	}
	buf := make([]byte, backupChunk)
	for {
		n, err := io.ReadFull(rc, buf)
		if n > 0 {
			if err := stream.Send(&masterpb.BackupChunk{Data: buf[:n]}); err != nil {
				return err
			}
		}
		switch {
		case errors.Is(err, io.EOF), errors.Is(err, io.ErrUnexpectedEOF):
			s.log.Info("backed up", "index", meta.Index, "bytes", meta.Size)
			return nil
		case err != nil:
			return toStatus(err)
		}
	}
}

// Restore replaces an empty master's state with a backup (store.Restore).
func (s *Server) Restore(stream masterpb.Master_RestoreServer) error {
	res, err := s.store.Restore(stream.Context(), &restoreReader{stream: stream})
	if err != nil {
		return toStatus(err)
	}
	return stream.SendAndClose(&masterpb.RestoreResponse{
		BackupIndex:       res.Backup.AppliedIndex,
		Datasets:          int64(res.Backup.Datasets),
		Files:             int64(res.Backup.Files),
		WorkersMarkedLost: res.WorkersMarkedLost,
		ReplacedDatasets:  int64(res.Replaced.Datasets),
		ReplacedFiles:     int64(res.Replaced.Files),
		AlreadyRestored:   res.AlreadyRestored,
	})
}

// restoreReader reads the data of a restore's messages.
type restoreReader struct {
	stream masterpb.Master_RestoreServer
	rest   []byte
}

func (r *restoreReader) Read(p []byte) (int, error) {
	for len(r.rest) == 0 {
		msg, err := r.stream.Recv()
		if err != nil {
			return 0, err // io.EOF once the client closed its side
		}
		r.rest = msg.GetData()
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

package client

import (
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/strata-cache/strata/master/masterpb"
)

// transferChunk is the data of one message of a restore.
const transferChunk = 1 << 20

// Backup asks the master's leader for a backup of its whole state (see masterpb.Master.Backup)
// and returns its header and its stream, of header.Size bytes; the caller closes it. A stream
// that ends short of that size fails with io.ErrUnexpectedEOF, so a partial backup is never
// taken for a whole one.
func (c *Client) Backup(ctx context.Context) (*masterpb.BackupHeader, io.ReadCloser, error) {
	stub, err := c.leaderStub(ctx)
	if err != nil {
		return nil, nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	stream, err := stub.Backup(ctx, &masterpb.BackupRequest{})
	if err == nil {
		var first *masterpb.BackupChunk
		if first, err = stream.Recv(); err == nil && first.GetHeader() == nil {
			err = errors.New("the master's first message has no header")
		}
		if err == nil {
			return first.GetHeader(), &backupReader{stream: stream, cancel: cancel, left: first.GetHeader().GetSize()}, nil
		}
	}
	cancel()
	return nil, nil, fmt.Errorf("backup: %w", err)
}

// backupReader reads the data of a backup's messages.
type backupReader struct {
	stream masterpb.Master_BackupClient
	cancel context.CancelFunc
	rest   []byte
	// left is what the header announced and is not read yet.
	left int64
}

func (r *backupReader) Read(p []byte) (int, error) {
	for len(r.rest) == 0 {
		msg, err := r.stream.Recv()
		switch {
		case errors.Is(err, io.EOF) && r.left != 0:
			return 0, fmt.Errorf("backup: the stream ended %d bytes short: %w", r.left, io.ErrUnexpectedEOF)
		case err != nil:
			return 0, err
		}
		r.rest = msg.GetData()
		r.left -= int64(len(r.rest))
		if r.left < 0 {
			return 0, fmt.Errorf("backup: the stream is longer than its header said")
		}
	}
	n := copy(p, r.rest)
	r.rest = r.rest[n:]
	return n, nil
}

// Close ends the call.
func (r *backupReader) Close() error {
	r.cancel()
	return nil
}

// Restore sends a backup, read from r, to the master's leader, which replaces its state with it
// if it holds no file a pod wrote (see masterpb.Master.Restore). A failure to read r cancels
// the call: the leader restores a stream only once it has all of it.
func (c *Client) Restore(ctx context.Context, r io.Reader) (*masterpb.RestoreResponse, error) {
	stub, err := c.leaderStub(ctx)
	if err != nil {
		return nil, err
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	stream, err := stub.Restore(ctx)
	if err != nil {
		return nil, fmt.Errorf("restore: %w", err)
	}
	buf := make([]byte, transferChunk)
	var sent int64
	for {
		n, rerr := io.ReadFull(r, buf)
		if n > 0 {
			if err := stream.Send(&masterpb.RestoreChunk{Data: buf[:n]}); err != nil {
				if errors.Is(err, io.EOF) {
					break // the leader ended the call; CloseAndRecv says why
				}
				return nil, fmt.Errorf("restore: sending after %d bytes: %w", sent, err)
			}
			sent += int64(n)
		}
		if errors.Is(rerr, io.EOF) || errors.Is(rerr, io.ErrUnexpectedEOF) {
			break
		}
		if rerr != nil {
			return nil, fmt.Errorf("restore: reading the backup after %d bytes: %w", sent, rerr)
		}
	}
	resp, err := stream.CloseAndRecv()
	if err != nil {
		return nil, fmt.Errorf("restore of %d bytes: %w", sent, err)
	}
	return resp, nil
}

// leaderSearch bounds how long a transfer looks for the leader: a master without one for that
// long fails the transfer, which its caller takes again later.
const leaderSearch = 30 * time.Second

// leaderStub asks the replicas in turn which one leads and returns its stub, for the transfers
// that go to the leader directly: unlike calls, they are not cut at AttemptTimeout, and a
// restore's stream cannot be sent again to the next replica.
func (c *Client) leaderStub(ctx context.Context) (masterpb.MasterClient, error) {
	ctx, cancel := context.WithTimeout(ctx, leaderSearch)
	defer cancel()
	addr := c.target()
	pause := c.opts.MinBackoff
	for {
		resp, err := c.Leader(ctx, addr)
		if err == nil && resp.GetLeaderApiAddr() != "" {
			leader := c.canonical(resp.GetLeaderApiAddr())
			c.setLeader(leader)
			return c.stub(leader)
		}
		if err == nil {
			err = fmt.Errorf("%s knows no leader", addr)
		}
		c.opts.Logger.V(1).Info("looking for the leader", "addr", addr, "error", err.Error())
		addr = c.rotate(addr)
		t := time.NewTimer(pause)
		select {
		case <-ctx.Done():
			t.Stop()
			return nil, fmt.Errorf("finding the master's leader: %w (last: %w)", ctx.Err(), err)
		case <-t.C:
		}
		pause = min(2*pause, c.opts.MaxBackoff)
	}
}

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

// Backup streams a backup of the master's whole state from its leader into w (see
// masterpb.Master.Backup) and returns its header. It fails if the stream ends short of the
// size the header gave; w then holds a partial backup, which the caller discards.
func (c *Client) Backup(ctx context.Context, w io.Writer) (*masterpb.BackupHeader, error) {
	stub, err := c.leaderStub(ctx)
	if err != nil {
		return nil, err
	}
	stream, err := stub.Backup(ctx, &masterpb.BackupRequest{})
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	first, err := stream.Recv()
	if err != nil {
		return nil, fmt.Errorf("backup: %w", err)
	}
	header := first.GetHeader()
	if header == nil {
		return nil, errors.New("backup: the master's first message has no header")
	}
	var n int64
	for {
		msg, err := stream.Recv()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return header, fmt.Errorf("backup: after %d of %d bytes: %w", n, header.Size, err)
		}
		if _, err := w.Write(msg.GetData()); err != nil {
			return header, fmt.Errorf("backup: storing it after %d bytes: %w", n, err)
		}
		n += int64(len(msg.GetData()))
	}
	if n != header.Size {
		return header, fmt.Errorf("backup: the stream ended after %d of %d bytes", n, header.Size)
	}
	return header, nil
}

// Restore sends a backup, read from r, to the master's leader, which replaces its state with it
// if it holds no Dataset and no file (see masterpb.Master.Restore). A failure to read r cancels
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

// leaderStub asks the replicas in turn which one leads and returns its stub, for the transfers
// that go to the leader directly: unlike calls, they are not cut at AttemptTimeout, and a
// restore's stream cannot be sent again to the next replica.
func (c *Client) leaderStub(ctx context.Context) (masterpb.MasterClient, error) {
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

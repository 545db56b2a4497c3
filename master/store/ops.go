package store

import (
	"context"
	"fmt"

	"github.com/strata-cache/strata/master/masterpb"
)

// stepLimit bounds the keys one step of a multi-step operation touches: small enough that a
// step is a short transaction that does not hold up other commands, large enough that a
// worker with a million blocks is declared lost in about a thousand steps.
const stepLimit = 1024

// MarkWorkerLost declares a worker lost and marks every copy it held lost, recording for each
// block whether a replica or a checkpoint is left. It takes as many commands as the worker has
// blocks / stepLimit; if it is interrupted, the worker stays flagged loss_pending and calling
// it again (the lost-worker detector does) finishes the job. Calling it for a worker already
// lost is a no-op.
func (s *Store) MarkWorkerLost(ctx context.Context, worker, reason string) (*masterpb.MarkWorkerLostResponse, error) {
	total := &masterpb.MarkWorkerLostResponse{}
	for {
		resp, err := s.Apply(ctx, &masterpb.Command{Op: &masterpb.Command_MarkWorkerLost{
			MarkWorkerLost: &masterpb.MarkWorkerLostStep{Worker: worker, Reason: reason, Limit: stepLimit},
		}})
		if err != nil {
			return total, fmt.Errorf("marking worker %s lost: %w", worker, err)
		}
		step := resp.(*masterpb.MarkWorkerLostStepResult)
		total.BlocksLost += step.Counts.GetBlocksLost()
		total.BlocksWithReplica += step.Counts.GetBlocksWithReplica()
		total.BlocksWithCheckpoint += step.Counts.GetBlocksWithCheckpoint()
		total.BlocksUnrecoverable += step.Counts.GetBlocksUnrecoverable()
		if step.Done {
			return total, nil
		}
	}
}

// SettleAttempt publishes or discards the files of one attempt of a dataset's writer, in as
// many commands as it takes (see masterpb.SettleAttemptStep).
func (s *Store) SettleAttempt(ctx context.Context, req *masterpb.SettleAttemptRequest) (*masterpb.SettleAttemptResponse, error) {
	total := &masterpb.SettleAttemptResponse{}
	for {
		resp, err := s.Apply(ctx, &masterpb.Command{Op: &masterpb.Command_SettleAttempt{
			SettleAttempt: &masterpb.SettleAttemptStep{Dataset: req.Dataset, Attempt: req.Attempt, Publish: req.Publish, Limit: stepLimit},
		}})
		if err != nil {
			return total, fmt.Errorf("settling attempt %s of dataset %s: %w", req.Attempt, req.Dataset, err)
		}
		step := resp.(*masterpb.SettleAttemptStepResult)
		total.Files += step.Files
		if step.Done {
			return total, nil
		}
	}
}

// DeleteDataset deletes a dataset and every file below its root, in steps of stepLimit keys.
// If it is interrupted, the files deleted so far stay deleted and calling it again finishes.
func (s *Store) DeleteDataset(ctx context.Context, name string) (*masterpb.DeleteDatasetResponse, error) {
	total := &masterpb.DeleteDatasetResponse{}
	for {
		resp, err := s.Apply(ctx, &masterpb.Command{Op: &masterpb.Command_DeleteDataset{
			DeleteDataset: &masterpb.DeleteDatasetStep{Name: name, Limit: stepLimit},
		}})
		if err != nil {
			return total, fmt.Errorf("deleting dataset %s: %w", name, err)
		}
		step := resp.(*masterpb.DeleteDatasetStepResult)
		total.FilesDeleted += step.FilesDeleted
		if step.Done {
			return total, nil
		}
	}
}

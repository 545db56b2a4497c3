package main

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"time"

	"github.com/strata-cache/strata/cacheworker/locations"
	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
)

// blockResult is what `testkit worker put|get` prints.
type blockResult struct {
	Worker string `json:"worker"`
	Addr   string `json:"addr"`
	Block  string `json:"block"`
	Tier   string `json:"tier"`
	Bytes  int64  `json:"bytes"`
	SHA256 string `json:"sha256"`
}

// workerBlock writes a block to a worker's data plane, or reads one back, finding the worker's
// address through the master as a peer would:
//
//	testkit worker put --master ADDRS --worker POOL/NODE --block ID --size N --seed S --dataset NAME
//	testkit worker get --master ADDRS --worker POOL/NODE --block ID
//
// put registers the dataset, writes the block with an origin in it, and waits until the master
// lists the worker as holding the block: the worker reported it.
func workerBlock(verb string, args []string, out *json.Encoder) error {
	flags := flag.NewFlagSet("worker "+verb, flag.ContinueOnError)
	masters := flags.String("master", "", "comma-separated gRPC addresses of the master replicas")
	worker := flags.String("worker", "", "the worker's id at the master, such as default/node-a")
	block := flags.String("block", "", "block id")
	size := flags.Int64("size", 8<<20, "bytes to put")
	seed := flags.Uint64("seed", 1, "seed of the pseudo-random content to put")
	dataset := flags.String("dataset", "", "dataset the block's file belongs to (put)")
	timeout := flags.Duration("timeout", 2*time.Minute, "give up after this long")
	var tlsf tlsFlags
	tlsf.bind(flags)
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *masters == "" || *worker == "" || *block == "" || (verb == "put" && *dataset == "") {
		return errors.New("--master, --worker and --block are required, and --dataset with put")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *timeout)
	defer cancel()
	mc, peers, err := tlsf.clients(ctx, *masters, client.Options{})
	if err != nil {
		return err
	}
	defer func() { _ = mc.Close(); _ = peers.Close() }()
	addr, err := workerAddress(ctx, mc, *worker)
	if err != nil {
		return err
	}

	res := blockResult{Worker: *worker, Addr: addr, Block: *block}
	switch verb {
	case "put":
		root := "/" + *dataset
		if _, err := mc.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: *dataset, Root: root, Source: "testkit://blocks"}); err != nil {
			return fmt.Errorf("registering dataset %s: %w", *dataset, err)
		}
		data, err := io.ReadAll(io.LimitReader(rand.NewChaCha8(seedBytes(*seed)), *size))
		if err != nil {
			return err
		}
		origin := &workerpb.BlockOrigin{Path: root + "/" + *block, Dataset: *dataset}
		h, err := peers.WriteBlock(ctx, addr, &workerpb.WriteBlockHeader{BlockId: *block, Origin: origin}, data)
		if err != nil {
			return err
		}
		if err := awaitLocation(ctx, mc, *block, *worker); err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		res.Tier, res.Bytes, res.SHA256 = h.GetTier(), h.GetSize(), hex.EncodeToString(sum[:])
	case "get":
		data, h, err := peers.ReadBlock(ctx, addr, *block)
		if err != nil {
			return err
		}
		sum := sha256.Sum256(data)
		res.Tier, res.Bytes, res.SHA256 = h.GetTier(), int64(len(data)), hex.EncodeToString(sum[:])
	}
	return out.Encode(res)
}

// workerAddress asks the master where an alive worker's data plane is.
func workerAddress(ctx context.Context, mc *client.Client, id string) (string, error) {
	for {
		resp, err := mc.ListWorkers(ctx, &masterpb.ListWorkersRequest{})
		if err != nil {
			return "", fmt.Errorf("listing workers: %w", err)
		}
		for _, w := range resp.GetWorkers() {
			if w.GetId() == id && w.GetState() == masterpb.WorkerState_WORKER_STATE_ALIVE {
				return w.GetAddress(), nil
			}
		}
		select {
		case <-ctx.Done():
			return "", fmt.Errorf("worker %s is not registered as alive at the master: %w", id, ctx.Err())
		case <-time.After(time.Second):
		}
	}
}

// awaitLocation waits until the master lists worker as holding block.
func awaitLocation(ctx context.Context, mc *client.Client, block, worker string) error {
	for {
		resp, err := mc.GetBlockLocations(ctx, &masterpb.GetBlockLocationsRequest{BlockIds: []uint64{locations.MasterBlockID(block)}})
		if err == nil {
			for _, b := range resp.GetBlocks() {
				for _, l := range b.GetLocations() {
					if l.GetWorker() == worker && !l.GetLost() {
						return nil
					}
				}
			}
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("the master does not list %s as holding block %s: %w", worker, block, errors.Join(ctx.Err(), err))
		case <-time.After(500 * time.Millisecond):
		}
	}
}

package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"net/url"
	"strings"
	"time"

	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/cacheworker/workerpb"
	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
)

// attempt is one line `testkit attack` prints: what was tried and how it ended.
type attempt struct {
	Op    string `json:"op"`
	Code  string `json:"code"`
	Error string `json:"error,omitempty"`
}

// attack tries, as a pod of another tenant would, what no tenant may do to Strata's master and
// workers, and prints how each attempt ended (code OK means it got through):
//
//	testkit attack --master ADDRS --worker POOL/NODE --worker-addr IP:PORT --block ID --dataset NAME [--only OPS] [TLS flags]
//
// It reads a block of another tenant's Dataset, writes one into it, lists every Dataset's files,
// deletes the Dataset at the master, joins the Raft group, declares a worker lost and registers
// as that worker at another address.
func attack(args []string, out *json.Encoder) error {
	flags := flag.NewFlagSet("attack", flag.ContinueOnError)
	masters := flags.String("master", "", "comma-separated gRPC addresses of the master replicas")
	worker := flags.String("worker", "", "id of a worker at the master, such as pool/node")
	workerAddr := flags.String("worker-addr", "", "that worker's data-plane address")
	block := flags.String("block", "", "id of a block of the victim's Dataset")
	only := flags.String("only", "", "comma-separated operations to try (default: all), such as read-block,list-files")
	dataset := flags.String("dataset", "", "the victim's Dataset as the master names it")
	var tlsf tlsFlags
	tlsf.bind(flags)
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *masters == "" || *worker == "" || *workerAddr == "" || *block == "" || *dataset == "" {
		return errors.New("--master, --worker, --worker-addr, --block and --dataset are required")
	}
	setup, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	mc, peers, err := tlsf.clients(setup, *masters, client.Options{AttemptTimeout: 2 * time.Second})
	if err != nil {
		return err
	}
	defer func() { _ = mc.Close(); _ = peers.Close() }()

	try := func(op string, call func(ctx context.Context) error) error {
		ctx, cancel := context.WithTimeout(context.Background(), 8*time.Second)
		defer cancel()
		err := call(ctx)
		a := attempt{Op: op, Code: status.Code(err).String()}
		if err != nil {
			a.Error = err.Error()
		}
		return out.Encode(a)
	}
	attempts := []struct {
		op   string
		call func(ctx context.Context) error
	}{
		{"read-block", func(ctx context.Context) error {
			_, _, err := peers.ReadBlock(ctx, *workerAddr, *block)
			return err
		}},
		{"write-block", func(ctx context.Context) error {
			origin := &workerpb.BlockOrigin{Path: "/datasets/" + *dataset + "/planted", Dataset: *dataset}
			_, err := peers.WriteBlock(ctx, *workerAddr, &workerpb.WriteBlockHeader{BlockId: *block + "9", Origin: origin}, []byte("planted"))
			return err
		}},
		{"list-files", func(ctx context.Context) error {
			_, err := mc.ListFiles(ctx, &masterpb.ListFilesRequest{Dir: "/datasets", Recursive: true})
			return err
		}},
		{"delete-dataset", func(ctx context.Context) error {
			_, err := mc.DeleteDataset(ctx, *dataset)
			return err
		}},
		{"join", func(ctx context.Context) error {
			_, err := mc.Join(ctx, &masterpb.JoinRequest{RaftId: "strata-master-9", RaftAddr: "127.0.0.1:7000", ApiAddr: "127.0.0.1:7001"})
			return err
		}},
		{"mark-worker-lost", func(ctx context.Context) error {
			_, err := mc.MarkWorkerLost(ctx, *worker, "testkit attack")
			return err
		}},
		{"register-worker", func(ctx context.Context) error {
			_, err := mc.RegisterWorker(ctx, &masterpb.RegisterWorkerRequest{Id: *worker, Address: "127.0.0.1:7100", Node: "nowhere"})
			return err
		}},
	}
	wanted := map[string]bool{}
	for _, op := range strings.Split(*only, ",") {
		if op != "" {
			wanted[op] = true
		}
	}
	for _, a := range attempts {
		if len(wanted) > 0 && !wanted[a.op] {
			continue
		}
		if err := try(a.op, a.call); err != nil {
			return err
		}
	}
	return nil
}

func parseURI(s string) (*url.URL, error) {
	u, err := url.Parse(s)
	if err != nil {
		return nil, fmt.Errorf("--forge %q: %w", s, err)
	}
	return u, nil
}

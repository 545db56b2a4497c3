package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/strata-cache/strata/master/client"
	"github.com/strata-cache/strata/master/masterpb"
)

// soakResult is the last line `testkit master soak` prints.
type soakResult struct {
	// Acknowledged counts the creates the master confirmed.
	Acknowledged int `json:"acknowledged"`
	// Lost counts confirmed creates that the master no longer knows at the end: it must be 0.
	Lost int `json:"lost"`
	// Failed counts creates that returned an error (none is confirmed, none is retried).
	Failed int `json:"failed"`
	// LongestGapMillis is the longest time between two confirmed creates: with a leader killed
	// mid-run, it bounds the failover time a client sees.
	LongestGapMillis int64 `json:"longestGapMillis"`
}

// masterSoak creates files in a loop for a while, through the master client that follows the
// leader, then checks that every acknowledged create is still there. It prints
// {"leader": ADDR} once the first write succeeds, so that a test knows which replica to kill.
func masterSoak(args []string, out *json.Encoder) error {
	flags := flag.NewFlagSet("master soak", flag.ContinueOnError)
	addrs := flags.String("addrs", "", "comma-separated gRPC addresses of the master replicas")
	duration := flags.Duration("duration", 30*time.Second, "how long to write")
	dataset := flags.String("dataset", "", "dataset (and root folder) to create files in; registered if absent")
	var tlsf tlsFlags
	tlsf.bind(flags)
	if err := flags.Parse(args); err != nil {
		return err
	}
	if *addrs == "" || *dataset == "" {
		return errors.New("--addrs and --dataset are required")
	}
	ctx, cancel := context.WithTimeout(context.Background(), *duration+2*time.Minute)
	defer cancel()

	toMaster, _, err := tlsf.dialOptions(ctx)
	if err != nil {
		return err
	}
	c, err := client.New(strings.Split(*addrs, ","), client.Options{DialOptions: toMaster})
	if err != nil {
		return err
	}
	defer func() { _ = c.Close() }()

	root := "/" + *dataset
	if _, err := c.RegisterDataset(ctx, &masterpb.RegisterDatasetRequest{Name: *dataset, Root: root, Source: "testkit://soak"}); err != nil {
		return fmt.Errorf("registering dataset %s: %w", *dataset, err)
	}

	var res soakResult
	var acked []string
	last := time.Now()
	announced := false
	deadline := time.Now().Add(*duration)
	for i := 0; time.Now().Before(deadline); i++ {
		path := fmt.Sprintf("%s/file-%06d", root, i)
		if _, err := c.CreateFile(ctx, &masterpb.CreateFileRequest{Path: path, Dataset: *dataset}); err != nil {
			res.Failed++
			fmt.Fprintf(os.Stderr, "create %s: %v\n", path, err)
			continue
		}
		now := time.Now()
		if gap := now.Sub(last).Milliseconds(); gap > res.LongestGapMillis {
			res.LongestGapMillis = gap
		}
		last = now
		acked = append(acked, path)
		if !announced {
			announced = true
			if err := out.Encode(map[string]string{"leader": c.LeaderAddr()}); err != nil {
				return err
			}
		}
	}
	res.Acknowledged = len(acked)
	for _, path := range acked {
		ok, err := c.Exists(ctx, path)
		if err != nil {
			return fmt.Errorf("checking %s: %w", path, err)
		}
		if !ok {
			res.Lost++
		}
	}
	return out.Encode(res)
}

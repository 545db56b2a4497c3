//go:build ignore

// etcdbench puts and gets keys in an etcd cluster from concurrent clients, the way
// master/bench's BenchmarkCreate and BenchmarkExists drive Strata's master: one client (one
// connection per member) shared by -clients goroutines, each with one request in flight. It is
// the etcd side of `make bench-master` (hack/bench-master.sh).
//
// It is built outside Strata's module, in a wrapper module that requires etcd's client at the
// version of the etcd the Makefile builds (the build tag keeps it out of Strata's own builds).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func main() {
	endpoints := flag.String("endpoints", "127.0.0.1:2379", "comma-separated client URLs of the members")
	clients := flag.Int("clients", 64, "goroutines, each with one request in flight")
	n := flag.Int("n", 20000, "requests")
	op := flag.String("op", "put", "put (a new key each) or get (linearizable, of keys put before)")
	valueSize := flag.Int("value-size", 128, "bytes of each value, about a Strata file record")
	flag.Parse()

	cli, err := clientv3.New(clientv3.Config{Endpoints: strings.Split(*endpoints, ","), DialTimeout: 10 * time.Second})
	if err != nil {
		log.Fatalf("connecting to etcd: %v", err)
	}
	defer cli.Close()
	ctx := context.Background()
	value := strings.Repeat("v", *valueSize)
	key := func(i int) string { return fmt.Sprintf("/bench/f%d", i) }
	var do func(i int) error
	switch *op {
	case "put":
		do = func(i int) error {
			_, err := cli.Put(ctx, key(i), value)
			return err
		}
	case "get":
		do = func(i int) error {
			resp, err := cli.Get(ctx, key((i*7919)%*n))
			if err == nil && len(resp.Kvs) != 1 {
				err = fmt.Errorf("key %s not found: put the keys first", key((i*7919)%*n))
			}
			return err
		}
	default:
		log.Fatalf("-op %q: want put or get", *op)
	}

	var next atomic.Int64
	var failed atomic.Value
	var wg sync.WaitGroup
	start := time.Now()
	for w := 0; w < *clients; w++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := int(next.Add(1)) - 1
				if i >= *n || failed.Load() != nil {
					return
				}
				if err := do(i); err != nil {
					failed.CompareAndSwap(nil, err)
					return
				}
			}
		}()
	}
	wg.Wait()
	elapsed := time.Since(start)
	if err, ok := failed.Load().(error); ok {
		log.Fatalf("%s: %v", *op, err)
	}
	_ = json.NewEncoder(os.Stdout).Encode(map[string]any{
		"system": "etcd", "op": *op, "clients": *clients, "requests": *n,
		"seconds": elapsed.Seconds(), "opsPerSecond": float64(*n) / elapsed.Seconds(),
	})
}

// Command kubectl-strata is the kubectl plugin of Strata: `kubectl strata status`, `ls`, `du`,
// `sync`, `load` and `lineage`. Put it on the PATH (make builds bin/kubectl-strata) and kubectl
// finds it.
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/pflag"
	"k8s.io/apimachinery/pkg/runtime"
	clientgoscheme "k8s.io/client-go/kubernetes/scheme"
	"k8s.io/client-go/tools/clientcmd"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
	"github.com/strata-cache/strata/cli"
)

const usage = `kubectl strata: Strata's Datasets, where their blocks are, and their pipelines.

Usage:
  kubectl strata status                    the TierPools (workers, tiers, use) and the namespace's Datasets
  kubectl strata ls DATASET [FOLDER]       the files of a Dataset, how much of each is cached and where (node/tier:blocks)
  kubectl strata du DATASET [FOLDER]       sizes and cached shares of a folder's entries, and its cached bytes by node and tier
  kubectl strata sync DATASET              sync the Dataset's mounts with its source now
  kubectl strata load DATASET              read the Dataset once more into the cache, and wait until it is
  kubectl strata lineage                   the namespace's pipeline: Lineages in order, what each reads and writes
  kubectl strata backup                    back the master up to S3 now (master.backup.uri), and wait until it is

Flags:
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx, os.Args[1:], os.Stdout, os.Stderr)
	stop()
	if err != nil {
		fmt.Fprintln(os.Stderr, "error:", err)
		os.Exit(1)
	}
}

// errUsage is a command line that names no command it knows; the usage was printed.
var errUsage = errors.New("see the usage above")

func run(ctx context.Context, args []string, stdout, stderr io.Writer) error {
	flags := pflag.NewFlagSet("kubectl-strata", pflag.ContinueOnError)
	flags.SetOutput(stderr)
	loading := clientcmd.NewDefaultClientConfigLoadingRules()
	overrides := &clientcmd.ConfigOverrides{}
	flags.StringVar(&loading.ExplicitPath, "kubeconfig", "", "the kubeconfig file to use")
	flags.StringVar(&overrides.CurrentContext, "context", "", "the kubeconfig context to use")
	flags.StringVarP(&overrides.Context.Namespace, "namespace", "n", "", "the namespace (default: the context's)")
	wait := flags.Duration("wait", cli.DefaultWait, "how long sync, load, ls, du and backup wait for the operator's answer")
	strataNamespace := flags.String("strata-namespace", "strata-system", "the namespace Strata is installed in (backup)")
	flags.Usage = func() {
		_, _ = io.WriteString(stderr, usage) // nothing to do if the terminal is gone
		flags.PrintDefaults()
	}
	if err := flags.Parse(args); err != nil {
		if errors.Is(err, pflag.ErrHelp) {
			return nil
		}
		return err
	}
	cmd := flags.Args()
	if len(cmd) == 0 || cmd[0] == "help" {
		flags.Usage()
		if len(cmd) == 0 {
			return errUsage
		}
		return nil
	}
	command, ok := commands[cmd[0]]
	if !ok {
		flags.Usage()
		return fmt.Errorf("unknown command %q", cmd[0])
	}
	args = cmd[1:]
	if len(args) < command.args || len(args) > command.args+command.optional {
		flags.Usage()
		return fmt.Errorf("%s takes %d argument(s)%s, not %d", cmd[0], command.args, optional(command.optional), len(args))
	}
	// Optional arguments left out are empty.
	args = append(args, make([]string, command.args+command.optional-len(args))...)

	config := clientcmd.NewNonInteractiveDeferredLoadingClientConfig(loading, overrides)
	namespace, _, err := config.Namespace()
	if err != nil {
		return fmt.Errorf("finding the namespace in the kubeconfig: %w", err)
	}
	rest, err := config.ClientConfig()
	if err != nil {
		return fmt.Errorf("reading the kubeconfig: %w", err)
	}
	scheme := runtime.NewScheme()
	if err := clientgoscheme.AddToScheme(scheme); err != nil {
		return err
	}
	if err := datav1alpha1.AddToScheme(scheme); err != nil {
		return err
	}
	kube, err := client.NewWithWatch(rest, client.Options{Scheme: scheme})
	if err != nil {
		return fmt.Errorf("connecting to the API server: %w", err)
	}
	c := &cli.CLI{Client: kube, Namespace: namespace, StrataNamespace: *strataNamespace, Out: stdout, Wait: *wait}
	return errors.Join(command.run(ctx, c, args), c.WriteError())
}

// command is one of the plugin's commands: how many arguments it needs, how many more it
// takes, and what it runs.
type command struct {
	args, optional int
	run            func(ctx context.Context, c *cli.CLI, args []string) error
}

var commands = map[string]command{
	"status":  {run: func(ctx context.Context, c *cli.CLI, _ []string) error { return c.Status(ctx) }},
	"lineage": {run: func(ctx context.Context, c *cli.CLI, _ []string) error { return c.Lineage(ctx) }},
	"ls":      {args: 1, optional: 1, run: func(ctx context.Context, c *cli.CLI, a []string) error { return c.List(ctx, a[0], a[1]) }},
	"du":      {args: 1, optional: 1, run: func(ctx context.Context, c *cli.CLI, a []string) error { return c.DiskUsage(ctx, a[0], a[1]) }},
	"sync":    {args: 1, run: func(ctx context.Context, c *cli.CLI, a []string) error { return c.Sync(ctx, a[0]) }},
	"load":    {args: 1, run: func(ctx context.Context, c *cli.CLI, a []string) error { return c.Load(ctx, a[0]) }},
	"backup":  {run: func(ctx context.Context, c *cli.CLI, _ []string) error { return c.Backup(ctx) }},
}

func optional(n int) string {
	if n == 0 {
		return ""
	}
	return fmt.Sprintf(" and up to %d more", n)
}

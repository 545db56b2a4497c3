// Package cli is `kubectl strata`, the kubectl plugin of Strata: what a user of a namespace
// asks of its Datasets and Lineages (status, where blocks are, sync, load, the pipeline) and of
// the pools that cache them. It speaks only to the Kubernetes API, with the user's own
// credentials: questions the operator must answer (where blocks are, a sync, a load) are asked
// with an annotation on the Dataset and answered in its status, so a user needs no access to
// Strata's components and sees only what its RBAC lets it see.
package cli

import (
	"context"
	"errors"
	"fmt"
	"io"
	"text/tabwriter"
	"time"

	apierrors "k8s.io/apimachinery/pkg/api/errors"
	"k8s.io/apimachinery/pkg/api/meta"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/fields"
	"k8s.io/apimachinery/pkg/watch"
	"sigs.k8s.io/controller-runtime/pkg/client"

	datav1alpha1 "github.com/strata-cache/strata/api/v1alpha1"
)

// DefaultWait is how long a request waits for the operator's answer unless told otherwise.
const DefaultWait = 5 * time.Minute

// CLI runs the plugin's commands in one namespace.
type CLI struct {
	Client    client.WithWatch
	Namespace string
	// StrataNamespace is the one Strata is installed in.
	StrataNamespace string
	Out             io.Writer
	// Wait bounds how long a request waits for the operator's answer (0: DefaultWait).
	Wait time.Duration

	writeErr error
}

func (c *CLI) wait() time.Duration {
	if c.Wait > 0 {
		return c.Wait
	}
	return DefaultWait
}

// printf writes to the user; the first error is kept for WriteError, so that a command's lines
// need not each be checked.
func (c *CLI) printf(format string, args ...any) {
	if c.writeErr == nil {
		_, c.writeErr = fmt.Fprintf(c.Out, format, args...)
	}
}

// WriteError is the first error writing a command's output (a closed pipe, say), if any.
func (c *CLI) WriteError() error { return c.writeErr }

// table is output in aligned columns, its cells separated by tabs.
type table struct {
	tw  *tabwriter.Writer
	err error
}

func (c *CLI) table() *table {
	return &table{tw: tabwriter.NewWriter(c.Out, 0, 4, 2, ' ', 0)}
}

func (t *table) printf(format string, args ...any) {
	if t.err == nil {
		_, t.err = fmt.Fprintf(t.tw, format, args...)
	}
}

// flush writes the table out, aligned.
func (t *table) flush() error {
	if t.err != nil {
		return fmt.Errorf("writing a table: %w", t.err)
	}
	return t.tw.Flush()
}

// dataset reads a Dataset of the namespace, saying how to find the right name if there is none.
func (c *CLI) dataset(ctx context.Context, name string) (*datav1alpha1.Dataset, error) {
	ds := &datav1alpha1.Dataset{}
	err := c.Client.Get(ctx, client.ObjectKey{Namespace: c.Namespace, Name: name}, ds)
	switch {
	case apierrors.IsNotFound(err):
		return nil, fmt.Errorf("no Dataset %q in namespace %s: `kubectl -n %s get datasets` lists them", name, c.Namespace, c.Namespace)
	case err != nil:
		return nil, fmt.Errorf("reading Dataset %s/%s: %w", c.Namespace, name, err)
	}
	return ds, nil
}

// request sets annotations on a Dataset, with a token of the moment as the value of key, and
// returns the token: the operator answers in the status with the same token.
func (c *CLI) request(ctx context.Context, ds *datav1alpha1.Dataset, key string, more map[string]string) (string, error) {
	token := time.Now().UTC().Format(time.RFC3339Nano)
	if ds.Annotations[key] == token {
		// Two requests in one instant: this one must still be new.
		token += "-again"
	}
	patch := client.MergeFrom(ds.DeepCopy())
	if ds.Annotations == nil {
		ds.Annotations = map[string]string{}
	}
	ds.Annotations[key] = token
	for k, v := range more {
		if v == "" {
			delete(ds.Annotations, k)
			continue
		}
		ds.Annotations[k] = v
	}
	if err := c.Client.Patch(ctx, ds, patch); err != nil {
		return "", fmt.Errorf("annotating Dataset %s/%s with %s: %w", ds.Namespace, ds.Name, key, err)
	}
	return token, nil
}

// errNoAnswer says the operator did not answer in time.
var errNoAnswer = errors.New("no answer from the Strata operator")

// await watches a Dataset until answered says the operator answered (or failed, with an
// error), and returns the Dataset as it then was. Without an answer within the wait, the
// error says what the Dataset's Ready condition says, which is where a stuck operator shows.
func (c *CLI) await(ctx context.Context, ds *datav1alpha1.Dataset, answered func(*datav1alpha1.Dataset) (bool, error)) (*datav1alpha1.Dataset, error) {
	return awaitObject(ctx, c, ds, &datav1alpha1.DatasetList{}, answered, c.noAnswer)
}

// awaitObject reads obj and watches it until answered says the operator answered (or failed,
// with an error), and returns it as it then was; without an answer within the wait, noAnswer
// explains why with the last copy seen.
func awaitObject[T client.Object](ctx context.Context, c *CLI, obj T, list client.ObjectList, answered func(T) (bool, error),
	noAnswer func(context.Context, T, error) error,
) (T, error) {
	var zero T
	ctx, cancel := context.WithTimeout(ctx, c.wait())
	defer cancel()
	last := obj
	for {
		fresh := obj.DeepCopyObject().(T)
		if err := c.Client.Get(ctx, client.ObjectKeyFromObject(obj), fresh); err != nil {
			return zero, noAnswer(ctx, last, err)
		}
		last = fresh
		if done, err := answered(fresh); done || err != nil {
			return fresh, err
		}
		w, err := c.Client.Watch(ctx, list, client.InNamespace(obj.GetNamespace()),
			client.MatchingFieldsSelector{Selector: fields.OneTermEqualSelector("metadata.name", obj.GetName())},
			&client.ListOptions{Raw: &metav1.ListOptions{ResourceVersion: fresh.GetResourceVersion()}})
		if err != nil {
			return zero, noAnswer(ctx, last, err)
		}
		done, got, err := watchUntil(ctx, w, obj.GetName(), answered)
		w.Stop()
		if got != nil {
			last = *got
		}
		switch {
		case done || (err != nil && ctx.Err() == nil):
			return last, err
		case ctx.Err() != nil:
			return zero, noAnswer(ctx, last, ctx.Err())
		}
		// The watch ended (the API server closes them now and then): read and watch again.
	}
}

// watchUntil reads w's events of the object name until answered says done or fails, the watch
// ends, or ctx is done; got is the last copy seen.
func watchUntil[T client.Object](ctx context.Context, w watch.Interface, name string, answered func(T) (bool, error)) (done bool, got *T, err error) {
	for {
		select {
		case <-ctx.Done():
			return false, got, nil
		case ev, ok := <-w.ResultChan():
			if !ok {
				return false, got, nil
			}
			switch ev.Type {
			case watch.Deleted:
				return false, got, fmt.Errorf("%s was deleted", name)
			case watch.Error:
				// Too old a resource version, say: the caller reads the object again.
				return false, got, nil
			}
			obj, ofType := ev.Object.(T)
			if !ofType || obj.GetName() != name {
				continue
			}
			got = &obj
			if done, err := answered(obj); done || err != nil {
				return done, got, err
			}
		}
	}
}

// noAnswer explains a request the operator did not answer.
func (c *CLI) noAnswer(ctx context.Context, ds *datav1alpha1.Dataset, cause error) error {
	if ctx.Err() == nil {
		return fmt.Errorf("waiting for the answer of the Strata operator about Dataset %s/%s: %w", ds.Namespace, ds.Name, cause)
	}
	why := "is the operator running? `kubectl get pods -A -l app.kubernetes.io/name=strata,app.kubernetes.io/component=operator`"
	if ready := meta.FindStatusCondition(ds.Status.Conditions, datav1alpha1.ConditionReady); ready != nil && ready.Status != metav1.ConditionTrue {
		why = fmt.Sprintf("the Dataset is not Ready (%s: %s)", ready.Reason, ready.Message)
	}
	return fmt.Errorf("%w about Dataset %s/%s within %s: %s", errNoAnswer, ds.Namespace, ds.Name, c.wait(), why)
}

package main

import (
	"bytes"
	"context"
	"testing"
)

func TestACommandLineItCannotRunSaysWhyAndShowsTheUsage(t *testing.T) {
	for _, c := range []struct {
		args []string
		want string // in the error; empty: no error
	}{
		{args: nil, want: "see the usage above"},
		{args: []string{"help"}},
		{args: []string{"--help"}},
		{args: []string{"frobnicate"}, want: `unknown command "frobnicate"`},
		{args: []string{"ls"}, want: "ls takes 1 argument(s) and up to 1 more, not 0"},
		{args: []string{"ls", "a", "b", "c"}, want: "ls takes 1 argument(s) and up to 1 more, not 3"},
		{args: []string{"sync", "a", "b"}, want: "sync takes 1 argument(s), not 2"},
		{args: []string{"status", "extra"}, want: "status takes 0 argument(s), not 1"},
		{args: []string{"--kubeconfig", "/nonexistent/kubeconfig", "status"}, want: "/nonexistent/kubeconfig"},
	} {
		var stdout, stderr bytes.Buffer
		err := run(context.Background(), c.args, &stdout, &stderr)
		switch {
		case c.want == "" && err != nil:
			t.Errorf("%q: %v", c.args, err)
		case c.want != "" && (err == nil || !bytes.Contains([]byte(err.Error()), []byte(c.want))):
			t.Errorf("%q: error %v, want one that says %q", c.args, err, c.want)
		}
		if c.want != "" && c.want != "/nonexistent/kubeconfig" && !bytes.Contains(stderr.Bytes(), []byte("Usage:")) {
			t.Errorf("%q: no usage shown", c.args)
		}
	}
}

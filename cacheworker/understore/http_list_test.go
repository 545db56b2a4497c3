package understore

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strings"
	"testing"

	. "github.com/onsi/gomega"
)

// TestHTTPListsADirectoryTreeFromGosFileServer lists a tree that Go's http.FileServer serves,
// index pages and all, as a web server in front of a folder of files does.
func TestHTTPListsADirectoryTreeFromGosFileServer(t *testing.T) {
	root := t.TempDir()
	files := map[string]string{
		"train/part-0.csv":     "a,b\n1,2\n",
		"train/part-1.csv":     "a,b\n3,4\n5,6\n",
		"train/deep/er/x.bin":  "xyz",
		"README.md":            "# corpus\n",
		"noms/été 2024 #1.txt": "accents, spaces and a hash",
		"dot-files/.hidden":    "",
	}
	for p, data := range files {
		must(t, os.MkdirAll(filepath.Join(root, filepath.Dir(p)), 0o750))
		must(t, os.WriteFile(filepath.Join(root, p), []byte(data), 0o640))
	}
	srv := httptest.NewServer(http.StripPrefix("/mirror/", http.FileServer(http.Dir(root))))
	t.Cleanup(srv.Close)
	ctx := context.Background()

	cases := map[string]struct {
		base, prefix string
		want         []string
	}{
		"the whole tree, every file with its size": {
			base: srv.URL + "/mirror", want: []string{"README.md", "dot-files/.hidden", "noms/été 2024 #1.txt",
				"train/part-0.csv", "train/part-1.csv", "train/deep/er/x.bin"},
		},
		"a folder of it": {
			base: srv.URL + "/mirror/", prefix: "train/",
			want: []string{"train/part-0.csv", "train/part-1.csv", "train/deep/er/x.bin"},
		},
		"a prefix that is not a folder": {
			base: srv.URL + "/mirror", prefix: "train/part-", want: []string{"train/part-0.csv", "train/part-1.csv"},
		},
		"a base URL inside the tree": {
			base: srv.URL + "/mirror/train", want: []string{"part-0.csv", "part-1.csv", "deep/er/x.bin"},
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			h, err := NewHTTP(HTTPConfig{BaseURL: tc.base})
			g.Expect(err).NotTo(HaveOccurred())
			var got []string
			for info, err := range h.List(ctx, tc.prefix) {
				g.Expect(err).NotTo(HaveOccurred())
				got = append(got, info.Path)
				full := info.Path
				if strings.HasSuffix(tc.base, "/train") {
					full = "train/" + full
				}
				g.Expect(info.Size).To(BeEquivalentTo(len(files[full])), "the size of %s", info.Path)
				g.Expect(info.ModTime.IsZero()).To(BeFalse(), "the modification time of %s", info.Path)
				data, err := readAll(ctx, h, info.Path)
				g.Expect(err).NotTo(HaveOccurred())
				g.Expect(data).To(Equal(files[full]), "what a listed path reads")
			}
			g.Expect(got).To(Equal(tc.want))
		})
	}
}

// TestHTTPListsIndexPagesOfOtherServers reads index pages as nginx's autoindex and Apache's
// mod_autoindex write them, links they carry that are not entries included.
func TestHTTPListsIndexPagesOfOtherServers(t *testing.T) {
	pages := map[string]string{
		// nginx autoindex: a parent link, then entries relative to the folder.
		"/nginx/": `<html><head><title>Index of /nginx/</title></head><body><h1>Index of /nginx/</h1><hr><pre>` +
			`<a href="../">../</a>` + "\n" + `<a href="sub/">sub/</a>   28-Nov-2026 10:00    -` + "\n" +
			`<a href="a%20b.txt">a b.txt</a>   28-Nov-2026 10:00   5` + "\n</pre><hr></body></html>",
		"/nginx/sub/": `<html><body><pre><a href="../">../</a>` + "\n" + `<a href="c.txt">c.txt</a></pre></body></html>`,
		// Apache: sort links, an absolute link to the parent, an icon, an entry written as an
		// absolute path, one on another host, and one twice.
		"/apache/": `<!DOCTYPE HTML PUBLIC "-//W3C//DTD HTML 3.2 Final//EN"><html><body><h1>Index of /apache</h1><table>` +
			`<tr><th><a href="?C=N;O=D">Name</a></th><th><a href="?C=M;O=A">Last modified</a></th></tr>` +
			`<tr><td><img src="/icons/back.gif" alt="[PARENTDIR]"></td><td><a href="/">Parent Directory</a></td></tr>` +
			`<tr><td><a href="/apache/x.txt">x.txt</a></td></tr><tr><td><a href="x.txt">x.txt</a></td></tr>` +
			`<tr><td><a href="https://elsewhere.example.com/y.txt">y.txt</a></td><td><a href="#top">top</a></td></tr>` +
			`</table></body></html>`,
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		if page, ok := pages[r.URL.Path]; ok {
			w.Header().Set("Content-Type", "text/html; charset=utf-8")
			_, _ = w.Write([]byte(page))
			return
		}
		if strings.HasSuffix(r.URL.Path, ".txt") {
			_, _ = w.Write([]byte("bytes"))
			return
		}
		http.NotFound(w, r)
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	for base, want := range map[string][]string{
		"/nginx":  {"a b.txt", "sub/c.txt"},
		"/apache": {"x.txt"},
	} {
		t.Run(base, func(t *testing.T) {
			g := NewWithT(t)
			h, err := NewHTTP(HTTPConfig{BaseURL: srv.URL + base})
			g.Expect(err).NotTo(HaveOccurred())
			got, err := listAll(context.Background(), h)
			g.Expect(err).NotTo(HaveOccurred())
			g.Expect(got).To(Equal(want))
		})
	}
}

func TestHTTPListSaysWhatIsWrong(t *testing.T) {
	mux := http.NewServeMux()
	mux.HandleFunc("/json/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"files": []}`))
	})
	mux.HandleFunc("/private/", func(w http.ResponseWriter, r *http.Request) {
		if r.Header.Get("Authorization") != "Bearer good" {
			http.Error(w, "who are you", http.StatusUnauthorized)
			return
		}
		if r.URL.Path != "/private/" {
			http.NotFound(w, r)
			return
		}
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte(`<a href="gone.txt">gone.txt</a>`))
	})
	mux.HandleFunc("/endless/", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "text/html")
		_, _ = w.Write([]byte(`<a href="deeper/">deeper/</a>`)) // every folder has one more
	})
	srv := httptest.NewServer(mux)
	t.Cleanup(srv.Close)

	cases := map[string]struct {
		cfg  HTTPConfig
		kind error
		says string
	}{
		"a folder that answers with no index page": {
			cfg: HTTPConfig{BaseURL: srv.URL + "/json"}, kind: errors.ErrUnsupported, says: `answers with "application/json", not an HTML page of links`,
		},
		"a folder that wants credentials none were given for": {
			cfg: HTTPConfig{BaseURL: srv.URL + "/private"}, kind: ErrMissingCredentials, says: "who are you",
		},
		"a linked file that is not there": {
			cfg:  HTTPConfig{BaseURL: srv.URL + "/private", Header: http.Header{"Authorization": {"Bearer good"}}},
			kind: ErrNotFound, says: "gone.txt",
		},
		"folders without end": {
			cfg: HTTPConfig{BaseURL: srv.URL + "/endless"}, kind: ErrInvalidPath, says: "deeper than 64 levels",
		},
		"a folder that does not exist": {
			cfg: HTTPConfig{BaseURL: srv.URL + "/nothing"}, kind: ErrNotFound, says: "404",
		},
	}
	for name, tc := range cases {
		t.Run(name, func(t *testing.T) {
			g := NewWithT(t)
			h, err := NewHTTP(tc.cfg)
			g.Expect(err).NotTo(HaveOccurred())
			_, err = listAll(context.Background(), h)
			g.Expect(err).To(MatchError(tc.kind))
			g.Expect(err.Error()).To(ContainSubstring(tc.says))
		})
	}
}

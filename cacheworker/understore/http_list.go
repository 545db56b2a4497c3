package understore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"iter"
	"mime"
	"net/http"
	"net/url"
	"slices"
	"strings"

	"golang.org/x/net/html"
	"golang.org/x/sync/errgroup"
)

// Bounds of a listing from directory index pages.
const (
	// maxIndexPage is the most of one index page that is read: a page of a hundred thousand
	// entries is a few MiB; more is a page that is not an index.
	maxIndexPage = 32 << 20
	// listStatConcurrency is how many HEADs run at once to describe the files of a listing.
	listStatConcurrency = 8
	// maxIndexDepth bounds how deep folders are walked: a server that makes up folders as it
	// is asked (every page links to a deeper one) must not hold a listing forever.
	maxIndexDepth = 64
)

// errNoIndex is a folder whose URL answers with something other than an HTML directory index.
var errNoIndex = errors.New("no directory index")

// List implements Store from the server's HTML directory indexes, as nginx (autoindex), Apache
// (mod_autoindex), Caddy (file_server browse), Go's http.FileServer and `python3 -m
// http.server` serve them, as rclone's http backend reads them: a link to a name ending in
// "/" is a folder, walked in turn; any other link under the folder is a file, described by a
// HEAD (size, ETag, modification time). Links that leave the folder (parents, other hosts,
// sort orders, fragments) are not followed, so the walk ends. Files are yielded in
// directory-walk order.
func (h *HTTP) List(ctx context.Context, prefix string) iter.Seq2[ObjectInfo, error] {
	if err := checkPrefix(prefix); err != nil {
		return errorSeq(h.fail("list", prefix, ErrInvalidPath, err))
	}
	return func(yield func(ObjectInfo, error) bool) {
		// The walk starts at the folder that holds prefix ("a/b" is under "a/").
		dir := prefix[:strings.LastIndex(prefix, "/")+1]
		var paths []string
		if err := h.walk(ctx, dir, func(p string) {
			if strings.HasPrefix(p, prefix) {
				paths = append(paths, p)
			}
		}); err != nil {
			yield(ObjectInfo{}, err)
			return
		}
		infos, err := h.statAll(ctx, paths)
		if err != nil {
			yield(ObjectInfo{}, err)
			return
		}
		for _, info := range infos {
			if !yield(info, nil) {
				return
			}
		}
	}
}

// walk calls file with the path of every file under the folder dir ("" or "a/b/"), reading
// its index page and those of its folders, depth first.
func (h *HTTP) walk(ctx context.Context, dir string, file func(string)) error {
	if strings.Count(dir, "/") > maxIndexDepth {
		return h.fail("list", dir, ErrInvalidPath, fmt.Errorf("folders nest deeper than %d levels: the server's index pages link on without end", maxIndexDepth))
	}
	files, dirs, err := h.readIndex(ctx, dir)
	if err != nil {
		return err
	}
	for _, f := range files {
		file(dir + f)
	}
	for _, d := range dirs {
		if err := h.walk(ctx, dir+d+"/", file); err != nil {
			return err
		}
	}
	return nil
}

// readIndex reads the index page of the folder dir and returns the names of the files and
// folders it links to, each once, sorted.
func (h *HTTP) readIndex(ctx context.Context, dir string) (files, dirs []string, err error) {
	folder := h.base.JoinPath(strings.Split(strings.TrimSuffix(dir, "/"), "/")...)
	if !strings.HasSuffix(folder.Path, "/") {
		folder.Path += "/" // a folder's links are relative to it, and many servers redirect to it
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, folder.String(), nil)
	if err != nil {
		return nil, nil, h.fail("list", dir, ErrInvalidPath, err)
	}
	for k, vs := range h.header {
		req.Header[k] = vs
	}
	resp, err := h.client.Do(req)
	if err != nil {
		return nil, nil, h.fail("list", dir, localKind(err), err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return nil, nil, h.fail("list", dir, h.statusKind(resp.StatusCode), statusError(resp))
	}
	if media, _, _ := mime.ParseMediaType(resp.Header.Get("Content-Type")); media != "text/html" {
		return nil, nil, h.fail("list", dir, errors.ErrUnsupported, fmt.Errorf("%w at %s: the server answers with %q, not an HTML page of links; "+
			"Strata lists http(s) sources from directory indexes (nginx autoindex on, Apache Options +Indexes, python3 -m http.server)",
			errNoIndex, folder.Redacted(), media))
	}
	// A redirect (a folder asked for without its slash, say) moves what links are relative to.
	page := resp.Request.URL
	body := io.LimitReader(resp.Body, maxIndexPage)
	seenFile, seenDir := map[string]bool{}, map[string]bool{}
	z := html.NewTokenizer(body)
	for {
		switch z.Next() {
		case html.ErrorToken:
			if !errors.Is(z.Err(), io.EOF) {
				return nil, nil, h.fail("list", dir, localKind(z.Err()), fmt.Errorf("reading the index page %s: %w", folder.Redacted(), z.Err()))
			}
			slices.Sort(files)
			slices.Sort(dirs)
			return files, dirs, nil
		case html.StartTagToken, html.SelfClosingTagToken:
			name, hasAttr := z.TagName()
			if string(name) != "a" || !hasAttr {
				continue
			}
			for {
				key, val, more := z.TagAttr()
				if string(key) == "href" {
					if child, isDir, ok := childOf(page, folder, string(val)); ok {
						switch {
						case isDir && !seenDir[child]:
							seenDir[child] = true
							dirs = append(dirs, child)
						case !isDir && !seenFile[child]:
							seenFile[child] = true
							files = append(files, child)
						}
					}
				}
				if !more {
					break
				}
			}
		}
	}
}

// childOf says whether href, a link on the index page at page, names an entry right inside
// folder, and which: its name, unescaped, and whether it is a folder.
func childOf(page, folder *url.URL, href string) (name string, isDir, ok bool) {
	ref, err := url.Parse(strings.TrimSpace(href))
	if err != nil || ref.RawQuery != "" || ref.Fragment != "" && ref.Path == "" {
		return "", false, false // sort orders (?C=N;O=D) and anchors are not entries
	}
	u := page.ResolveReference(ref)
	if u.Scheme != folder.Scheme || u.Host != folder.Host || !strings.HasPrefix(u.Path, folder.Path) {
		return "", false, false
	}
	rest := strings.TrimPrefix(u.Path, folder.Path)
	isDir = strings.HasSuffix(rest, "/")
	rest = strings.TrimSuffix(rest, "/")
	if rest == "" || strings.Contains(rest, "/") || rest == "." || rest == ".." {
		return "", false, false // the folder itself, or deeper than one level
	}
	return rest, isDir, true
}

// statAll describes paths with HEADs, listStatConcurrency at a time, in their order.
func (h *HTTP) statAll(ctx context.Context, paths []string) ([]ObjectInfo, error) {
	infos := make([]ObjectInfo, len(paths))
	g, gctx := errgroup.WithContext(ctx)
	g.SetLimit(listStatConcurrency)
	for i, p := range paths {
		g.Go(func() error {
			info, err := h.Stat(gctx, p)
			infos[i] = info
			return err
		})
	}
	if err := g.Wait(); err != nil {
		return nil, err
	}
	return infos, nil
}

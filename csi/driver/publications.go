package driver

import (
	"fmt"
	"path/filepath"
	"sort"
	"sync"

	"github.com/strata-cache/strata/csi/statefile"
)

// publicationsFile is the node plugin's state file in its state folder.
const publicationsFile = "node-publications.json"

// publication is one target path that holds a Dataset: what a restarted plugin needs to
// answer NodeUnpublishVolume, which carries no volume context, and to know when the last
// target of a Dataset goes.
type publication struct {
	VolumeID string `json:"volumeID"`
	Target   string `json:"targetPath"`
	UID      string `json:"uid"`
	Pool     string `json:"pool"`
}

type publicationsState struct {
	Publications []publication `json:"publications"`
}

// publications is the persisted set of publications of this node, by target path.
type publications struct {
	path string

	mu       sync.Mutex
	byTarget map[string]publication
}

func loadPublications(stateDir string) (*publications, error) {
	p := &publications{path: filepath.Join(stateDir, publicationsFile), byTarget: map[string]publication{}}
	var st publicationsState
	if err := statefile.Load(p.path, &st); err != nil {
		return nil, err
	}
	for _, pub := range st.Publications {
		p.byTarget[pub.Target] = pub
	}
	return p, nil
}

func (p *publications) get(target string) (publication, bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pub, ok := p.byTarget[target]
	return pub, ok
}

// put records pub (replacing what its target held) and persists it.
func (p *publications) put(pub publication) error {
	p.mu.Lock()
	defer p.mu.Unlock()
	prev, had := p.byTarget[pub.Target]
	if had && prev == pub {
		return nil
	}
	p.byTarget[pub.Target] = pub
	if err := p.saveLocked(); err != nil {
		if had {
			p.byTarget[pub.Target] = prev
		} else {
			delete(p.byTarget, pub.Target)
		}
		return err
	}
	return nil
}

// remove forgets target, persists that, and returns what it held and how many other targets
// still hold the same Dataset.
func (p *publications) remove(target string) (pub publication, found bool, others int, err error) {
	p.mu.Lock()
	defer p.mu.Unlock()
	pub, found = p.byTarget[target]
	if !found {
		return publication{}, false, 0, nil
	}
	delete(p.byTarget, target)
	if err := p.saveLocked(); err != nil {
		p.byTarget[target] = pub
		return publication{}, false, 0, err
	}
	for _, other := range p.byTarget {
		if other.UID == pub.UID {
			others++
		}
	}
	return pub, true, others, nil
}

func (p *publications) saveLocked() error {
	st := publicationsState{Publications: make([]publication, 0, len(p.byTarget))}
	for _, pub := range p.byTarget {
		st.Publications = append(st.Publications, pub)
	}
	sort.Slice(st.Publications, func(i, j int) bool { return st.Publications[i].Target < st.Publications[j].Target })
	if err := statefile.Save(p.path, st); err != nil {
		return fmt.Errorf("saving the node's publications: %w", err)
	}
	return nil
}

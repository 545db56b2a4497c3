package driver

import (
	"fmt"
	"path/filepath"
	"sort"
	"sync"
	"time"

	"github.com/strata-cache/strata/csi/statefile"
)

// volumesFile is the controller's state file in its state folder.
const volumesFile = "controller-volumes.json"

// outputVolume is a volume CreateVolume made.
type outputVolume struct {
	ID            string            `json:"id"`
	Name          string            `json:"name"`
	CapacityBytes int64             `json:"capacityBytes"`
	Parameters    map[string]string `json:"parameters,omitempty"`
	Created       time.Time         `json:"created"`
}

type volumesState struct {
	Volumes []outputVolume `json:"volumes"`
}

// volumes is the persisted set of output volumes, by name and by id. Callers serialise
// changes (the controller holds its own lock across a check and the change).
type volumes struct {
	path string

	mu     sync.Mutex
	byName map[string]outputVolume
	byID   map[string]string // id -> name
}

func loadVolumes(stateDir string) (*volumes, error) {
	v := &volumes{path: filepath.Join(stateDir, volumesFile), byName: map[string]outputVolume{}, byID: map[string]string{}}
	var st volumesState
	if err := statefile.Load(v.path, &st); err != nil {
		return nil, err
	}
	for _, vol := range st.Volumes {
		v.byName[vol.Name] = vol
		v.byID[vol.ID] = vol.Name
	}
	return v, nil
}

func (v *volumes) byVolumeName(name string) (outputVolume, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	vol, ok := v.byName[name]
	return vol, ok
}

func (v *volumes) byVolumeID(id string) (outputVolume, bool) {
	v.mu.Lock()
	defer v.mu.Unlock()
	name, ok := v.byID[id]
	if !ok {
		return outputVolume{}, false
	}
	return v.byName[name], true
}

func (v *volumes) add(vol outputVolume) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	v.byName[vol.Name] = vol
	v.byID[vol.ID] = vol.Name
	if err := v.saveLocked(); err != nil {
		delete(v.byName, vol.Name)
		delete(v.byID, vol.ID)
		return err
	}
	return nil
}

// remove forgets the volume of id; an unknown id is no error.
func (v *volumes) remove(id string) error {
	v.mu.Lock()
	defer v.mu.Unlock()
	name, ok := v.byID[id]
	if !ok {
		return nil
	}
	vol := v.byName[name]
	delete(v.byName, name)
	delete(v.byID, id)
	if err := v.saveLocked(); err != nil {
		v.byName[name] = vol
		v.byID[id] = name
		return err
	}
	return nil
}

func (v *volumes) saveLocked() error {
	st := volumesState{Volumes: make([]outputVolume, 0, len(v.byName))}
	for _, vol := range v.byName {
		st.Volumes = append(st.Volumes, vol)
	}
	sort.Slice(st.Volumes, func(i, j int) bool { return st.Volumes[i].Name < st.Volumes[j].Name })
	if err := statefile.Save(v.path, st); err != nil {
		return fmt.Errorf("saving the controller's volumes: %w", err)
	}
	return nil
}

package driver

import (
	"crypto/rand"
	"encoding/hex"
	"fmt"
	"regexp"
	"strings"

	"k8s.io/apimachinery/pkg/util/validation"
)

// Keys the kubelet adds to a volume's context when the CSIDriver sets podInfoOnMount.
const (
	contextPodNamespace = "csi.storage.k8s.io/pod.namespace"
	contextPodName      = "csi.storage.k8s.io/pod.name"
	contextEphemeral    = "csi.storage.k8s.io/ephemeral"
)

// outputVolumePrefix starts the id of every volume CreateVolume makes, so that no id of an
// output volume can be read as a Dataset's "<namespace>/<name>/<uid>".
const outputVolumePrefix = "strata-output-"

var (
	outputVolumeID = regexp.MustCompile(`^` + outputVolumePrefix + `[0-9a-f]{32}$`)
	// uidToken is a Kubernetes UID: a UUID in practice, a short token of letters, digits and
	// dashes in any case. It becomes a file name on the worker, so nothing else is allowed.
	uidToken = regexp.MustCompile(`^[A-Za-z0-9]([A-Za-z0-9-]{0,62}[A-Za-z0-9])?$`)
)

// newOutputVolumeID returns a fresh, unguessable id for an output volume.
func newOutputVolumeID() (string, error) {
	var b [16]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generating a volume id: %w", err)
	}
	return outputVolumePrefix + hex.EncodeToString(b[:]), nil
}

// isOutputVolumeID says whether id is the id of a volume CreateVolume made.
func isOutputVolumeID(id string) bool { return outputVolumeID.MatchString(id) }

// datasetRef names a Dataset, as its volume handle "<namespace>/<name>/<uid>" does.
type datasetRef struct {
	Namespace, Name, UID string
}

func (d datasetRef) String() string { return d.Namespace + "/" + d.Name + " (uid " + d.UID + ")" }

// parseDatasetVolumeID reads a Dataset's volume handle and checks each part.
func parseDatasetVolumeID(id string) (datasetRef, error) {
	parts := strings.Split(id, "/")
	if len(parts) != 3 {
		return datasetRef{}, fmt.Errorf("volume id %q is not a Dataset's <namespace>/<name>/<uid>", id)
	}
	ref := datasetRef{Namespace: parts[0], Name: parts[1], UID: parts[2]}
	if errs := validation.IsDNS1123Label(ref.Namespace); len(errs) > 0 {
		return datasetRef{}, fmt.Errorf("volume id %q: namespace %q: %s", id, ref.Namespace, strings.Join(errs, "; "))
	}
	if errs := validation.IsDNS1123Subdomain(ref.Name); len(errs) > 0 {
		return datasetRef{}, fmt.Errorf("volume id %q: Dataset name %q: %s", id, ref.Name, strings.Join(errs, "; "))
	}
	if !uidToken.MatchString(ref.UID) {
		return datasetRef{}, fmt.Errorf("volume id %q: uid %q is not a UID (letters, digits and dashes, at most 64)", id, ref.UID)
	}
	return ref, nil
}

// validPoolName checks a TierPool's name as it is used here: one path element of the
// worker's socket folder.
func validPoolName(pool string) error {
	if errs := validation.IsDNS1123Label(pool); len(errs) > 0 {
		return fmt.Errorf("pool %q: %s", pool, strings.Join(errs, "; "))
	}
	return nil
}

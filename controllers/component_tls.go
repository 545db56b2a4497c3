package controllers

import (
	"strings"

	corev1 "k8s.io/api/core/v1"
	"k8s.io/utils/ptr"

	"github.com/strata-cache/strata/controllers/identity"
)

// ComponentTLS is how the pods the operator runs (masters, workers) get their certificates:
// each proves who it is to the operator's issuer with a token the kubelet projects into it,
// for the issuer's audience alone, and trusts the CA of the bundle ConfigMap.
type ComponentTLS struct {
	// CABundle is the ConfigMap of the operator's namespace with the CA certificate.
	CABundle string
	// IssuerURL is https://<issuer service>.<namespace>.svc:<port>.
	IssuerURL string
}

// CheckpointsPath is where the operator serves a pool's checkpoint settings to its workers.
const CheckpointsPath = "/v1/pools/{pool}/checkpoints"

// CheckpointsURL is where the workers of pool read their checkpoint settings.
func (t ComponentTLS) CheckpointsURL(pool string) string {
	return t.IssuerURL + strings.Replace(CheckpointsPath, "{pool}", pool, 1)
}

// Where the projected identity volume is mounted, and how long a projected token lives (the
// kubelet renews it at 80% of that; it is used only to ask for a certificate).
const (
	identityVolume      = "identity"
	identityDir         = "/var/run/strata/identity"
	identityTokenExpiry = 3600
)

// volume is the projected token and the CA bundle, one read-only volume.
func (t ComponentTLS) volume() corev1.Volume {
	return corev1.Volume{Name: identityVolume, VolumeSource: corev1.VolumeSource{Projected: &corev1.ProjectedVolumeSource{
		DefaultMode: ptr.To[int32](0o444),
		Sources: []corev1.VolumeProjection{
			{ServiceAccountToken: &corev1.ServiceAccountTokenProjection{
				Audience: identity.Audience, ExpirationSeconds: ptr.To[int64](identityTokenExpiry), Path: "token",
			}},
			{ConfigMap: &corev1.ConfigMapProjection{
				LocalObjectReference: corev1.LocalObjectReference{Name: t.CABundle},
				Items:                []corev1.KeyToPath{{Key: identity.BundleKey, Path: identity.BundleKey}},
			}},
		},
	}}}
}

func (ComponentTLS) volumeMount() corev1.VolumeMount {
	return corev1.VolumeMount{Name: identityVolume, MountPath: identityDir, ReadOnly: true}
}

// args are the component's flags for its certificate (pki.Flags).
func (t ComponentTLS) args() []string {
	return []string{
		"--ca-file=" + identityDir + "/" + identity.BundleKey,
		"--issuer=" + t.IssuerURL,
		"--token-file=" + identityDir + "/token",
	}
}

// Package v1alpha1 contains the Strata API: Dataset, Lineage, CachePolicy and TierPool in the
// group data.strata.dev.
//
// Validation lives in the schema itself (OpenAPI and CEL rules, see the +kubebuilder markers), so
// the API server rejects a bad spec at admission with a message that says what to fix; no webhook
// is needed for anything these rules can express.
//
// +kubebuilder:object:generate=true
// +groupName=data.strata.dev
package v1alpha1

import (
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// GroupVersion is the group and version of every kind in this package.
var GroupVersion = schema.GroupVersion{Group: "data.strata.dev", Version: "v1alpha1"}

var (
	// SchemeBuilder registers the kinds of this package into a scheme.
	SchemeBuilder = runtime.NewSchemeBuilder(addKnownTypes)
	// AddToScheme adds the kinds of this package to a scheme.
	AddToScheme = SchemeBuilder.AddToScheme

	// knownTypes is filled by the init function of each kind's file.
	knownTypes []runtime.Object
)

func addKnownTypes(s *runtime.Scheme) error {
	s.AddKnownTypes(GroupVersion, knownTypes...)
	metav1.AddToGroupVersion(s, GroupVersion)
	return nil
}

package understore

import (
	"fmt"
	"net/http"

	"github.com/minio/minio-go/v7/pkg/credentials"
)

// assumedRole is minio-go's web identity provider with its failures named: a token the STS
// endpoint refuses, or an endpoint that does not answer, reaches the reader as an error of the
// store that says which role could not be assumed where, not as a bare STS response.
type assumedRole struct {
	*credentials.STSWebIdentity
}

var _ credentials.Provider = assumedRole{}

func newAssumedRole(w WebIdentity, transport http.RoundTripper) assumedRole {
	token := w.Token
	sts := &credentials.STSWebIdentity{
		STSEndpoint: w.STSEndpoint,
		RoleARN:     w.RoleARN,
		// The token is the one this store was opened with: a renewed token opens a new store
		// (the mounter replaces a store whose credentials change), so none is read from disk.
		GetWebIDTokenExpiry: func() (*credentials.WebIdentityToken, error) {
			return &credentials.WebIdentityToken{Token: token}, nil
		},
	}
	if transport != nil {
		sts.Client = &http.Client{Transport: transport}
	}
	return assumedRole{sts}
}

// RetrieveWithCredContext implements credentials.Provider.
func (a assumedRole) RetrieveWithCredContext(cc *credentials.CredContext) (credentials.Value, error) {
	v, err := a.STSWebIdentity.RetrieveWithCredContext(cc)
	if err != nil {
		return v, &roleRefusedError{Role: a.RoleARN, STSEndpoint: a.STSEndpoint, Err: err}
	}
	return v, nil
}

// Retrieve implements credentials.Provider.
func (a assumedRole) Retrieve() (credentials.Value, error) {
	return a.RetrieveWithCredContext(nil)
}

// roleRefusedError is a failure to assume a role with a web identity token.
type roleRefusedError struct {
	Role, STSEndpoint string
	Err               error
}

func (e *roleRefusedError) Error() string {
	hint := "the role's trust policy must accept the token's issuer, audience and subject"
	if unreachable(e.Err) {
		hint = "check that the STS endpoint is right and reachable from the node"
	}
	return fmt.Sprintf("assuming role %s with the web identity token at %s: %v (%s)", e.Role, e.STSEndpoint, e.Err, hint)
}

func (e *roleRefusedError) Unwrap() error { return e.Err }

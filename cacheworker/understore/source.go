package understore

import (
	"context"
	"crypto/tls"
	"encoding/base64"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"
)

// The keys of Source.Credentials, as a Dataset's credentials Secret holds them.
const (
	CredentialAccessKeyID     = "accessKeyID"
	CredentialSecretAccessKey = "secretAccessKey"
	CredentialSessionToken    = "sessionToken"
	CredentialUsername        = "username"
	CredentialPassword        = "password"
	CredentialToken           = "token"
	// A web identity for s3:// (see WebIdentity): the token, the role it is traded for and,
	// optionally, where (default: the source's endpoint, else AWS's STS of its region).
	CredentialWebIdentityToken = "webIdentityToken"
	CredentialRoleARN          = "roleARN"
	CredentialSTSEndpoint      = "stsEndpoint"
)

// DefaultS3Endpoint is where s3:// sources are read when no endpoint is given: AWS S3, over HTTPS.
const DefaultS3Endpoint = "s3.amazonaws.com"

// Source is a Dataset's spec.source with the keys of its credentials Secret: what Open needs
// to pick and configure a store.
type Source struct {
	// URI is s3://bucket/prefix, file:///path, pvc://claim/path or http(s)://host/path.
	URI string
	// Endpoint of an S3-compatible server, http://host:port or https://host[:port]; empty means
	// AWS S3. For pvc:// sources, the claim server the operator runs for the Dataset
	// (https://host:port), which it names in the Dataset's volume; only these two take one.
	Endpoint string
	// Region of an S3 bucket; empty means DefaultS3Region.
	Region string
	// Credentials are the Secret's keys: accessKeyID and secretAccessKey (and sessionToken), or
	// webIdentityToken and roleARN (and stsEndpoint), for s3://, none for a public bucket, read
	// anonymously; token, or username and password, for http(s)://; token (the claim server's) for
	// pvc://. Other keys are ignored.
	Credentials map[string]string
	// FileRoots are the directories file:// sources must lie under (the TierPool's
	// fileSourceRoots); none allows none.
	FileRoots []string
	// ClaimServerTLS is how a pvc:// source's claim server is spoken to: the caller's
	// certificate, the CA it trusts and the role the server must have. Open sets the server's
	// name. Required for pvc://, ignored by the others.
	ClaimServerTLS *tls.Config
	// ClaimServerName is the name the claim server's certificate must be for; empty means the
	// endpoint's host, which is its Service's name.
	ClaimServerName string
}

// Open returns the store src names: S3 for s3://, Local for file://, ClaimStore for pvc://,
// HTTP for http(s)://. It
// checks the URI and the credentials but does not contact the store, so a store that is
// unreachable or refuses the credentials is found by the first Stat, List or read. A store
// that holds resources (Local) implements io.Closer.
func Open(ctx context.Context, src Source) (Store, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("opening %s: %w", src.URI, err)
	}
	scheme, rest, ok := strings.Cut(src.URI, "://")
	if !ok {
		return nil, invalidSource(src.URI, "want s3://bucket/prefix, file:///path, pvc://claim/path, http:// or https:// followed by a host and path")
	}
	if src.Endpoint != "" && scheme != "s3" && scheme != "pvc" {
		return nil, invalidSource(src.URI, "an endpoint (%s) only applies to s3:// sources", src.Endpoint)
	}
	switch scheme {
	case "s3":
		return openS3(src, rest)
	case "file":
		return openLocal(src)
	case "pvc":
		return openClaim(src)
	case "http", "https":
		return openHTTP(src)
	default:
		return nil, invalidSource(src.URI, "unsupported scheme %q: want s3://, file://, pvc://, http:// or https://", scheme)
	}
}

func invalidSource(uri, format string, args ...any) error {
	return &Error{Op: "connect", Store: uri, Kind: ErrInvalidPath, Err: fmt.Errorf(format, args...)}
}

// openS3 opens s3://bucket/prefix; rest is what follows "s3://". The prefix is taken as
// written, without percent-decoding, since S3 keys are literal.
func openS3(src Source, rest string) (Store, error) {
	bucket, prefix, _ := strings.Cut(rest, "/")
	if bucket == "" {
		return nil, invalidSource(src.URI, "no bucket: want s3://bucket or s3://bucket/prefix")
	}
	endpoint, secure, err := s3Endpoint(src.Endpoint)
	if err != nil {
		return nil, invalidSource(src.URI, "%w", err)
	}
	cfg := S3Config{Endpoint: endpoint, Secure: secure, Bucket: bucket, Prefix: prefix, Region: src.Region}
	creds := src.Credentials
	signing := signWithKeys
	if creds[CredentialWebIdentityToken] != "" || creds[CredentialRoleARN] != "" {
		signing = signAsRole
	}
	if kind, err := signing(&cfg, src); err != nil {
		return nil, &Error{Op: "connect", Store: "s3://" + rest, Endpoint: endpoint, Kind: kind, Err: err}
	}
	s, err := NewS3(cfg)
	if err != nil {
		return nil, err // not a typed nil in the interface
	}
	return s, nil
}

// signWithKeys has cfg sign with the access keys of src's credentials; with none at all, a
// public bucket is read without signing (a Dataset without spec.source.secretRef). A Secret
// that holds some keys and not others is a mistake, of the kind returned.
func signWithKeys(cfg *S3Config, src Source) (kind, _ error) {
	creds := src.Credentials
	cfg.Anonymous = creds[CredentialAccessKeyID] == "" && creds[CredentialSecretAccessKey] == "" && creds[CredentialSessionToken] == ""
	var missing []string
	for _, k := range []string{CredentialAccessKeyID, CredentialSecretAccessKey} {
		if creds[k] == "" {
			missing = append(missing, k)
		}
	}
	if !cfg.Anonymous && len(missing) > 0 {
		return ErrMissingCredentials, fmt.Errorf("no %s in the credentials: set spec.source.secretRef to a Secret with the keys %s and %s (and %s for temporary credentials)",
			strings.Join(missing, " or "), CredentialAccessKeyID, CredentialSecretAccessKey, CredentialSessionToken)
	}
	cfg.AccessKey, cfg.SecretKey, cfg.SessionToken = creds[CredentialAccessKeyID], creds[CredentialSecretAccessKey], creds[CredentialSessionToken]
	return nil, nil
}

// signAsRole has cfg sign as the role of src's web identity credentials, assumed at their STS
// endpoint, or says what is wrong with them, of the kind returned.
func signAsRole(cfg *S3Config, src Source) (kind, _ error) {
	creds := src.Credentials
	if creds[CredentialAccessKeyID] != "" || creds[CredentialSecretAccessKey] != "" {
		return ErrInvalidPath, fmt.Errorf("the credentials have both keys (%s) and a web identity (%s): keep one",
			CredentialAccessKeyID, CredentialWebIdentityToken)
	}
	token, role := creds[CredentialWebIdentityToken], creds[CredentialRoleARN]
	if token == "" || role == "" {
		return ErrMissingCredentials, fmt.Errorf("a web identity needs both %s and %s in the credentials; spec.source.webIdentity makes the operator keep both",
			CredentialWebIdentityToken, CredentialRoleARN)
	}
	sts, err := stsEndpoint(creds[CredentialSTSEndpoint], src.Endpoint, src.Region)
	if err != nil {
		return ErrInvalidPath, err
	}
	cfg.WebIdentity = &WebIdentity{Token: token, RoleARN: role, STSEndpoint: sts}
	return nil, nil
}

// stsEndpoint is where a web identity token is traded: the one given; else the source's
// endpoint, since an S3-compatible server (MinIO) serves STS beside S3; else AWS's STS, in the
// source's region when it has one.
func stsEndpoint(given, sourceEndpoint, region string) (string, error) {
	switch {
	case given != "":
		u, err := url.Parse(given)
		if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" || strings.Trim(u.Path, "/") != "" {
			return "", fmt.Errorf("STS endpoint %q: want http://host:port or https://host[:port]", given)
		}
		return given, nil
	case sourceEndpoint != "":
		return sourceEndpoint, nil
	case region != "":
		return "https://sts." + region + ".amazonaws.com", nil
	default:
		return "https://sts.amazonaws.com", nil
	}
}

// s3Endpoint turns a Dataset's endpoint URL into minio-go's host[:port] and TLS flag.
func s3Endpoint(endpoint string) (string, bool, error) {
	if endpoint == "" {
		return DefaultS3Endpoint, true, nil
	}
	u, err := url.Parse(endpoint)
	if err != nil {
		return "", false, fmt.Errorf("endpoint %q: %w", endpoint, err)
	}
	if u.Scheme != "http" && u.Scheme != "https" || u.Host == "" {
		return "", false, fmt.Errorf("endpoint %q: want http://host:port or https://host[:port]", endpoint)
	}
	if strings.Trim(u.Path, "/") != "" || u.RawQuery != "" || u.Fragment != "" || u.User != nil {
		return "", false, fmt.Errorf("endpoint %q: S3 endpoints take no path, query or user; put the bucket and prefix in the URI", endpoint)
	}
	return u.Host, u.Scheme == "https", nil
}

// openLocal opens file:///path under the allowed roots.
func openLocal(src Source) (Store, error) {
	u, err := url.Parse(src.URI)
	if err != nil {
		return nil, invalidSource(src.URI, "%w", err)
	}
	if u.Host != "" && u.Host != "localhost" || !strings.HasPrefix(u.Path, "/") {
		return nil, invalidSource(src.URI, "a file:// source must be an absolute path on the node: file:///path")
	}
	if u.RawQuery != "" || u.Fragment != "" {
		return nil, invalidSource(src.URI, "a file:// source takes no query or fragment")
	}
	l, err := NewLocal(LocalConfig{Dir: u.Path, AllowedRoots: src.FileRoots})
	if err != nil {
		return nil, err
	}
	return l, nil
}

// openClaim opens pvc://claim/path through the claim server the operator runs for it. Which
// claim and folder it serves is fixed where the server runs; the URI only names the source.
func openClaim(src Source) (Store, error) {
	if src.Endpoint == "" {
		return nil, invalidSource(src.URI, "no claim server: pvc:// sources are read through the server the operator runs in the Dataset's namespace, named by the Dataset's PersistentVolume")
	}
	token := src.Credentials[CredentialToken]
	if token == "" {
		return nil, &Error{Op: "connect", Store: src.URI, Endpoint: src.Endpoint, Kind: ErrMissingCredentials,
			Err: errors.New("no " + CredentialToken + " for the claim server: the Dataset's PersistentVolume must name the claim-server Secret the operator made")}
	}
	if src.ClaimServerTLS == nil {
		return nil, &Error{Op: "connect", Store: src.URI, Endpoint: src.Endpoint, Kind: ErrMissingCredentials,
			Err: errors.New("no certificate to speak to the claim server with: claim servers accept only Strata's workers and operator, over mutual TLS")}
	}
	c, err := NewClaimStore(src.URI, src.Endpoint, token, src.ClaimServerName, src.ClaimServerTLS)
	if err != nil {
		return nil, err
	}
	return c, nil
}

// openHTTP opens http(s)://host/path, sending a bearer token or basic credentials if given.
func openHTTP(src Source) (Store, error) {
	creds := src.Credentials
	header := http.Header{}
	token, user, pass := creds[CredentialToken], creds[CredentialUsername], creds[CredentialPassword]
	switch {
	case token != "" && (user != "" || pass != ""):
		return nil, invalidSource(src.URI, "the credentials have both %s and %s/%s: keep one", CredentialToken, CredentialUsername, CredentialPassword)
	case token != "":
		header.Set("Authorization", "Bearer "+token)
	case user != "" && pass != "":
		header.Set("Authorization", "Basic "+base64.StdEncoding.EncodeToString([]byte(user+":"+pass)))
	case user != "" || pass != "":
		missing := CredentialPassword
		if user == "" {
			missing = CredentialUsername
		}
		return nil, &Error{Op: "connect", Store: src.URI, Kind: ErrMissingCredentials,
			Err: errors.New("no " + missing + " in the credentials: basic authentication needs both " + CredentialUsername + " and " + CredentialPassword + " in the Secret of spec.source.secretRef")}
	}
	h, err := NewHTTP(HTTPConfig{BaseURL: src.URI, Header: header})
	if err != nil {
		return nil, err
	}
	return h, nil
}

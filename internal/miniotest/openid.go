package miniotest

import (
	"crypto"
	"crypto/rand"
	"crypto/rsa"
	"crypto/sha1" //nolint:gosec // MinIO names a provider's role by the SHA-1 of its client ID
	"crypto/sha256"
	"encoding/base64"
	"encoding/json"
	"math/big"
	"net/http"
	"net/http/httptest"
	"time"
)

// OpenIDProvider serves an OpenID Connect discovery document and key set, so that a MinIO
// started with its Env trades tokens signed by those keys for credentials
// (AssumeRoleWithWebIdentity), as AWS STS does for a cluster's ServiceAccount tokens.
type OpenIDProvider struct {
	// URL is the provider's base URL; its discovery document is at
	// URL/.well-known/openid-configuration.
	URL string
}

// ServeOpenID serves jwks, a JSON Web Key Set, as the keys of issuer, until tb ends.
func ServeOpenID(tb TB, issuer string, jwks []byte) *OpenIDProvider {
	tb.Helper()
	mux := http.NewServeMux()
	srv := httptest.NewServer(mux)
	tb.Cleanup(srv.Close)
	mux.HandleFunc("/.well-known/openid-configuration", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(map[string]any{
			"issuer":                                issuer,
			"jwks_uri":                              srv.URL + "/keys",
			"response_types_supported":              []string{"id_token"},
			"subject_types_supported":               []string{"public"},
			"id_token_signing_alg_values_supported": []string{"RS256"},
		})
	})
	mux.HandleFunc("/keys", func(w http.ResponseWriter, _ *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write(jwks)
	})
	return &OpenIDProvider{URL: srv.URL}
}

// Env is the MinIO environment that accepts p's tokens issued for the audience clientID and
// gives their bearers the policy named (a canned one, such as readwrite), as the role
// OpenIDRoleARN(clientID).
func (p *OpenIDProvider) Env(clientID, policy string) []string {
	return []string{
		"MINIO_IDENTITY_OPENID_CONFIG_URL=" + p.URL + "/.well-known/openid-configuration",
		"MINIO_IDENTITY_OPENID_CLIENT_ID=" + clientID,
		"MINIO_IDENTITY_OPENID_ROLE_POLICY=" + policy,
	}
}

// OpenIDRoleARN is the role MinIO makes for an OpenID provider with a role policy: it names
// the role by a hash of the provider's client ID, so that it survives restarts.
func OpenIDRoleARN(clientID string) string {
	sum := sha1.Sum([]byte(clientID)) //nolint:gosec // MinIO's naming, not a security measure
	return "arn:minio:iam:::role/" + base64.RawURLEncoding.EncodeToString(sum[:])
}

// TokenSigner signs JWTs with an RSA key of its own: an identity provider for tests that run
// without a Kubernetes API server.
type TokenSigner struct {
	key *rsa.PrivateKey
	kid string
}

// NewTokenSigner makes a signer with a new key.
func NewTokenSigner(tb TB) *TokenSigner {
	tb.Helper()
	key, err := rsa.GenerateKey(rand.Reader, 2048)
	if err != nil {
		tb.Fatalf("generating a signing key: %v", err)
	}
	return &TokenSigner{key: key, kid: "strata-test"}
}

// JWKS is the signer's public key as a JSON Web Key Set.
func (s *TokenSigner) JWKS() []byte {
	b64 := base64.RawURLEncoding.EncodeToString
	jwks, _ := json.Marshal(map[string]any{"keys": []map[string]string{{
		"kty": "RSA", "alg": "RS256", "use": "sig", "kid": s.kid,
		"n": b64(s.key.N.Bytes()), "e": b64(big.NewInt(int64(s.key.E)).Bytes()),
	}}})
	return jwks
}

// Sign returns an RS256 JWT for subject, issued for audience by issuer, valid for ttl (expired
// already if ttl is negative).
func (s *TokenSigner) Sign(tb TB, issuer, audience, subject string, ttl time.Duration) string {
	tb.Helper()
	b64 := base64.RawURLEncoding.EncodeToString
	now := time.Now()
	header, _ := json.Marshal(map[string]string{"alg": "RS256", "typ": "JWT", "kid": s.kid})
	claims, err := json.Marshal(map[string]any{
		"iss": issuer, "aud": audience, "sub": subject,
		"iat": now.Unix(), "nbf": now.Add(-time.Minute).Unix(), "exp": now.Add(ttl).Unix(),
	})
	if err != nil {
		tb.Fatal(err)
	}
	signed := b64(header) + "." + b64(claims)
	digest := sha256.Sum256([]byte(signed))
	sig, err := rsa.SignPKCS1v15(rand.Reader, s.key, crypto.SHA256, digest[:])
	if err != nil {
		tb.Fatalf("signing a token: %v", err)
	}
	return signed + "." + b64(sig)
}

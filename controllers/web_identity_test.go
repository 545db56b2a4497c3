package controllers

import (
	"encoding/base64"
	"encoding/json"
	"io"
	"net/http"
	"strings"

	. "github.com/onsi/gomega"
	"k8s.io/client-go/rest"
)

// apiServerIssuer is the envtest API server's ServiceAccount token issuer and its key set, as
// its discovery endpoints publish them to relying parties (AWS STS, MinIO).
func apiServerIssuer() (issuer string, jwks []byte) {
	hc, err := rest.HTTPClientFor(testEnv.Config)
	Expect(err).NotTo(HaveOccurred())
	get := func(path string) []byte {
		resp, err := hc.Get(strings.TrimSuffix(testEnv.Config.Host, "/") + path)
		Expect(err).NotTo(HaveOccurred())
		defer func() { _ = resp.Body.Close() }()
		body, err := io.ReadAll(resp.Body)
		Expect(err).NotTo(HaveOccurred())
		Expect(resp.StatusCode).To(Equal(http.StatusOK), "GET %s: %s", path, body)
		return body
	}
	var discovery struct {
		Issuer string `json:"issuer"`
	}
	Expect(json.Unmarshal(get("/.well-known/openid-configuration"), &discovery)).To(Succeed())
	Expect(discovery.Issuer).NotTo(BeEmpty())
	return discovery.Issuer, get("/openid/v1/jwks")
}

// tokenClaims are the claims of a JWT, read without checking its signature (the under-store
// checks that).
func tokenClaims(token string) map[string]any {
	parts := strings.Split(token, ".")
	Expect(parts).To(HaveLen(3), "a JWT has three parts")
	payload, err := base64.RawURLEncoding.DecodeString(parts[1])
	Expect(err).NotTo(HaveOccurred())
	claims := map[string]any{}
	Expect(json.Unmarshal(payload, &claims)).To(Succeed())
	return claims
}

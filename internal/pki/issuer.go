package pki

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
)

// IssuePath is where the operator's issuer takes certificate requests.
const IssuePath = "/v1/certificates"

// maxIssueRequest bounds a request's body: a CSR and a token are a few KiB.
const maxIssueRequest = 64 << 10

// ErrNotAttested is returned by an Attester for a token it does not take for a component's.
var ErrNotAttested = errors.New("not attested")

// Attester tells which component presented a token, and what its certificate must say.
type Attester interface {
	Attest(ctx context.Context, token string) (Leaf, error)
}

type issueRequest struct {
	// CSR is the DER certificate request (base64 in JSON); only its key is used, the identity
	// comes from the token.
	CSR   []byte `json:"csr"`
	Token string `json:"token"`
}

type issueResponse struct {
	Certificate string `json:"certificate"`
}

// Issuer is the operator's HTTPS endpoint that certifies the key of a component that proves who
// it is with a projected ServiceAccount token.
type Issuer struct {
	CA       *CA
	Attester Attester
	Log      logr.Logger
	// Now is time.Now unless a test sets it.
	Now func() time.Time
	// Issued counts certificates by role and Refused requests by reason; both may be nil.
	Issued  *prometheus.CounterVec
	Refused *prometheus.CounterVec
}

// NewIssuerMetrics registers the issuer's counters with reg.
func NewIssuerMetrics(reg prometheus.Registerer) (issued, refused *prometheus.CounterVec, err error) {
	issued = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "strata_operator_certificates_issued_total",
		Help: "Certificates the operator's issuer signed, by the role of the component.",
	}, []string{"role"})
	refused = prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "strata_operator_certificate_requests_refused_total",
		Help: "Certificate requests the operator's issuer refused, by reason (malformed, unattested, internal).",
	}, []string{"reason"})
	for _, c := range []prometheus.Collector{issued, refused} {
		if err := reg.Register(c); err != nil {
			return nil, nil, fmt.Errorf("registering the issuer's metrics: %w", err)
		}
	}
	return issued, refused, nil
}

func (is *Issuer) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodPost {
		w.Header().Set("Allow", http.MethodPost)
		http.Error(w, "POST a certificate request", http.StatusMethodNotAllowed)
		return
	}
	var req issueRequest
	if err := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxIssueRequest)).Decode(&req); err != nil {
		is.refuse(w, r, "malformed", http.StatusBadRequest, fmt.Errorf("reading the request: %w", err))
		return
	}
	csr, err := x509.ParseCertificateRequest(req.CSR)
	if err == nil {
		err = csr.CheckSignature()
	}
	if err != nil {
		is.refuse(w, r, "malformed", http.StatusBadRequest, fmt.Errorf("the certificate request: %w", err))
		return
	}
	leaf, err := is.Attester.Attest(r.Context(), req.Token)
	if errors.Is(err, ErrNotAttested) {
		is.refuse(w, r, "unattested", http.StatusForbidden, err)
		return
	}
	if err != nil {
		is.refuse(w, r, "internal", http.StatusServiceUnavailable, err)
		return
	}
	now := time.Now
	if is.Now != nil {
		now = is.Now
	}
	cert, err := is.CA.Issue(csr.PublicKey, leaf, now())
	if err != nil {
		is.refuse(w, r, "internal", http.StatusInternalServerError, err)
		return
	}
	if is.Issued != nil {
		is.Issued.WithLabelValues(string(leaf.Identity.Role)).Inc()
	}
	is.Log.V(1).Info("issued a certificate", "identity", leaf.Identity, "dns", leaf.DNSNames, "ips", leaf.IPs, "from", r.RemoteAddr)
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(issueResponse{Certificate: string(cert)})
}

func (is *Issuer) refuse(w http.ResponseWriter, r *http.Request, reason string, code int, err error) {
	if is.Refused != nil {
		is.Refused.WithLabelValues(reason).Inc()
	}
	is.Log.Info("refused a certificate request", "reason", reason, "from", r.RemoteAddr, "error", err.Error())
	http.Error(w, err.Error(), code)
}

// ServerConfigOptionalClient is TLS 1.3 with the credentials' certificate that verifies a
// client certificate when one is given and lets a client without one in: the operator's port,
// where components with no certificate yet ask the issuer for one (proving themselves with a
// token) and workers read their settings with theirs. Each handler decides on what it got.
func (c *Credentials) ServerConfigOptionalClient() *tls.Config {
	cfg := c.ServerConfig()
	cfg.ClientAuth = tls.VerifyClientCertIfGiven
	cfg.VerifyConnection = nil
	return cfg
}

// IssuerClient obtains certificates from the operator's issuer with the token the kubelet
// projects into the pod (read afresh each time, as the kubelet rotates it).
type IssuerClient struct {
	url       string
	tokenFile string
	http      *http.Client
}

// NewIssuerClient returns a client of the issuer at baseURL (https://host:port), which must
// present an operator's certificate from a CA of trust.
func NewIssuerClient(baseURL, tokenFile string, trust *x509.CertPool) (*IssuerClient, error) {
	if !strings.HasPrefix(baseURL, "https://") {
		return nil, fmt.Errorf("issuer URL %q must be https://host:port", baseURL)
	}
	cfg := (&Credentials{trust: trust}).ClientConfig(RoleOperator)
	cfg.GetClientCertificate = nil
	return &IssuerClient{
		url:       strings.TrimSuffix(baseURL, "/") + IssuePath,
		tokenFile: tokenFile,
		http:      &http.Client{Timeout: 30 * time.Second, Transport: &http.Transport{TLSClientConfig: cfg}},
	}, nil
}

// Obtain implements Obtainer.
func (c *IssuerClient) Obtain(ctx context.Context, csr []byte) ([]byte, error) {
	token, err := os.ReadFile(c.tokenFile)
	if err != nil {
		return nil, fmt.Errorf("reading the pod's ServiceAccount token: %w", err)
	}
	body, err := json.Marshal(issueRequest{CSR: csr, Token: strings.TrimSpace(string(token))})
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.url, bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := c.http.Do(req)
	if err != nil {
		return nil, fmt.Errorf("asking %s for a certificate: %w", c.url, err)
	}
	defer func() { _ = resp.Body.Close() }()
	raw, err := io.ReadAll(io.LimitReader(resp.Body, maxIssueRequest))
	if err != nil {
		return nil, fmt.Errorf("reading the answer of %s: %w", c.url, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("the issuer %s refused: %s: %s", c.url, resp.Status, strings.TrimSpace(string(raw)))
	}
	var out issueResponse
	if err := json.Unmarshal(raw, &out); err != nil {
		return nil, fmt.Errorf("decoding the answer of %s: %w", c.url, err)
	}
	return []byte(out.Certificate), nil
}

// LocalObtainer certifies keys for one identity with a CA at hand: the operator's own.
type LocalObtainer struct {
	CA   *CA
	Leaf Leaf
}

// Obtain implements Obtainer.
func (o LocalObtainer) Obtain(_ context.Context, csrDER []byte) ([]byte, error) {
	csr, err := x509.ParseCertificateRequest(csrDER)
	if err != nil {
		return nil, fmt.Errorf("reading the certificate request: %w", err)
	}
	return o.CA.Issue(csr.PublicKey, o.Leaf, time.Now())
}

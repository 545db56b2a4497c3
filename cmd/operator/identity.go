package main

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"time"

	ctrl "sigs.k8s.io/controller-runtime"
	"sigs.k8s.io/controller-runtime/pkg/client"
	crmetrics "sigs.k8s.io/controller-runtime/pkg/metrics"

	"github.com/strata-cache/strata/controllers"
	"github.com/strata-cache/strata/controllers/identity"
	"github.com/strata-cache/strata/internal/pki"
)

// identities are the operator's side of component identity: the CA, the operator's own
// certificate, and what the pods it runs need to be certified.
type identities struct {
	opts         identityOptions
	namespace    string
	ca           *pki.CA
	creds        *pki.Credentials
	renewer      *pki.Renewer
	api          client.Client
	componentTLS controllers.ComponentTLS
}

// start makes or reads the CA and certifies the operator.
func (o identityOptions) start(ctx context.Context, api client.Client, namespace string) (*identities, error) {
	if namespace == "" {
		return nil, errors.New("--namespace (or $POD_NAMESPACE) is required: Strata's CA lives in the operator's namespace")
	}
	var ca *pki.CA
	var err error
	if o.caFromCertManager {
		ca, err = identity.WaitForCA(ctx, api, namespace, o.caSecret, o.caBundle, ctrl.Log.WithName("tls"))
	} else {
		ca, err = identity.EnsureCA(ctx, api, namespace, o.caSecret, o.caBundle)
	}
	if err != nil {
		return nil, err
	}
	svc := o.issuerService + "." + namespace + ".svc"
	creds := pki.NewCredentials(ca.Pool())
	renewer := &pki.Renewer{
		Credentials: creds,
		Source: pki.LocalObtainer{CA: ca, Leaf: pki.Leaf{
			Identity: pki.Operator(),
			DNSNames: []string{o.issuerService, o.issuerService + "." + namespace, svc, svc + ".cluster.local"},
		}},
		Log: ctrl.Log.WithName("tls"),
	}
	if err := renewer.First(ctx); err != nil {
		return nil, err
	}
	return &identities{
		opts: o, namespace: namespace, ca: ca, creds: creds, renewer: renewer, api: api,
		componentTLS: controllers.ComponentTLS{CABundle: o.caBundle, IssuerURL: fmt.Sprintf("https://%s:%d", svc, o.issuerPort)},
	}, nil
}

// everyReplica is a runnable that every operator replica runs, leader or not.
type everyReplica func(context.Context) error

func (f everyReplica) Start(ctx context.Context) error { return f(ctx) }
func (everyReplica) NeedLeaderElection() bool          { return false }

// addTo runs the renewal of the operator's certificate and its HTTPS port on every replica (a
// component may ask any of them): the issuer, and the pools' checkpoint settings for their
// workers.
func (ids *identities) addTo(mgr ctrl.Manager, master *controllers.MasterSpec, workers *controllers.WorkerReconciler) error {
	if err := mgr.Add(everyReplica(func(ctx context.Context) error { ids.renewer.Run(ctx); return nil })); err != nil {
		return fmt.Errorf("adding the certificate renewal: %w", err)
	}
	components := []identity.Component{identity.Worker(controllers.WorkerServiceAccountName)}
	if master != nil {
		components = append(components, identity.Master(controllers.MasterServiceAccountName, master.Name))
	}
	if ids.opts.csiNodeAccount != "" {
		components = append(components, identity.CSINode(ids.opts.csiNodeAccount))
	}
	issued, refused, err := pki.NewIssuerMetrics(crmetrics.Registry)
	if err != nil {
		return err
	}
	issuer := &pki.Issuer{
		CA:       ids.ca,
		Attester: &identity.PodAttester{Client: ids.api, Namespace: ids.namespace, Components: components},
		Log:      ctrl.Log.WithName("issuer"),
		Issued:   issued, Refused: refused,
	}
	mux := http.NewServeMux()
	mux.Handle(pki.IssuePath, issuer)
	if workers != nil {
		mux.Handle("GET "+controllers.CheckpointsPath, workers.CheckpointsHandler(ctrl.Log.WithName("checkpoint-settings")))
	}
	srv := &http.Server{
		Addr: ids.opts.issuerAddr, Handler: mux, TLSConfig: ids.creds.ServerConfigOptionalClient(),
		ReadHeaderTimeout: 10 * time.Second, ReadTimeout: 30 * time.Second, WriteTimeout: 30 * time.Second,
	}
	return mgr.Add(everyReplica(func(ctx context.Context) error {
		errc := make(chan error, 1)
		go func() { errc <- srv.ListenAndServeTLS("", "") }()
		select {
		case err := <-errc:
			return fmt.Errorf("serving the certificate issuer on %s: %w", ids.opts.issuerAddr, err)
		case <-ctx.Done():
		}
		sctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		if err := srv.Shutdown(sctx); err != nil {
			return fmt.Errorf("stopping the certificate issuer: %w", err)
		}
		if err := <-errc; !errors.Is(err, http.ErrServerClosed) {
			return fmt.Errorf("serving the certificate issuer on %s: %w", ids.opts.issuerAddr, err)
		}
		return nil
	}))
}

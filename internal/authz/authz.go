package authz

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"sort"

	"github.com/go-logr/logr"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/strata-cache/strata/internal/pki"
)

// Rule says who may call one method.
type Rule struct {
	Roles []pki.Role
	// ActsFor, when set, returns the component a request acts for (a worker id, a master's
	// Raft id): a worker or a master may call the method only for itself (pki.Identity.Self);
	// the operator, which manages them all, for any.
	ActsFor func(req any) string
}

// Allow is a rule for roles.
func Allow(roles ...pki.Role) Rule { return Rule{Roles: roles} }

// Policy maps full method names (/package.Service/Method) to their rules.
type Policy map[string]Rule

// Methods are the full method names of services, sorted: what a policy must name.
func Methods(services ...grpc.ServiceDesc) []string {
	var out []string
	for _, sd := range services {
		for _, m := range sd.Methods {
			out = append(out, "/"+sd.ServiceName+"/"+m.MethodName)
		}
		for _, s := range sd.Streams {
			out = append(out, "/"+sd.ServiceName+"/"+s.StreamName)
		}
	}
	sort.Strings(out)
	return out
}

// Missing are the methods of services the policy does not name.
func (p Policy) Missing(services ...grpc.ServiceDesc) []string {
	var out []string
	for _, m := range Methods(services...) {
		if _, ok := p[m]; !ok {
			out = append(out, m)
		}
	}
	return out
}

// Check says what the policy and services disagree on: a method of the services that no rule
// names (closed to everyone, probably by mistake) or a rule for a method that no service has.
func (p Policy) Check(services ...grpc.ServiceDesc) error {
	methods := Methods(services...)
	var errs []error
	for _, m := range p.Missing(services...) {
		errs = append(errs, fmt.Errorf("method %s is in no rule of the policy: say who may call it", m))
	}
	for m := range p {
		if !slices.Contains(methods, m) {
			errs = append(errs, fmt.Errorf("the policy names %s, which no service has", m))
		}
	}
	return errors.Join(errs...)
}

// Caller is the identity of the client of ctx's call, from its verified certificate.
func Caller(ctx context.Context) (pki.Identity, error) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return pki.Identity{}, fmt.Errorf("%w: the call has no peer", pki.ErrNoIdentity)
	}
	tlsInfo, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return pki.Identity{}, fmt.Errorf("%w: %s did not connect over TLS", pki.ErrNoIdentity, p.Addr)
	}
	if len(tlsInfo.State.VerifiedChains) == 0 || len(tlsInfo.State.VerifiedChains[0]) == 0 {
		return pki.Identity{}, fmt.Errorf("%w: %s presented no verified certificate", pki.ErrNoIdentity, p.Addr)
	}
	return pki.FromCertificate(tlsInfo.State.VerifiedChains[0][0])
}

// Authorizer enforces a policy, logging and counting what it refuses.
type Authorizer struct {
	policy Policy
	log    logr.Logger
	denied *prometheus.CounterVec
}

// New returns an Authorizer of policy whose refusals are counted in reg as
// <component>_rpc_denied_total (reg may be nil).
func New(component string, policy Policy, reg prometheus.Registerer, log logr.Logger) (*Authorizer, error) {
	denied := prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "strata_" + component + "_rpc_denied_total",
		Help: "Calls refused for the caller's identity (PermissionDenied or Unauthenticated), by method and role of the caller.",
	}, []string{"method", "role"})
	if reg != nil {
		if err := reg.Register(denied); err != nil {
			return nil, fmt.Errorf("registering %s's authorization metrics: %w", component, err)
		}
	}
	return &Authorizer{policy: policy, log: log, denied: denied}, nil
}

// For is an Authorizer of another policy that logs and counts with this one: a component with
// two servers (the worker's data plane and its mount socket) keeps one count of refusals.
func (a *Authorizer) For(policy Policy) *Authorizer {
	return &Authorizer{policy: policy, log: a.log, denied: a.denied}
}

// Authorize decides one call of method with request req (nil for a stream) from ctx's caller.
func (a *Authorizer) Authorize(ctx context.Context, method string, req any) error {
	caller, err := Caller(ctx)
	if err != nil {
		return a.refuse(method, "", codes.Unauthenticated, err.Error())
	}
	rule, ok := a.policy[method]
	if !ok {
		return a.refuse(method, caller.Role, codes.PermissionDenied, fmt.Sprintf("%s is open to no one", method))
	}
	if !slices.Contains(rule.Roles, caller.Role) {
		return a.refuse(method, caller.Role, codes.PermissionDenied, fmt.Sprintf("%s may not call %s (allowed: %v)", caller, method, rule.Roles))
	}
	if rule.ActsFor != nil && caller.Role != pki.RoleOperator && req != nil {
		if want := rule.ActsFor(req); want != caller.Self() {
			return a.refuse(method, caller.Role, codes.PermissionDenied,
				fmt.Sprintf("%s may call %s only for itself (%q), not for %q", caller, method, caller.Self(), want))
		}
	}
	return nil
}

func (a *Authorizer) refuse(method string, role pki.Role, code codes.Code, msg string) error {
	a.denied.WithLabelValues(method, string(role)).Inc()
	a.log.Info("refused a call", "method", method, "role", role, "reason", msg)
	return status.Error(code, msg)
}

// UnaryInterceptor authorizes every unary call.
func (a *Authorizer) UnaryInterceptor() grpc.UnaryServerInterceptor {
	return func(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
		if err := a.Authorize(ctx, info.FullMethod, req); err != nil {
			return nil, err
		}
		return handler(ctx, req)
	}
}

// StreamInterceptor authorizes every stream when it opens.
func (a *Authorizer) StreamInterceptor() grpc.StreamServerInterceptor {
	return func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
		if err := a.Authorize(ss.Context(), info.FullMethod, nil); err != nil {
			return err
		}
		return handler(srv, ss)
	}
}

// ServerOptions are the interceptors, for grpc.NewServer.
func (a *Authorizer) ServerOptions() []grpc.ServerOption {
	return []grpc.ServerOption{grpc.ChainUnaryInterceptor(a.UnaryInterceptor()), grpc.ChainStreamInterceptor(a.StreamInterceptor())}
}

// Package authz decides, for every gRPC method of a Strata server, which component may call
// it: a Policy is one table from full method name to the roles allowed (and, for methods that
// act for a worker, which worker the request speaks for), enforced by interceptors over the
// identity of the caller's verified client certificate. A method the table does not name is
// refused, so a method added to a service is closed until someone says who may call it.
package authz

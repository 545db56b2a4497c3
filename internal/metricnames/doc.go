// Package metricnames holds the check that Strata's Grafana dashboard (charts/strata/dashboards)
// only queries metrics that a component registers: it builds each component's metrics, as the
// binaries do, and compares their names with the dashboard's queries, so that renaming a metric
// without updating the dashboard fails the tests.
package metricnames

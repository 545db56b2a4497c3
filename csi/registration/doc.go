// Package registration registers the CSI node plugin with the kubelet, as the
// node-driver-registrar sidecar would (it cannot be built here): it serves the kubelet's
// plugin-registration API (pluginregistration.v1) on a socket in the kubelet's
// plugins_registry folder. The kubelet's plugin watcher finds the socket, asks GetInfo for the
// driver's name and CSI endpoint, and reports the outcome with NotifyRegistrationStatus.
// Removing the socket, as Serve does when it stops, deregisters the driver.
package registration

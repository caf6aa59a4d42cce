//go:build tools

// Package tools pins upstream's vsphere-cloud-controller-manager so `go build` can build it
// from this module (ci/install-tools --upstream-ccm vsphere).
package tools

import _ "k8s.io/cloud-provider-vsphere/cmd/vsphere-cloud-controller-manager"

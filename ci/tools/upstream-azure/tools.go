//go:build tools

// Package tools pins upstream's Azure cloud-controller-manager and cloud-node-manager so `go
// build` can build them from this module (ci/install-tools --upstream-ccm azure).
package tools

import (
	_ "sigs.k8s.io/cloud-provider-azure/cmd/cloud-controller-manager"
	_ "sigs.k8s.io/cloud-provider-azure/cmd/cloud-node-manager"
)

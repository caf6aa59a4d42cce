//go:build tools

// Package tools pins upstream's openstack-cloud-controller-manager so `go build` can build it
// from this module (ci/install-tools --upstream-ccm openstack).
package tools

import _ "k8s.io/cloud-provider-openstack/cmd/openstack-cloud-controller-manager"

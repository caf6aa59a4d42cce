//go:build tools

// Package tools pins upstream's aws-cloud-controller-manager so `go build` can build it from
// this module (ci/install-tools --upstream-ccm aws).
package tools

import _ "k8s.io/cloud-provider-aws/cmd/aws-cloud-controller-manager"

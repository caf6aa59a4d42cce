module ccm-rs/ci/fidelity/openstack

go 1.25.0

require github.com/gophercloud/gophercloud/v2 v2.15.0

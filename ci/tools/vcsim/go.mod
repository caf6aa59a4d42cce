module ccm-rs/ci/tools/vcsim

go 1.25.0

require github.com/vmware/govmomi v0.56.0

require (
	github.com/google/uuid v1.6.0 // indirect
	gopkg.in/yaml.v3 v3.0.1 // indirect
)

module ccm-rs/ci/fidelity/aws-imds

go 1.25.0

require (
	github.com/aws/aws-sdk-go-v2 v1.47.8
	github.com/aws/aws-sdk-go-v2/feature/ec2/imds v1.20.8
	github.com/aws/smithy-go v1.28.8
)

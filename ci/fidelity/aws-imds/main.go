// Fidelity check of the EC2 instance metadata emulator (testbed/emulators/src/aws_imds.rs):
// the AWS SDK for Go v2's own IMDS client (github.com/aws/aws-sdk-go-v2/feature/ec2/imds
// v1.20.8) reads every path the AWS provider reads at start (providers/aws/src/metadata.rs),
// over IMDSv2 with no fallback to v1, and the program exits non-zero when a reply does not parse or does not mean what EC2's metadata service means.
//
// Usage: EMULATOR_URL=http://127.0.0.1:PORT go run .
// (ci/fidelity starts `ccm-emulator aws-imds` with its default instance and sets EMULATOR_URL.)
package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/feature/ec2/imds"
	smithyhttp "github.com/aws/smithy-go/transport/http"
)

// The emulator's default instance (ccm-emulator aws-imds without flags).
const (
	instanceID = "i-0123456789abcdef0"
	region     = "us-east-1"
	zone       = "us-east-1a"
	mac        = "0e:12:34:56:78:9a"
	vpcID      = "vpc-0a1b2c3d"
	privateIP  = "10.0.0.4"
)

var checks int

func fail(format string, args ...interface{}) {
	fmt.Fprintf(os.Stderr, "FAIL: "+format+"\n", args...)
	os.Exit(1)
}

func ok(format string, args ...interface{}) {
	checks++
	fmt.Printf("ok   "+format+"\n", args...)
}

func main() {
	url := os.Getenv("EMULATOR_URL")
	if url == "" {
		fail("EMULATOR_URL is not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()

	// IMDSv2 only: a v1 fallback would hide a token endpoint that does not work.
	client := imds.New(imds.Options{Endpoint: url, EnableFallback: aws.FalseTernary})

	get := func(path string) string {
		out, err := client.GetMetadata(ctx, &imds.GetMetadataInput{Path: path})
		if err != nil {
			fail("GetMetadata %s: %v", path, err)
		}
		defer out.Content.Close()
		b, err := io.ReadAll(out.Content)
		if err != nil {
			fail("reading %s: %v", path, err)
		}
		return string(b)
	}
	expect := func(path, want string) {
		if got := get(path); got != want {
			fail("%s = %q, want %q", path, got, want)
		}
		ok("%s = %s", path, want)
	}

	expect("instance-id", instanceID)
	expect("placement/availability-zone", zone)
	expect("placement/region", region)
	expect("mac", mac)
	expect("network/interfaces/macs/"+mac+"/vpc-id", vpcID)
	expect("local-ipv4", privateIP)

	r, err := client.GetRegion(ctx, &imds.GetRegionInput{})
	if err != nil || r.Region != region {
		fail("GetRegion = %+v, %v; want %s", r, err, region)
	}
	ok("GetRegion = %s", r.Region)

	doc, err := client.GetInstanceIdentityDocument(ctx, &imds.GetInstanceIdentityDocumentInput{})
	if err != nil {
		fail("GetInstanceIdentityDocument: %v", err)
	}
	if doc.InstanceID != instanceID || doc.Region != region || doc.AvailabilityZone != zone || doc.PrivateIP != privateIP {
		fail("identity document %+v does not describe the instance", doc.InstanceIdentityDocument)
	}
	ok("identity document: %s in %s", doc.InstanceID, doc.AvailabilityZone)

	// An unknown path is a 404 the SDK reports as such (not an empty value).
	_, err = client.GetMetadata(ctx, &imds.GetMetadataInput{Path: "no-such-category"})
	var re *smithyhttp.ResponseError
	if err == nil || !errors.As(err, &re) || re.HTTPStatusCode() != http.StatusNotFound {
		fail("unknown path: want a 404 response error, got %v", err)
	}
	ok("unknown path is 404")

	// Without a session token, metadata is refused with 401 (HttpTokens=required).
	resp, err := http.Get(strings.TrimRight(url, "/") + "/latest/meta-data/instance-id")
	if err != nil {
		fail("GET without a token: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusUnauthorized {
		fail("GET without a token: status %d, want 401", resp.StatusCode)
	}
	ok("a request without a token is 401")

	// A token request without a TTL is refused (400), as EC2 does.
	req, _ := http.NewRequest(http.MethodPut, strings.TrimRight(url, "/")+"/latest/api/token", nil)
	resp, err = http.DefaultClient.Do(req)
	if err != nil {
		fail("PUT token without TTL: %v", err)
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusBadRequest {
		fail("PUT token without TTL: status %d, want 400", resp.StatusCode)
	}
	ok("a token request without a TTL is 400")

	fmt.Printf("aws-imds: %d checks passed\n", checks)
}

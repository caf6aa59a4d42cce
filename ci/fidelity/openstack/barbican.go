package main

// Barbican (key manager v1) and Octavia's TERMINATED_HTTPS listeners (issue #32 item 2): what
// cloud-provider-openstack's TLS termination relies on. gophercloud's keymanager packages
// create and read a secret and a certificate container (their timestamps parse), set the
// container's read ACL, and a member of the project the ACL leaves out gets Barbican's 403;
// unknown and malformed IDs are 404s; Octavia refuses a TERMINATED_HTTPS listener without a
// reference, with a reference the user cannot read, and a reference on a TCP listener (400),
// and creates one naming a readable container.

import (
	"encoding/json"
	"errors"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
	"github.com/gophercloud/gophercloud/v2/openstack/keymanager/v1/acls"
	"github.com/gophercloud/gophercloud/v2/openstack/keymanager/v1/containers"
	"github.com/gophercloud/gophercloud/v2/openstack/keymanager/v1/secrets"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/listeners"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/loadbalancers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
)

// barbicanBody is Barbican's error body, {"code", "title", "description"}.
func barbicanBody(err error) (code int, description string) {
	var e gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &e) {
		return 0, ""
	}
	var b struct {
		Code        int    `json:"code"`
		Title       string `json:"title"`
		Description string `json:"description"`
	}
	if jsonErr := json.Unmarshal(e.Body, &b); jsonErr != nil || b.Title == "" {
		return 0, ""
	}
	return b.Code, b.Description
}

func barbican(url string, provider *gophercloud.ProviderClient, lbc *gophercloud.ServiceClient, subnet subnets.Subnet) {
	km, err := openstack.NewKeyManagerV1(provider, gophercloud.EndpointOpts{Region: "RegionOne"})
	must(err, "catalog: key-manager")
	ok("barbican.catalog")

	cert, err := secrets.Create(ctx, km, secrets.CreateOpts{Name: "web-cert", SecretType: secrets.CertificateSecret,
		Payload: "-----BEGIN CERTIFICATE-----", PayloadContentType: "text/plain"}).Extract()
	must(err, "secret create")
	key, err := secrets.Create(ctx, km, secrets.CreateOpts{Name: "web-key", SecretType: secrets.PrivateSecret,
		Payload: "-----BEGIN PRIVATE KEY-----", PayloadContentType: "text/plain"}).Extract()
	must(err, "secret create")
	c, err := containers.Create(ctx, km, containers.CreateOpts{Type: containers.CertificateContainer, Name: "web",
		SecretRefs: []containers.SecretRef{{Name: "certificate", SecretRef: cert.SecretRef},
			{Name: "private_key", SecretRef: key.SecretRef}}}).Extract()
	must(err, "container create")
	cid := c.ContainerRef[strings.LastIndex(c.ContainerRef, "/")+1:]
	got, err := containers.Get(ctx, km, cid).Extract()
	must(err, "container get")
	if got.ContainerRef != c.ContainerRef || got.Type != "certificate" || len(got.SecretRefs) != 2 ||
		got.Status != "ACTIVE" || got.Created.IsZero() || time.Since(got.Created) > time.Hour {
		fail("container get: %+v", got)
	}
	sid := cert.SecretRef[strings.LastIndex(cert.SecretRef, "/")+1:]
	s, err := secrets.Get(ctx, km, sid).Extract()
	must(err, "secret get")
	if s.SecretRef != cert.SecretRef || s.SecretType != "certificate" || s.Created.IsZero() {
		fail("secret get: %+v", s)
	}
	ok("barbican.secrets_and_containers")

	if _, err := containers.Get(ctx, km, "00000000-0000-4000-8000-000000000000").Extract(); !is(err, 404) {
		fail("an unknown container: want 404, got %v", err)
	} else if code, d := barbicanBody(err); code != 404 || d != "Secrets container not found." {
		fail("an unknown container's body: %d %q", code, d)
	}
	if _, err := secrets.Get(ctx, km, "not-a-uuid").Extract(); !is(err, 404) {
		fail("a malformed secret ID: want 404, got %v", err)
	}
	ok("barbican.not_found")

	// The container made private: a member of the project without an ACL entry gets 403.
	off := false
	_, err = acls.SetContainerACL(ctx, km, cid, acls.SetOpts{{Type: "read", ProjectAccess: &off, Users: &[]string{}}}).Extract()
	must(err, "container acl set")
	acl, err := acls.GetContainerACL(ctx, km, cid).Extract()
	must(err, "container acl get")
	if r, found := (*acl)["read"]; !found || r.ProjectAccess {
		fail("container acl: %+v", acl)
	}
	member := tokens.AuthOptions{Username: "member", Password: "openstack-emulator-member-password", DomainName: "Default",
		Scope: tokens.Scope{ProjectName: "demo", DomainName: "Default"}}
	mTok, err := token(url, member)
	must(err, "member token")
	mp, err := openstack.NewClient(url + "/identity")
	must(err, "client")
	mp.SetToken(mTok)
	mkm := &gophercloud.ServiceClient{ProviderClient: mp, Endpoint: km.Endpoint, ResourceBase: km.ResourceBase}
	_, err = containers.Get(ctx, mkm, cid).Extract()
	if code, d := barbicanBody(err); !is(err, 403) || code != 403 ||
		d != "Container retrieval attempt not allowed - please review your user/project privileges" {
		fail("a member reading a private container: want Barbican's 403, got %v", err)
	}
	ok("barbican.acl_403")

	// Octavia: TERMINATED_HTTPS needs a readable reference.
	lb, err := loadbalancers.Create(ctx, lbc, loadbalancers.CreateOpts{Name: "tls-check", VipSubnetID: subnet.ID}).Extract()
	must(err, "lb for the TLS check")
	waitActive(lbc, lb.ID)
	_, err = listeners.Create(ctx, lbc, listeners.CreateOpts{LoadbalancerID: lb.ID, Protocol: listeners.ProtocolTerminatedHTTPS,
		ProtocolPort: 443}).Extract()
	if !is(err, 400) {
		fail("a TERMINATED_HTTPS listener without a reference: want 400, got %v", err)
	}
	_, err = listeners.Create(ctx, lbc, listeners.CreateOpts{LoadbalancerID: lb.ID, Protocol: listeners.ProtocolTCP,
		ProtocolPort: 443, DefaultTlsContainerRef: c.ContainerRef}).Extract()
	if !is(err, 400) {
		fail("a TCP listener with a reference: want 400, got %v", err)
	}
	mAuth, err := openstack.NewClient(url + "/identity")
	must(err, "client")
	mAuth.SetToken(mTok)
	mlbc := &gophercloud.ServiceClient{ProviderClient: mAuth, Endpoint: lbc.Endpoint, ResourceBase: lbc.ResourceBase}
	_, err = listeners.Create(ctx, mlbc, listeners.CreateOpts{LoadbalancerID: lb.ID, Protocol: listeners.ProtocolTerminatedHTTPS,
		ProtocolPort: 443, DefaultTlsContainerRef: c.ContainerRef}).Extract()
	if !is(err, 400) {
		fail("a TERMINATED_HTTPS listener naming a container the user cannot read: want 400, got %v", err)
	}
	ln, err := listeners.Create(ctx, lbc, listeners.CreateOpts{LoadbalancerID: lb.ID, Protocol: listeners.ProtocolTerminatedHTTPS,
		ProtocolPort: 443, DefaultTlsContainerRef: c.ContainerRef}).Extract()
	must(err, "a TERMINATED_HTTPS listener with the creator's container")
	if ln.Protocol != "TERMINATED_HTTPS" || ln.DefaultTlsContainerRef != c.ContainerRef {
		fail("TERMINATED_HTTPS listener: %+v", ln)
	}
	waitActive(lbc, lb.ID)
	must(loadbalancers.Delete(ctx, lbc, lb.ID, loadbalancers.DeleteOpts{Cascade: true}).ExtractErr(), "TLS lb delete")
	ok("octavia.listeners.terminated_https")
}

// waitActive waits until load balancer id is ACTIVE.
func waitActive(lbc *gophercloud.ServiceClient, id string) {
	deadline := time.Now().Add(60 * time.Second)
	for time.Now().Before(deadline) {
		l, err := loadbalancers.Get(ctx, lbc, id).Extract()
		must(err, "lb get")
		if l.ProvisioningStatus == "ACTIVE" {
			return
		}
		time.Sleep(300 * time.Millisecond)
	}
	fail("lb %s never became ACTIVE", id)
}

// Fidelity check of the GCP emulator (testbed/emulators/src/gcp.rs): Google's own Go clients
// (google.golang.org/api/compute/v1 v0.311.0, cloud.google.com/go/compute/metadata v0.9.0)
// drive every Compute and metadata call the GCP provider makes, and the program exits
// non-zero when a reply does not parse or does not mean what Compute means.
//
// Usage: EMULATOR_URL=http://127.0.0.1:PORT go run .
// (ci/fidelity starts the emulator with ci/fidelity/gcp/world.yaml and emulator-args.)
package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"cloud.google.com/go/compute/metadata"
	"golang.org/x/oauth2"
	compute "google.golang.org/api/compute/v1"
	"google.golang.org/api/googleapi"
	"google.golang.org/api/option"
)

const (
	project = "fidelity-project"
	region  = "us-central1"
	zoneA   = "us-central1-a"
	zoneB   = "us-central1-b"
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

func must(err error, what string) {
	if err != nil {
		fail("%s: %v", what, err)
	}
}

func want(cond bool, format string, args ...interface{}) {
	if !cond {
		fail(format, args...)
	}
	ok(format, args...)
}

// wantErr checks a Google API error's code and reason.
func wantErr(err error, code int, reason, what string) {
	var ge *googleapi.Error
	if !errors.As(err, &ge) {
		fail("%s: want a googleapi.Error %d %s, got %v", what, code, reason, err)
	}
	if ge.Code != code || len(ge.Errors) == 0 || ge.Errors[0].Reason != reason {
		fail("%s: want %d %s, got %d %+v", what, code, reason, ge.Code, ge.Errors)
	}
	ok("%s: %d %s", what, code, reason)
}

func last(link string) string { return link[strings.LastIndex(link, "/")+1:] }

var svc *compute.Service
var ctx = context.Background()

// waitOp waits for an operation with operations.wait (then checks get agrees).
func waitOp(op *compute.Operation, what string) {
	must(nil, what)
	if op == nil || op.Name == "" {
		fail("%s: no operation", what)
	}
	if op.Status != "PENDING" && op.Status != "RUNNING" {
		fail("%s: a fresh operation is %q, want PENDING or RUNNING", what, op.Status)
	}
	var err error
	deadline := time.Now().Add(60 * time.Second)
	for op.Status != "DONE" {
		if time.Now().After(deadline) {
			fail("%s: operation %s never DONE", what, op.Name)
		}
		switch {
		case op.Zone != "":
			op, err = svc.ZoneOperations.Wait(project, last(op.Zone), op.Name).Context(ctx).Do()
		case op.Region != "":
			op, err = svc.RegionOperations.Wait(project, last(op.Region), op.Name).Context(ctx).Do()
		default:
			op, err = svc.GlobalOperations.Wait(project, op.Name).Context(ctx).Do()
		}
		must(err, what+": operations.wait")
	}
	if op.Error != nil && len(op.Error.Errors) > 0 {
		fail("%s: operation failed: %+v", what, op.Error.Errors[0])
	}
	var got *compute.Operation
	switch {
	case op.Zone != "":
		got, err = svc.ZoneOperations.Get(project, last(op.Zone), op.Name).Context(ctx).Do()
	case op.Region != "":
		got, err = svc.RegionOperations.Get(project, last(op.Region), op.Name).Context(ctx).Do()
	default:
		got, err = svc.GlobalOperations.Get(project, op.Name).Context(ctx).Do()
	}
	must(err, what+": operations.get")
	want(got.Status == "DONE" && got.TargetLink != "", "%s: operation %s DONE (target %s)", what, op.Name, last(got.TargetLink))
}

func do(op *compute.Operation, err error, what string) {
	must(err, what)
	waitOp(op, what)
}

func main() {
	base := strings.TrimRight(os.Getenv("EMULATOR_URL"), "/")
	if base == "" {
		fail("EMULATOR_URL is not set")
	}
	host := strings.TrimPrefix(strings.TrimPrefix(base, "http://"), "https://")
	os.Setenv("GCE_METADATA_HOST", host)

	// ---- metadata server ----
	md := metadata.NewClient(&http.Client{Timeout: 10 * time.Second})
	want(md.OnGCEWithContext(ctx), "metadata: OnGCE with GCE_METADATA_HOST")
	p, err := md.ProjectIDWithContext(ctx)
	must(err, "metadata project-id")
	want(p == project, "metadata: project-id %q", p)
	z, err := md.ZoneWithContext(ctx)
	must(err, "metadata zone")
	want(z == zoneA, "metadata: zone %q", z)
	n, err := md.InstanceNameWithContext(ctx)
	must(err, "metadata name")
	want(n == "node-0", "metadata: instance name %q", n)
	h, err := md.HostnameWithContext(ctx)
	must(err, "metadata hostname")
	want(strings.HasPrefix(h, "node-0."), "metadata: hostname %q", h)
	ip, err := md.InternalIPWithContext(ctx)
	must(err, "metadata internal ip")
	want(ip == "10.0.0.10", "metadata: internal IP %q", ip)
	eip, err := md.ExternalIPWithContext(ctx)
	must(err, "metadata external ip")
	want(eip == "34.1.2.3", "metadata: external IP %q", eip)
	tags, err := md.InstanceTagsWithContext(ctx)
	must(err, "metadata tags")
	want(len(tags) == 2 && tags[0] == "k8s-node", "metadata: tags %v", tags)
	// The universe domain (cloud.google.com/go/auth reads it through this client for compute
	// credentials): 200 googleapis.com, as Google's public cloud answers.
	ud, err := md.GetWithContext(ctx, "universe/universe-domain")
	must(err, "metadata universe-domain")
	want(ud == "googleapis.com", "metadata: universe/universe-domain %q", ud)
	scopes, err := md.ScopesWithContext(ctx, "default")
	must(err, "metadata scopes")
	want(len(scopes) >= 1 && strings.Contains(strings.Join(scopes, " "), "cloud-platform"), "metadata: scopes %v", scopes)
	cfg, err := md.InstanceAttributeValueWithContext(ctx, "google-dockercfg")
	must(err, "metadata google-dockercfg")
	want(strings.Contains(cfg, "gcr.io"), "metadata: attribute google-dockercfg %q", cfg)
	_, err = md.InstanceAttributeValueWithContext(ctx, "absent-attribute")
	var nde metadata.NotDefinedError
	want(errors.As(err, &nde), "metadata: an absent attribute is NotDefinedError (%v)", err)
	tokJSON, err := md.GetWithContext(ctx, "instance/service-accounts/default/token")
	must(err, "metadata token")
	tok := ""
	if i := strings.Index(tokJSON, `"access_token":"`); i >= 0 {
		rest := tokJSON[i+len(`"access_token":"`):]
		tok = rest[:strings.Index(rest, `"`)]
	}
	want(tok != "", "metadata: service-account token")
	resp, err := http.Get(base + "/computeMetadata/v1/project/project-id")
	must(err, "metadata without flavor")
	resp.Body.Close()
	want(resp.StatusCode == 403, "metadata: without Metadata-Flavor is 403 (%d)", resp.StatusCode)

	// ---- compute: authentication ----
	anon, err := compute.NewService(ctx, option.WithEndpoint(base+"/compute/v1/"), option.WithHTTPClient(http.DefaultClient))
	must(err, "anonymous service")
	_, err = anon.Zones.List(project).Context(ctx).Do()
	wantErr(err, 401, "authError", "zones.list without a token")

	svc, err = compute.NewService(ctx, option.WithEndpoint(base+"/compute/v1/"),
		option.WithTokenSource(oauth2.StaticTokenSource(&oauth2.Token{AccessToken: tok, TokenType: "Bearer"})))
	must(err, "compute service")

	// ---- zones, regions ----
	zl, err := svc.Zones.List(project).Context(ctx).Do()
	must(err, "zones.list")
	var zn []string
	for _, z := range zl.Items {
		zn = append(zn, z.Name)
	}
	sort.Strings(zn)
	want(strings.Join(zn, ",") == zoneA+","+zoneB, "zones.list: %v", zn)
	zg, err := svc.Zones.Get(project, zoneB).Context(ctx).Do()
	must(err, "zones.get")
	want(last(zg.Region) == region && zg.Status == "UP", "zones.get: %s in %s", zg.Name, last(zg.Region))
	rg, err := svc.Regions.Get(project, region).Context(ctx).Do()
	must(err, "regions.get")
	want(len(rg.Zones) == 2, "regions.get: %s zones %d", rg.Name, len(rg.Zones))
	_, err = svc.Zones.Get(project, "mars-1a").Context(ctx).Do()
	wantErr(err, 404, "notFound", "zones.get unknown")

	// ---- instances ----
	in0, err := svc.Instances.Get(project, zoneA, "node-0").Context(ctx).Do()
	must(err, "instances.get")
	ni := in0.NetworkInterfaces[0]
	want(in0.Status == "RUNNING" && last(in0.MachineType) == "n2-standard-4" && last(in0.Zone) == zoneA,
		"instances.get: node-0 %s %s %s", in0.Status, last(in0.MachineType), last(in0.Zone))
	want(in0.Id != 0, "instances.get: numeric id %d", in0.Id)
	want(ni.NetworkIP == "10.0.0.10" && ni.Ipv6Address == "fd20::10" && len(ni.AccessConfigs) == 1 && ni.AccessConfigs[0].NatIP == "34.1.2.3",
		"instances.get: addresses %s %s %s", ni.NetworkIP, ni.Ipv6Address, ni.AccessConfigs[0].NatIP)
	want(len(ni.AliasIpRanges) == 1 && ni.AliasIpRanges[0].IpCidrRange == "10.64.0.0/24", "instances.get: alias range %v", ni.AliasIpRanges[0].IpCidrRange)
	want(ni.StackType == "IPV4_IPV6" && ni.Ipv6AccessType == "INTERNAL" && ni.InternalIpv6PrefixLength == 96 && len(ni.Ipv6AccessConfigs) == 0,
		"instances.get: internal IPv6 (stack %s, access %s, /%d)", ni.StackType, ni.Ipv6AccessType, ni.InternalIpv6PrefixLength)
	want(in0.Tags != nil && len(in0.Tags.Items) == 2 && in0.Labels["team"] == "blue", "instances.get: tags %v labels %v", in0.Tags.Items, in0.Labels)
	_, err = svc.Instances.Get(project, zoneA, "missing").Context(ctx).Do()
	wantErr(err, 404, "notFound", "instances.get missing")
	il, err := svc.Instances.List(project, zoneA).Filter(`name eq "(node-0|node-1|node-9)"`).Context(ctx).Do()
	must(err, "instances.list filter")
	want(len(il.Items) == 2, "instances.list: filter by name regex gives %d", len(il.Items))
	il, err = svc.Instances.List(project, zoneB).Filter(`status = "TERMINATED"`).Context(ctx).Do()
	must(err, "instances.list filter status")
	want(len(il.Items) == 1 && il.Items[0].Name == "node-3", "instances.list: stopped is TERMINATED (%d)", len(il.Items))
	pages, total := 0, 0
	err = svc.Instances.List(project, zoneA).MaxResults(1).Pages(ctx, func(l *compute.InstanceList) error {
		pages++
		total += len(l.Items)
		return nil
	})
	must(err, "instances.list pages")
	want(pages == 2 && total == 2, "instances.list: maxResults=1 pages %d items %d", pages, total)
	pages, total = 0, 0
	err = svc.Instances.AggregatedList(project).MaxResults(3).Pages(ctx, func(l *compute.InstanceAggregatedList) error {
		pages++
		for scope, s := range l.Items {
			if !strings.HasPrefix(scope, "zones/") && len(s.Instances) > 0 {
				return fmt.Errorf("instances under %s", scope)
			}
			total += len(s.Instances)
		}
		return nil
	})
	must(err, "instances.aggregatedList")
	want(pages == 2 && total == 4, "instances.aggregatedList: pages %d instances %d", pages, total)

	link := func(scope, coll, name string) string {
		return "https://www.googleapis.com/compute/v1/projects/" + project + "/" + scope + "/" + coll + "/" + name
	}
	inst := func(z, n string) string { return link("zones/"+z, "instances", n) }

	// ---- external load balancer: address, health check, target pool, forwarding rule, firewalls ----
	lb := "a0123456789abcdef0123456789abcde"
	op, err := svc.Addresses.Insert(project, region, &compute.Address{Name: lb, Description: `{"kubernetes.io/service-name":"default/web"}`, NetworkTier: "PREMIUM"}).Context(ctx).Do()
	do(op, err, "addresses.insert")
	addr, err := svc.Addresses.Get(project, region, lb).Context(ctx).Do()
	must(err, "addresses.get")
	want(addr.Address != "" && addr.Status == "RESERVED" && addr.AddressType == "EXTERNAL", "addresses.get: %s %s %s", addr.Address, addr.Status, addr.AddressType)
	_, err = svc.Addresses.Insert(project, region, &compute.Address{Name: lb}).Context(ctx).Do()
	wantErr(err, 409, "alreadyExists", "addresses.insert again")

	hcName := "k8s-1234567890abcdef-node"
	op, err = svc.HttpHealthChecks.Insert(project, &compute.HttpHealthCheck{Name: hcName, Port: 10256, RequestPath: "/healthz", CheckIntervalSec: 8, TimeoutSec: 1, HealthyThreshold: 1, UnhealthyThreshold: 3}).Context(ctx).Do()
	do(op, err, "httpHealthChecks.insert")
	hc, err := svc.HttpHealthChecks.Get(project, hcName).Context(ctx).Do()
	must(err, "httpHealthChecks.get")
	want(hc.Port == 10256 && hc.RequestPath == "/healthz", "httpHealthChecks.get: port %d path %s", hc.Port, hc.RequestPath)
	hc.CheckIntervalSec = 10
	op, err = svc.HttpHealthChecks.Update(project, hcName, hc).Context(ctx).Do()
	do(op, err, "httpHealthChecks.update")

	op, err = svc.TargetPools.Insert(project, region, &compute.TargetPool{Name: lb, Instances: []string{inst(zoneA, "node-0")}, HealthChecks: []string{link("global", "httpHealthChecks", hcName)}, SessionAffinity: "NONE"}).Context(ctx).Do()
	do(op, err, "targetPools.insert")
	op, err = svc.TargetPools.AddInstance(project, region, lb, &compute.TargetPoolsAddInstanceRequest{Instances: []*compute.InstanceReference{{Instance: inst(zoneB, "node-2")}}}).Context(ctx).Do()
	do(op, err, "targetPools.addInstance")
	op, err = svc.TargetPools.RemoveInstance(project, region, lb, &compute.TargetPoolsRemoveInstanceRequest{Instances: []*compute.InstanceReference{{Instance: inst(zoneA, "node-0")}}}).Context(ctx).Do()
	do(op, err, "targetPools.removeInstance")
	tp, err := svc.TargetPools.Get(project, region, lb).Context(ctx).Do()
	must(err, "targetPools.get")
	want(len(tp.Instances) == 1 && last(tp.Instances[0]) == "node-2" && len(tp.HealthChecks) == 1, "targetPools.get: instances %v", tp.Instances)
	_, err = svc.TargetPools.AddInstance(project, region, lb, &compute.TargetPoolsAddInstanceRequest{Instances: []*compute.InstanceReference{{Instance: inst(zoneA, "ghost")}}}).Context(ctx).Do()
	wantErr(err, 404, "notFound", "targetPools.addInstance of a missing instance")

	op, err = svc.ForwardingRules.Insert(project, region, &compute.ForwardingRule{Name: lb, IPAddress: addr.Address, IPProtocol: "TCP", PortRange: "80-443", Target: tp.SelfLink, NetworkTier: "PREMIUM"}).Context(ctx).Do()
	do(op, err, "forwardingRules.insert")
	fr, err := svc.ForwardingRules.Get(project, region, lb).Context(ctx).Do()
	must(err, "forwardingRules.get")
	want(fr.IPAddress == addr.Address && last(fr.Target) == lb && fr.LoadBalancingScheme == "EXTERNAL", "forwardingRules.get: %s → %s", fr.IPAddress, last(fr.Target))
	op, err = svc.ForwardingRules.SetTarget(project, region, lb, &compute.TargetReference{Target: tp.SelfLink}).Context(ctx).Do()
	do(op, err, "forwardingRules.setTarget")
	addr, err = svc.Addresses.Get(project, region, lb).Context(ctx).Do()
	must(err, "addresses.get in use")
	want(addr.Status == "IN_USE" && len(addr.Users) == 1, "addresses.get: %s users %v", addr.Status, addr.Users)
	fl, err := svc.ForwardingRules.List(project, region).Context(ctx).Do()
	must(err, "forwardingRules.list")
	want(len(fl.Items) == 1, "forwardingRules.list: %d", len(fl.Items))
	_, err = svc.TargetPools.Delete(project, region, lb).Context(ctx).Do()
	wantErr(err, 400, "resourceInUseByAnotherResource", "targetPools.delete while a forwarding rule uses it")

	fw := &compute.Firewall{Name: "k8s-fw-" + lb, Network: link("global", "networks", "k8s-net"), SourceRanges: []string{"0.0.0.0/0"}, TargetTags: []string{"k8s-node"},
		Allowed: []*compute.FirewallAllowed{{IPProtocol: "tcp", Ports: []string{"80", "443"}}}, Description: `{"kubernetes.io/service-name":"default/web"}`}
	op, err = svc.Firewalls.Insert(project, fw).Context(ctx).Do()
	do(op, err, "firewalls.insert")
	fw.SourceRanges = []string{"10.0.0.0/8"}
	op, err = svc.Firewalls.Update(project, fw.Name, fw).Context(ctx).Do()
	do(op, err, "firewalls.update")
	fwg, err := svc.Firewalls.Get(project, fw.Name).Context(ctx).Do()
	must(err, "firewalls.get")
	want(len(fwg.SourceRanges) == 1 && fwg.SourceRanges[0] == "10.0.0.0/8" && fwg.Allowed[0].Ports[1] == "443" && fwg.Direction == "INGRESS", "firewalls.get: %v %v", fwg.SourceRanges, fwg.Allowed[0].Ports)
	op, err = svc.Firewalls.Patch(project, fw.Name, &compute.Firewall{TargetTags: []string{"web"}}).Context(ctx).Do()
	do(op, err, "firewalls.patch")

	// ---- internal load balancer: instance groups, regional health check, backend service ----
	ig := "k8s-ig--1234567890abcdef"
	op, err = svc.InstanceGroups.Insert(project, zoneA, &compute.InstanceGroup{Name: ig, Network: link("global", "networks", "k8s-net")}).Context(ctx).Do()
	do(op, err, "instanceGroups.insert")
	op, err = svc.InstanceGroups.AddInstances(project, zoneA, ig, &compute.InstanceGroupsAddInstancesRequest{Instances: []*compute.InstanceReference{{Instance: inst(zoneA, "node-0")}, {Instance: inst(zoneA, "node-1")}}}).Context(ctx).Do()
	do(op, err, "instanceGroups.addInstances")
	op, err = svc.InstanceGroups.RemoveInstances(project, zoneA, ig, &compute.InstanceGroupsRemoveInstancesRequest{Instances: []*compute.InstanceReference{{Instance: inst(zoneA, "node-1")}}}).Context(ctx).Do()
	do(op, err, "instanceGroups.removeInstances")
	var members []string
	err = svc.InstanceGroups.ListInstances(project, zoneA, ig, &compute.InstanceGroupsListInstancesRequest{InstanceState: "ALL"}).Pages(ctx, func(l *compute.InstanceGroupsListInstances) error {
		for _, m := range l.Items {
			members = append(members, last(m.Instance)+"="+m.Status)
		}
		return nil
	})
	must(err, "instanceGroups.listInstances")
	want(len(members) == 1 && members[0] == "node-0=RUNNING", "instanceGroups.listInstances: %v", members)
	igg, err := svc.InstanceGroups.Get(project, zoneA, ig).Context(ctx).Do()
	must(err, "instanceGroups.get")
	want(igg.Size == 1, "instanceGroups.get: size %d", igg.Size)

	ihc := "k8s-1234567890abcdef-node-ilb"
	op, err = svc.RegionHealthChecks.Insert(project, region, &compute.HealthCheck{Name: ihc, Type: "HTTP", HttpHealthCheck: &compute.HTTPHealthCheck{Port: 10256, RequestPath: "/healthz"}}).Context(ctx).Do()
	do(op, err, "regionHealthChecks.insert")
	rhc, err := svc.RegionHealthChecks.Get(project, region, ihc).Context(ctx).Do()
	must(err, "regionHealthChecks.get")
	want(rhc.HttpHealthCheck != nil && rhc.HttpHealthCheck.Port == 10256 && last(rhc.Region) == region, "regionHealthChecks.get: %s port %d", rhc.Type, rhc.HttpHealthCheck.Port)
	bsName := "k8s-ilb-" + lb
	op, err = svc.RegionBackendServices.Insert(project, region, &compute.BackendService{Name: bsName, Protocol: "TCP", LoadBalancingScheme: "INTERNAL", HealthChecks: []string{rhc.SelfLink},
		Backends: []*compute.Backend{{Group: igg.SelfLink, BalancingMode: "CONNECTION"}}}).Context(ctx).Do()
	do(op, err, "regionBackendServices.insert")
	bs, err := svc.RegionBackendServices.Get(project, region, bsName).Context(ctx).Do()
	must(err, "regionBackendServices.get")
	want(len(bs.Backends) == 1 && bs.Fingerprint != "", "regionBackendServices.get: backends %d fingerprint %s", len(bs.Backends), bs.Fingerprint)
	health, err := svc.RegionBackendServices.GetHealth(project, region, bsName, &compute.ResourceGroupReference{Group: igg.SelfLink}).Context(ctx).Do()
	must(err, "regionBackendServices.getHealth")
	want(len(health.HealthStatus) == 1 && health.HealthStatus[0].HealthState == "HEALTHY", "regionBackendServices.getHealth: %d statuses", len(health.HealthStatus))
	stale := bs.Fingerprint
	bs.Description = "updated"
	op, err = svc.RegionBackendServices.Update(project, region, bsName, bs).Context(ctx).Do()
	do(op, err, "regionBackendServices.update")
	bs.Fingerprint = stale
	_, err = svc.RegionBackendServices.Update(project, region, bsName, bs).Context(ctx).Do()
	wantErr(err, 412, "conditionNotMet", "regionBackendServices.update with a stale fingerprint")
	op, err = svc.ForwardingRules.Insert(project, region, &compute.ForwardingRule{Name: "ilb-" + lb, LoadBalancingScheme: "INTERNAL", BackendService: bs.SelfLink, Ports: []string{"80"},
		Network: link("global", "networks", "k8s-net"), Subnetwork: link("regions/"+region, "subnetworks", "subnet-a"), AllowGlobalAccess: true}).Context(ctx).Do()
	do(op, err, "forwardingRules.insert internal")
	ifr, err := svc.ForwardingRules.Get(project, region, "ilb-"+lb).Context(ctx).Do()
	must(err, "forwardingRules.get internal")
	// Compute takes an internal rule's address from its subnetwork's range (subnet-a: 10.0.0.0/20).
	_, subnetA, _ := net.ParseCIDR("10.0.0.0/20")
	want(subnetA.Contains(net.ParseIP(ifr.IPAddress)) && ifr.AllowGlobalAccess, "forwardingRules.get internal: %s in subnet-a, global access %v", ifr.IPAddress, ifr.AllowGlobalAccess)
	_, err = svc.InstanceGroups.Delete(project, zoneA, ig).Context(ctx).Do()
	wantErr(err, 400, "resourceInUseByAnotherResource", "instanceGroups.delete while a backend service uses it")

	// ---- routes ----
	for i, nd := range []string{"node-0", "node-2"} {
		z := zoneA
		if i == 1 {
			z = zoneB
		}
		op, err = svc.Routes.Insert(project, &compute.Route{Name: fmt.Sprintf("kubernetes-%d-uid", i), DestRange: fmt.Sprintf("10.64.%d.0/24", i), Network: link("global", "networks", "k8s-net"),
			NextHopInstance: inst(z, nd), Priority: 1000, Description: "k8s-node-route"}).Context(ctx).Do()
		do(op, err, "routes.insert")
	}
	rl, err := svc.Routes.List(project).Filter(`name eq "kubernetes-.*"`).Context(ctx).Do()
	must(err, "routes.list")
	want(len(rl.Items) == 2 && rl.Items[0].NextHopInstance != "" && rl.Items[0].Priority == 1000, "routes.list: %d routes", len(rl.Items))
	_, err = svc.Routes.Insert(project, &compute.Route{Name: "kubernetes-0-uid", DestRange: "10.64.0.0/24", Network: link("global", "networks", "k8s-net"), NextHopInstance: inst(zoneA, "node-0")}).Context(ctx).Do()
	wantErr(err, 409, "alreadyExists", "routes.insert again")
	rt, err := svc.Routes.Get(project, "kubernetes-0-uid").Context(ctx).Do()
	must(err, "routes.get")
	want(rt.DestRange == "10.64.0.0/24" && rt.NextHopInstance == inst(zoneA, "node-0") && rt.Description == "k8s-node-route" && len(rt.Warnings) == 0,
		"routes.get: %s via %s", rt.DestRange, rt.NextHopInstance)
	// A route whose next-hop instance is deleted stays, with Compute's warning (the provider
	// reports it as a blackhole).
	op, err = svc.Routes.Insert(project, &compute.Route{Name: "kubernetes-9-uid", DestRange: "10.64.9.0/24", Network: link("global", "networks", "k8s-net"),
		NextHopInstance: inst(zoneB, "node-3"), Priority: 1000, Description: "k8s-node-route"}).Context(ctx).Do()
	do(op, err, "routes.insert to node-3")
	op, err = svc.Instances.Delete(project, zoneB, "node-3").Context(ctx).Do()
	do(op, err, "instances.delete node-3")
	rt, err = svc.Routes.Get(project, "kubernetes-9-uid").Context(ctx).Do()
	must(err, "routes.get to a deleted instance")
	want(len(rt.Warnings) == 1 && rt.Warnings[0].Code == "NEXT_HOP_INSTANCE_NOT_FOUND", "routes.get: next hop gone: %v", rt.Warnings)
	op, err = svc.Routes.Delete(project, "kubernetes-9-uid").Context(ctx).Do()
	do(op, err, "routes.delete to a deleted instance")
	for i := range rl.Items {
		op, err = svc.Routes.Delete(project, rl.Items[i].Name).Context(ctx).Do()
		do(op, err, "routes.delete")
	}
	_, err = svc.Routes.Delete(project, "kubernetes-0-uid").Context(ctx).Do()
	wantErr(err, 404, "notFound", "routes.delete again")

	// ---- teardown in upstream's order; nothing may remain ----
	op, err = svc.ForwardingRules.Delete(project, region, "ilb-"+lb).Context(ctx).Do()
	do(op, err, "forwardingRules.delete internal")
	op, err = svc.RegionBackendServices.Delete(project, region, bsName).Context(ctx).Do()
	do(op, err, "regionBackendServices.delete")
	op, err = svc.RegionHealthChecks.Delete(project, region, ihc).Context(ctx).Do()
	do(op, err, "regionHealthChecks.delete")
	op, err = svc.InstanceGroups.Delete(project, zoneA, ig).Context(ctx).Do()
	do(op, err, "instanceGroups.delete")
	op, err = svc.Firewalls.Delete(project, fw.Name).Context(ctx).Do()
	do(op, err, "firewalls.delete")
	op, err = svc.ForwardingRules.Delete(project, region, lb).Context(ctx).Do()
	do(op, err, "forwardingRules.delete")
	op, err = svc.TargetPools.Delete(project, region, lb).Context(ctx).Do()
	do(op, err, "targetPools.delete")
	op, err = svc.HttpHealthChecks.Delete(project, hcName).Context(ctx).Do()
	do(op, err, "httpHealthChecks.delete")
	op, err = svc.Addresses.Delete(project, region, lb).Context(ctx).Do()
	do(op, err, "addresses.delete")
	_, err = svc.Addresses.Get(project, region, lb).Context(ctx).Do()
	wantErr(err, 404, "notFound", "addresses.get after delete")

	loadBalancerExtras()
	behaviour(base)

	fmt.Printf("fidelity gcp: %d checks passed\n", checks)
}

// loadBalancerExtras drives the rest of the load balancers' calls: an address found by its IP
// (upstream's GetRegionAddressByIP), the static IP released while a forwarding rule uses it
// (Compute demotes it to the rule's ephemeral IP; upstream relies on it), and a regional
// health check's update.
func loadBalancerExtras() {
	link := func(scope, coll, name string) string {
		return "https://www.googleapis.com/compute/v1/projects/" + project + "/" + scope + "/" + coll + "/" + name
	}
	name := "a89abcdef0123456789abcdef0123456"
	op, err := svc.Addresses.Insert(project, region, &compute.Address{Name: name, NetworkTier: "PREMIUM"}).Context(ctx).Do()
	do(op, err, "addresses.insert (extras)")
	addr, err := svc.Addresses.Get(project, region, name).Context(ctx).Do()
	must(err, "addresses.get (extras)")
	al, err := svc.Addresses.List(project, region).Filter("address eq " + strings.ReplaceAll(addr.Address, ".", `\.`)).Context(ctx).Do()
	must(err, "addresses.list by IP")
	want(len(al.Items) == 1 && al.Items[0].Name == name, "addresses.list by IP %s: %d", addr.Address, len(al.Items))
	al, err = svc.Addresses.List(project, region).Filter(`address eq 203\.0\.113\.7`).Context(ctx).Do()
	must(err, "addresses.list by an unknown IP")
	want(len(al.Items) == 0, "addresses.list by an unknown IP: %d", len(al.Items))

	op, err = svc.TargetPools.Insert(project, region, &compute.TargetPool{Name: name, Instances: []string{link("zones/"+zoneA, "instances", "node-0")}, SessionAffinity: "NONE"}).Context(ctx).Do()
	do(op, err, "targetPools.insert (extras)")
	op, err = svc.ForwardingRules.Insert(project, region, &compute.ForwardingRule{Name: name, IPAddress: addr.Address, IPProtocol: "TCP", PortRange: "80-80",
		Target: link("regions/"+region, "targetPools", name), NetworkTier: "PREMIUM"}).Context(ctx).Do()
	do(op, err, "forwardingRules.insert (extras)")
	op, err = svc.Addresses.Delete(project, region, name).Context(ctx).Do()
	do(op, err, "addresses.delete while a forwarding rule uses it (released, the rule keeps the IP)")
	_, err = svc.Addresses.Get(project, region, name).Context(ctx).Do()
	wantErr(err, 404, "notFound", "addresses.get after its release")
	fr, err := svc.ForwardingRules.Get(project, region, name).Context(ctx).Do()
	must(err, "forwardingRules.get after the address release")
	want(fr.IPAddress == addr.Address, "forwardingRules.get: keeps %s", fr.IPAddress)
	op, err = svc.ForwardingRules.Delete(project, region, name).Context(ctx).Do()
	do(op, err, "forwardingRules.delete (extras)")
	op, err = svc.TargetPools.Delete(project, region, name).Context(ctx).Do()
	do(op, err, "targetPools.delete (extras)")

	hc := &compute.HealthCheck{Name: name, Type: "HTTP", CheckIntervalSec: 8, TimeoutSec: 1, HealthyThreshold: 1, UnhealthyThreshold: 3,
		HttpHealthCheck: &compute.HTTPHealthCheck{Port: 31000, RequestPath: "/healthz"}}
	op, err = svc.RegionHealthChecks.Insert(project, region, hc).Context(ctx).Do()
	do(op, err, "regionHealthChecks.insert (extras)")
	hc.HttpHealthCheck.Port = 31001
	op, err = svc.RegionHealthChecks.Update(project, region, name, hc).Context(ctx).Do()
	do(op, err, "regionHealthChecks.update")
	got, err := svc.RegionHealthChecks.Get(project, region, name).Context(ctx).Do()
	must(err, "regionHealthChecks.get after update")
	want(got.HttpHealthCheck != nil && got.HttpHealthCheck.Port == 31001 && got.CheckIntervalSec == 8, "regionHealthChecks.get: port %d", got.HttpHealthCheck.Port)
	op, err = svc.RegionHealthChecks.Delete(project, region, name).Context(ctx).Do()
	do(op, err, "regionHealthChecks.delete (extras)")
}

// admin calls the emulator kit's admin API (`/__emulator/<path>`, JSON), as a test would.
func admin(base, method, path string, body interface{}) {
	var rd *bytes.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	} else {
		rd = bytes.NewReader(nil)
	}
	req, err := http.NewRequest(method, base+"/__emulator/"+path, rd)
	must(err, "admin "+path)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	must(err, "admin "+path)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		fail("admin %s %s: %d", method, path, resp.StatusCode)
	}
}

// quotaOf reads a quota metric's limit and usage as Compute reports it (regions.get for
// regional metrics, projects.get for the project's).
func quotaOf(metric string, regional bool) (limit, usage float64) {
	var qs []*compute.Quota
	if regional {
		r, err := svc.Regions.Get(project, region).Context(ctx).Do()
		must(err, "regions.get quotas")
		qs = r.Quotas
	} else {
		p, err := svc.Projects.Get(project).Context(ctx).Do()
		must(err, "projects.get quotas")
		qs = p.Quotas
	}
	for _, q := range qs {
		if q.Metric == metric {
			return q.Limit, q.Usage
		}
	}
	fail("quota %s not reported", metric)
	return 0, 0
}

// wantQuota checks a 403 quotaExceeded naming the metric.
func wantQuota(err error, metric, what string) {
	var ge *googleapi.Error
	if !errors.As(err, &ge) || ge.Code != 403 || len(ge.Errors) == 0 || ge.Errors[0].Reason != "quotaExceeded" || !strings.Contains(ge.Message, "'"+metric+"'") {
		fail("%s: want 403 quotaExceeded naming %s, got %v", what, metric, err)
	}
	ok("%s -> 403 quotaExceeded (%s)", what, ge.Message)
}

// behaviour checks what Compute does, not only that its replies parse: a change is applied
// when its operation is DONE; a failed operation is DONE with error.errors[] and changes
// nothing; a change to a resource with an operation in flight is 400 resourceNotReady; the
// validation rules of forwarding rules, addresses, backend services and instance groups; and
// the quotas.
func behaviour(base string) {
	link := func(scope, coll, name string) string {
		return "https://www.googleapis.com/compute/v1/projects/" + project + "/" + scope + "/" + coll + "/" + name
	}
	network := link("global", "networks", "k8s-net")
	subnetA := link("regions/"+region, "subnetworks", "subnet-a")

	// ---- changes applied when the operation is DONE ----
	fw := &compute.Firewall{Name: "fw-behaviour", Network: network, SourceRanges: []string{"0.0.0.0/0"},
		Allowed: []*compute.FirewallAllowed{{IPProtocol: "tcp", Ports: []string{"80"}}}}
	op, err := svc.Firewalls.Insert(project, fw).Context(ctx).Do()
	must(err, "firewalls.insert (behaviour)")
	_, gerr := svc.Firewalls.Get(project, fw.Name).Context(ctx).Do()
	wantErr(gerr, 404, "notFound", "firewalls.get before the insert's operation is DONE")
	_, derr := svc.Firewalls.Delete(project, fw.Name).Context(ctx).Do()
	wantErr(derr, 400, "resourceNotReady", "firewalls.delete while its insert runs")
	waitOp(op, "firewalls.insert (behaviour)")
	op, err = svc.Firewalls.Patch(project, fw.Name, &compute.Firewall{SourceRanges: []string{"10.0.0.0/8"}}).Context(ctx).Do()
	must(err, "firewalls.patch (behaviour)")
	got, err := svc.Firewalls.Get(project, fw.Name).Context(ctx).Do()
	must(err, "firewalls.get during the patch")
	want(got.SourceRanges[0] == "0.0.0.0/0", "firewalls.get before the patch's operation is DONE: still %v", got.SourceRanges)
	_, perr := svc.Firewalls.Patch(project, fw.Name, &compute.Firewall{SourceRanges: []string{"192.168.0.0/16"}}).Context(ctx).Do()
	wantErr(perr, 400, "resourceNotReady", "firewalls.patch while another patch runs")
	waitOp(op, "firewalls.patch (behaviour)")
	got, err = svc.Firewalls.Get(project, fw.Name).Context(ctx).Do()
	must(err, "firewalls.get after the patch")
	want(got.SourceRanges[0] == "10.0.0.0/8", "firewalls.get after the patch's operation is DONE: %v", got.SourceRanges)
	op, err = svc.Firewalls.Delete(project, fw.Name).Context(ctx).Do()
	must(err, "firewalls.delete (behaviour)")
	_, err = svc.Firewalls.Get(project, fw.Name).Context(ctx).Do()
	want(err == nil, "firewalls.get before the delete's operation is DONE: still there")
	waitOp(op, "firewalls.delete (behaviour)")
	_, gerr = svc.Firewalls.Get(project, fw.Name).Context(ctx).Do()
	wantErr(gerr, 404, "notFound", "firewalls.get after the delete's operation is DONE")

	op, err = svc.Addresses.Insert(project, region, &compute.Address{Name: "addr-reserving"}).Context(ctx).Do()
	must(err, "addresses.insert (reserving)")
	a, err := svc.Addresses.Get(project, region, "addr-reserving").Context(ctx).Do()
	must(err, "addresses.get while reserving")
	want(a.Status == "RESERVING", "addresses.get before the insert's operation is DONE: %s", a.Status)
	waitOp(op, "addresses.insert (reserving)")
	a, err = svc.Addresses.Get(project, region, "addr-reserving").Context(ctx).Do()
	must(err, "addresses.get reserved")
	want(a.Status == "RESERVED", "addresses.get after the insert's operation is DONE: %s", a.Status)

	// ---- a failed operation: DONE with error.errors[], nothing created ----
	admin(base, "POST", "operation-failures", map[string]interface{}{"target": "*/firewalls/fw-fails", "action": "create", "times": 1, "message": "the emulator fails this insert"})
	op, err = svc.Firewalls.Insert(project, &compute.Firewall{Name: "fw-fails", Network: network, SourceRanges: []string{"0.0.0.0/0"},
		Allowed: []*compute.FirewallAllowed{{IPProtocol: "tcp", Ports: []string{"81"}}}}).Context(ctx).Do()
	must(err, "firewalls.insert (failing)")
	for op.Status != "DONE" {
		op, err = svc.GlobalOperations.Wait(project, op.Name).Context(ctx).Do()
		must(err, "globalOperations.wait (failing)")
	}
	want(op.Error != nil && len(op.Error.Errors) == 1 && op.Error.Errors[0].Code == "INTERNAL_ERROR" && op.Error.Errors[0].Message != "" && op.HttpErrorStatusCode == 500,
		"a failed operation is DONE with error.errors[0] %s %q (httpErrorStatusCode %d)", op.Error.Errors[0].Code, op.Error.Errors[0].Message, op.HttpErrorStatusCode)
	_, gerr = svc.Firewalls.Get(project, "fw-fails").Context(ctx).Do()
	wantErr(gerr, 404, "notFound", "firewalls.get after a failed insert (nothing created)")
	admin(base, "DELETE", "operation-failures", nil)

	// ---- backend services: an update needs the fingerprint ----
	bsName := "bs-behaviour"
	op, err = svc.RegionBackendServices.Insert(project, region, &compute.BackendService{Name: bsName, Protocol: "TCP", LoadBalancingScheme: "INTERNAL"}).Context(ctx).Do()
	do(op, err, "regionBackendServices.insert (behaviour)")
	bs, err := svc.RegionBackendServices.Get(project, region, bsName).Context(ctx).Do()
	must(err, "regionBackendServices.get (behaviour)")
	bs.Fingerprint = ""
	bs.Description = "no fingerprint"
	_, err = svc.RegionBackendServices.Update(project, region, bsName, bs).Context(ctx).Do()
	wantErr(err, 412, "conditionNotMet", "regionBackendServices.update without a fingerprint")
	_, err = svc.RegionBackendServices.Patch(project, region, bsName, &compute.BackendService{Description: "no fingerprint"}).Context(ctx).Do()
	wantErr(err, 412, "conditionNotMet", "regionBackendServices.patch without a fingerprint")

	// ---- addresses ----
	_, err = svc.Addresses.Insert(project, region, &compute.Address{Name: "addr-same-ip", Address: a.Address}).Context(ctx).Do()
	wantErr(err, 409, "conflict", "addresses.insert of an IP another address holds (IP_IN_USE_BY_ANOTHER_RESOURCE)")
	_, err = svc.Addresses.Insert(project, region, &compute.Address{Name: "addr-outside", AddressType: "INTERNAL", Address: "10.0.200.5", Subnetwork: subnetA}).Context(ctx).Do()
	wantErr(err, 400, "invalid", "addresses.insert of an internal IP outside its subnetwork")

	// ---- forwarding rules ----
	tpName := "tp-behaviour"
	op, err = svc.TargetPools.Insert(project, region, &compute.TargetPool{Name: tpName}).Context(ctx).Do()
	must(err, "targetPools.insert (behaviour)")
	_, err = svc.ForwardingRules.Insert(project, region, &compute.ForwardingRule{Name: "fr-not-ready", IPProtocol: "TCP", PortRange: "80", Target: link("regions/"+region, "targetPools", tpName)}).Context(ctx).Do()
	wantErr(err, 400, "resourceNotReady", "forwardingRules.insert naming a target pool whose insert runs")
	waitOp(op, "targetPools.insert (behaviour)")
	tp := link("regions/"+region, "targetPools", tpName)
	op, err = svc.ForwardingRules.Insert(project, region, &compute.ForwardingRule{Name: "fr-behaviour", IPAddress: a.Address, IPProtocol: "TCP", PortRange: "80-80", Target: tp}).Context(ctx).Do()
	do(op, err, "forwardingRules.insert (behaviour)")
	_, err = svc.ForwardingRules.Insert(project, region, &compute.ForwardingRule{Name: "fr-clash", IPAddress: a.Address, IPProtocol: "TCP", PortRange: "80-80", Target: tp}).Context(ctx).Do()
	wantErr(err, 400, "invalid", "forwardingRules.insert on an IP, protocol and port another rule uses")
	_, err = svc.ForwardingRules.Insert(project, region, &compute.ForwardingRule{Name: "fr-six-ports", LoadBalancingScheme: "INTERNAL", BackendService: bs.SelfLink,
		Ports: []string{"1", "2", "3", "4", "5", "6"}, Network: network, Subnetwork: subnetA}).Context(ctx).Do()
	wantErr(err, 400, "invalid", "forwardingRules.insert with more than 5 ports")
	_, err = svc.ForwardingRules.Insert(project, region, &compute.ForwardingRule{Name: "fr-ports-and-range", LoadBalancingScheme: "INTERNAL", BackendService: bs.SelfLink,
		Ports: []string{"80"}, PortRange: "80-80", Network: network, Subnetwork: subnetA}).Context(ctx).Do()
	wantErr(err, 400, "invalid", "forwardingRules.insert with ports and portRange")
	_, err = svc.ForwardingRules.Insert(project, region, &compute.ForwardingRule{Name: "fr-no-backend", LoadBalancingScheme: "INTERNAL", Ports: []string{"80"}, Network: network, Subnetwork: subnetA}).Context(ctx).Do()
	wantErr(err, 400, "invalid", "forwardingRules.insert INTERNAL without a backend service")
	op, err = svc.Addresses.Insert(project, region, &compute.Address{Name: "addr-standard", NetworkTier: "STANDARD"}).Context(ctx).Do()
	do(op, err, "addresses.insert STANDARD")
	std, err := svc.Addresses.Get(project, region, "addr-standard").Context(ctx).Do()
	must(err, "addresses.get STANDARD")
	_, err = svc.ForwardingRules.Insert(project, region, &compute.ForwardingRule{Name: "fr-tier", IPAddress: std.Address, IPProtocol: "TCP", PortRange: "80-80", Target: tp, NetworkTier: "PREMIUM"}).Context(ctx).Do()
	wantErr(err, 400, "invalid", "forwardingRules.insert PREMIUM on a STANDARD address")

	// ---- instance groups: instances of the group's zone only ----
	ig := "ig-behaviour"
	op, err = svc.InstanceGroups.Insert(project, zoneA, &compute.InstanceGroup{Name: ig, Network: network}).Context(ctx).Do()
	do(op, err, "instanceGroups.insert (behaviour)")
	_, err = svc.InstanceGroups.AddInstances(project, zoneA, ig, &compute.InstanceGroupsAddInstancesRequest{Instances: []*compute.InstanceReference{{Instance: link("zones/"+zoneB, "instances", "node-2")}}}).Context(ctx).Do()
	wantErr(err, 400, "invalid", "instanceGroups.addInstances of an instance of another zone")

	// ---- quotas: 403 quotaExceeded naming the metric ----
	limit, usage := quotaOf("STATIC_ADDRESSES", true)
	for i := int(usage); i < int(limit); i++ {
		_, err = svc.Addresses.Insert(project, region, &compute.Address{Name: fmt.Sprintf("q-addr-%d", i)}).Context(ctx).Do()
		must(err, "addresses.insert up to the quota")
	}
	_, err = svc.Addresses.Insert(project, region, &compute.Address{Name: "q-addr-over"}).Context(ctx).Do()
	wantQuota(err, "STATIC_ADDRESSES", fmt.Sprintf("addresses.insert past STATIC_ADDRESSES (limit %.0f)", limit))

	limit, usage = quotaOf("FORWARDING_RULES", true)
	for i := int(usage); i < int(limit); i++ {
		_, err = svc.ForwardingRules.Insert(project, region, &compute.ForwardingRule{Name: fmt.Sprintf("q-fr-%d", i), LoadBalancingScheme: "INTERNAL", BackendService: bs.SelfLink,
			Ports: []string{"80"}, Network: network, Subnetwork: subnetA}).Context(ctx).Do()
		must(err, "forwardingRules.insert up to the quota")
	}
	_, err = svc.ForwardingRules.Insert(project, region, &compute.ForwardingRule{Name: "q-fr-over", LoadBalancingScheme: "INTERNAL", BackendService: bs.SelfLink,
		Ports: []string{"80"}, Network: network, Subnetwork: subnetA}).Context(ctx).Do()
	wantQuota(err, "FORWARDING_RULES", fmt.Sprintf("forwardingRules.insert past FORWARDING_RULES (limit %.0f)", limit))

	limit, usage = quotaOf("FIREWALLS", false)
	for i := int(usage); i < int(limit); i++ {
		_, err = svc.Firewalls.Insert(project, &compute.Firewall{Name: fmt.Sprintf("q-fw-%d", i), Network: network, SourceRanges: []string{"0.0.0.0/0"},
			Allowed: []*compute.FirewallAllowed{{IPProtocol: "tcp"}}}).Context(ctx).Do()
		must(err, "firewalls.insert up to the quota")
	}
	_, err = svc.Firewalls.Insert(project, &compute.Firewall{Name: "q-fw-over", Network: network}).Context(ctx).Do()
	wantQuota(err, "FIREWALLS", fmt.Sprintf("firewalls.insert past FIREWALLS (limit %.0f)", limit))

	limit, usage = quotaOf("HEALTH_CHECKS", false)
	for i := int(usage); i < int(limit); i++ {
		_, err = svc.HealthChecks.Insert(project, &compute.HealthCheck{Name: fmt.Sprintf("q-hc-%d", i), Type: "TCP", TcpHealthCheck: &compute.TCPHealthCheck{Port: 80}}).Context(ctx).Do()
		must(err, "healthChecks.insert up to the quota")
	}
	_, err = svc.HealthChecks.Insert(project, &compute.HealthCheck{Name: "q-hc-over", Type: "TCP", TcpHealthCheck: &compute.TCPHealthCheck{Port: 80}}).Context(ctx).Do()
	wantQuota(err, "HEALTH_CHECKS", fmt.Sprintf("healthChecks.insert past HEALTH_CHECKS (limit %.0f)", limit))

	limit, usage = quotaOf("BACKEND_SERVICES", false)
	for i := int(usage); i < int(limit); i++ {
		_, err = svc.BackendServices.Insert(project, &compute.BackendService{Name: fmt.Sprintf("q-bs-%d", i), Protocol: "TCP"}).Context(ctx).Do()
		must(err, "backendServices.insert up to the quota")
	}
	_, err = svc.BackendServices.Insert(project, &compute.BackendService{Name: "q-bs-over", Protocol: "TCP"}).Context(ctx).Do()
	wantQuota(err, "BACKEND_SERVICES", fmt.Sprintf("backendServices.insert past BACKEND_SERVICES (limit %.0f)", limit))
}

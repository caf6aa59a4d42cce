// Fidelity check of the IBM Cloud emulator (testbed/emulators/src/ibm.rs): IBM's own Go SDKs
// (github.com/IBM/vpc-go-sdk v1.0.2, github.com/IBM/go-sdk-core/v5 with its IAM authenticator)
// drive every call the IBM provider makes, and the program exits non-zero when a reply does
// not parse or does not mean what IBM's API means.
//
// Usage: EMULATOR_URL=http://127.0.0.1:PORT go run .
// (ci/fidelity starts the emulator with ci/fidelity/ibm/world.yaml and sets EMULATOR_URL.)
package main

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"sort"
	"strings"
	"time"

	"github.com/IBM/go-sdk-core/v5/core"
	"github.com/IBM/vpc-go-sdk/vpcv1"
)

const (
	apiKey  = "ibm-emulator-api-key" // the emulator's default API key
	vpcName = "vpc-1"
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

func str(p *string) string {
	if p == nil {
		return "<nil>"
	}
	return *p
}

func i64(v int64) *int64 { return &v }

func statusOf(resp *core.DetailedResponse) int {
	if resp == nil {
		return 0
	}
	return resp.StatusCode
}

func main() {
	base := strings.TrimRight(os.Getenv("EMULATOR_URL"), "/")
	if base == "" {
		fail("EMULATOR_URL is not set")
	}

	// IAM: a wrong key is refused with IAM's error; the right one authenticates.
	bad := &core.IamAuthenticator{ApiKey: "not-a-key", URL: base}
	if _, err := bad.RequestToken(); err == nil {
		fail("IAM accepted an unknown API key")
	} else {
		var ae *core.AuthenticationError
		if !errors.As(err, &ae) || ae.Response == nil || ae.Response.StatusCode != 400 {
			fail("IAM unknown key: want an AuthenticationError with status 400, got %v", err)
		}
		ok("iam.token: unknown API key -> 400 (%v)", err)
	}
	auth := &core.IamAuthenticator{ApiKey: apiKey, URL: base}
	tok, err := auth.RequestToken()
	must(err, "iam.token")
	if tok.TokenType != "Bearer" || tok.ExpiresIn <= 0 || tok.Expiration <= time.Now().Unix() ||
		len(strings.Split(tok.AccessToken, ".")) != 3 || tok.RefreshToken == "" {
		fail("iam.token reply does not mean a bearer token: %+v", tok)
	}
	ok("iam.token: Bearer token, expires_in %d, expiration %d", tok.ExpiresIn, tok.Expiration)

	vpc, err := vpcv1.NewVpcV1(&vpcv1.VpcV1Options{URL: base + "/v1", Authenticator: auth})
	must(err, "vpc client")

	// Without a token: 401 with IBM's error body.
	unauth, err := vpcv1.NewVpcV1(&vpcv1.VpcV1Options{URL: base + "/v1", Authenticator: &core.NoAuthAuthenticator{}})
	must(err, "vpc client without auth")
	_, resp, err := unauth.ListVpcs(&vpcv1.ListVpcsOptions{})
	if err == nil || statusOf(resp) != 401 {
		fail("a call without a token: want 401, got %d (%v)", statusOf(resp), err)
	}
	ok("no token -> 401 (%v)", err)

	// Resource Manager: the resource group by name (plain request through the authenticator).
	rgID := resourceGroup(base, auth, "default")
	ok("resource_manager.resource_groups.list: default -> %s", rgID)

	// VPCs.
	vpcs, _, err := vpc.ListVpcs(&vpcv1.ListVpcsOptions{})
	must(err, "vpc.vpcs.list")
	var vpcID string
	for _, v := range vpcs.Vpcs {
		if str(v.Name) == vpcName {
			vpcID = str(v.ID)
		}
	}
	if vpcID == "" {
		fail("vpc.vpcs.list has no VPC %q", vpcName)
	}
	ok("vpc.vpcs.list: %d VPCs, %s = %s", len(vpcs.Vpcs), vpcName, vpcID)

	// Subnets: list, then get each.
	subnets, _, err := vpc.ListSubnets(&vpcv1.ListSubnetsOptions{})
	must(err, "vpc.subnets.list")
	if len(subnets.Subnets) == 0 {
		fail("vpc.subnets.list is empty")
	}
	subnetByName := map[string]vpcv1.Subnet{}
	for _, s := range subnets.Subnets {
		got, _, err := vpc.GetSubnet(&vpcv1.GetSubnetOptions{ID: s.ID})
		must(err, "vpc.subnets.get")
		if str(got.Name) != str(s.Name) || got.Zone == nil || got.Zone.Name == nil || got.VPC == nil ||
			got.Ipv4CIDRBlock == nil {
			fail("vpc.subnets.get %s does not describe the listed subnet: %+v", str(s.ID), got)
		}
		subnetByName[str(s.Name)] = *got
	}
	ok("vpc.subnets.list/get: %d subnets", len(subnets.Subnets))

	// Instances: the whole VPC in pages of 2, then by name.
	var all []vpcv1.Instance
	opts := &vpcv1.ListInstancesOptions{VPCName: core.StringPtr(vpcName), Limit: i64(2)}
	pages := 0
	for {
		page, _, err := vpc.ListInstances(opts)
		must(err, "vpc.instances.list")
		pages++
		if len(page.Instances) > 2 {
			fail("vpc.instances.list with limit 2 returned %d instances", len(page.Instances))
		}
		all = append(all, page.Instances...)
		start, err := page.GetNextStart()
		must(err, "vpc.instances.list next start")
		if start == nil {
			break
		}
		if pages > 50 {
			fail("vpc.instances.list paging does not end")
		}
		opts.Start = start
	}
	names := []string{}
	for _, in := range all {
		names = append(names, str(in.Name))
		if in.VPC == nil || str(in.VPC.Name) != vpcName {
			fail("vpc.instances.list vpc.name=%s returned %s in VPC %+v", vpcName, str(in.Name), in.VPC)
		}
	}
	sort.Strings(names)
	want := "node-0,node-1,node-2,node-3,node-4"
	if strings.Join(names, ",") != want {
		fail("vpc.instances.list vpc.name=%s: want %s, got %v", vpcName, want, names)
	}
	ok("vpc.instances.list: %d instances of %s in %d pages", len(all), vpcName, pages)

	byName, _, err := vpc.ListInstances(&vpcv1.ListInstancesOptions{Name: core.StringPtr("node-1"), VPCName: core.StringPtr(vpcName)})
	must(err, "vpc.instances.list name=node-1")
	if len(byName.Instances) != 1 {
		fail("vpc.instances.list name=node-1: want 1 instance, got %d", len(byName.Instances))
	}
	n1 := byName.Instances[0]
	if n1.PrimaryNetworkInterface == nil || n1.PrimaryNetworkInterface.PrimaryIP == nil ||
		str(n1.PrimaryNetworkInterface.PrimaryIP.Address) != "10.0.0.11" || str(n1.Zone.Name) != "us-south-1" ||
		str(n1.Profile.Name) != "bx2-4x16" || str(n1.Status) != "running" {
		fail("node-1 does not read as the world says (10.0.0.11, us-south-1, bx2-4x16, running): %s",
			dump(n1))
	}
	ok("vpc.instances.list name=node-1: %s %s %s %s", str(n1.ID), str(n1.PrimaryNetworkInterface.PrimaryIP.Address), str(n1.Zone.Name), str(n1.Status))

	got, _, err := vpc.GetInstance(&vpcv1.GetInstanceOptions{ID: n1.ID})
	must(err, "vpc.instances.get")
	if str(got.Name) != "node-1" {
		fail("vpc.instances.get %s: got %s", str(n1.ID), str(got.Name))
	}
	stopped, _, err := vpc.ListInstances(&vpcv1.ListInstancesOptions{Name: core.StringPtr("node-4")})
	must(err, "vpc.instances.list name=node-4")
	if len(stopped.Instances) != 1 || str(stopped.Instances[0].Status) != "stopped" {
		fail("node-4 should be stopped: %s", dump(stopped))
	}
	ok("vpc.instances.get; node-4 status stopped")

	_, resp, err = vpc.GetInstance(&vpcv1.GetInstanceOptions{ID: core.StringPtr("0717_does-not-exist")})
	if err == nil || statusOf(resp) != 404 {
		fail("vpc.instances.get unknown: want 404, got %d (%v)", statusOf(resp), err)
	}
	ok("vpc.instances.get unknown -> 404 (%v)", err)

	loadBalancers(vpc, subnetByName, rgID)
	behaviour(base, vpc, subnetByName)
	fmt.Printf("%d passed, 0 failed\n", checks)
}

func dump(v interface{}) string {
	b, _ := json.Marshal(v)
	return string(b)
}

func resourceGroup(base string, auth core.Authenticator, name string) string {
	req, err := core.NewRequestBuilder(core.GET).ResolveRequestURL(base, "/v2/resource_groups", nil)
	must(err, "resource groups request")
	req.AddQuery("name", name)
	hreq, err := req.Build()
	must(err, "resource groups request")
	must(auth.Authenticate(hreq), "authenticate")
	res, err := http.DefaultClient.Do(hreq)
	must(err, "resource_manager.resource_groups.list")
	defer res.Body.Close()
	var body struct {
		Resources []struct {
			ID   string `json:"id"`
			Name string `json:"name"`
		} `json:"resources"`
	}
	must(json.NewDecoder(res.Body).Decode(&body), "resource groups reply")
	if res.StatusCode != 200 || len(body.Resources) != 1 || body.Resources[0].Name != name {
		fail("resource_manager.resource_groups.list name=%s: status %d, %+v", name, res.StatusCode, body)
	}
	return body.Resources[0].ID
}

// waitActive polls the load balancer until it is active; it must pass through pending first
// when `pending` is the status the change reported.
func waitActive(vpc *vpcv1.VpcV1, id string) *vpcv1.LoadBalancer {
	deadline := time.Now().Add(60 * time.Second)
	for {
		lb, _, err := vpc.GetLoadBalancer(&vpcv1.GetLoadBalancerOptions{ID: &id})
		must(err, "vpc.load_balancers.get")
		switch s := str(lb.ProvisioningStatus); s {
		case "active":
			return lb
		case "create_pending", "update_pending":
		default:
			fail("load balancer %s: unexpected provisioning_status %q while waiting for active", id, s)
		}
		if time.Now().After(deadline) {
			fail("load balancer %s not active after 60 s", id)
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// expectConflict checks that a change while the load balancer is pending is a 409.
func expectConflict(what string, resp *core.DetailedResponse, err error) {
	if err == nil || statusOf(resp) != 409 {
		fail("%s while the load balancer is pending: want 409, got %d (%v)", what, statusOf(resp), err)
	}
	ok("%s while pending -> 409 (%v)", what, err)
}

func loadBalancers(vpc *vpcv1.VpcV1, subnets map[string]vpcv1.Subnet, rgID string) {
	subnet := subnets["subnet-a"]
	name := "kube-fidelity-0123456789abcdef0123456789abcdef"
	hm := &vpcv1.LoadBalancerPoolHealthMonitorPrototype{Delay: i64(5), MaxRetries: i64(2), Timeout: i64(2), Type: core.StringPtr("tcp"), Port: i64(30080)}
	pool := vpcv1.LoadBalancerPoolPrototype{
		Name: core.StringPtr("tcp-80-30080"), Algorithm: core.StringPtr("round_robin"), Protocol: core.StringPtr("tcp"),
		HealthMonitor: hm, ProxyProtocol: core.StringPtr("disabled"),
		Members: []vpcv1.LoadBalancerPoolMemberPrototype{
			{Port: i64(30080), Target: &vpcv1.LoadBalancerPoolMemberTargetPrototypeIP{Address: core.StringPtr("10.0.0.10")}},
		},
	}
	created, resp, err := vpc.CreateLoadBalancer(&vpcv1.CreateLoadBalancerOptions{
		Name: &name, IsPublic: core.BoolPtr(true),
		Subnets:       []vpcv1.SubnetIdentityIntf{&vpcv1.SubnetIdentityByID{ID: subnet.ID}},
		ResourceGroup: &vpcv1.ResourceGroupIdentityByID{ID: &rgID},
		Pools:         []vpcv1.LoadBalancerPoolPrototype{pool},
		Listeners: []vpcv1.LoadBalancerListenerPrototypeLoadBalancerContext{
			{Port: i64(80), Protocol: core.StringPtr("tcp"), DefaultPool: &vpcv1.LoadBalancerPoolIdentityByName{Name: core.StringPtr("tcp-80-30080")}},
		},
	})
	must(err, "vpc.load_balancers.create")
	if statusOf(resp) != 201 || str(created.ProvisioningStatus) != "create_pending" || created.IsPublic == nil || !*created.IsPublic ||
		len(created.Listeners) != 1 || len(created.Pools) != 1 || len(created.Subnets) != 1 || str(created.Name) != name {
		fail("vpc.load_balancers.create reply: status %d, %s", statusOf(resp), dump(created))
	}
	ok("vpc.load_balancers.create: %s %s", str(created.ID), str(created.ProvisioningStatus))
	lbID := str(created.ID)

	// While create_pending: changes are 409.
	_, resp, err = vpc.CreateLoadBalancerListener(&vpcv1.CreateLoadBalancerListenerOptions{LoadBalancerID: &lbID, Port: i64(443), Protocol: core.StringPtr("tcp")})
	expectConflict("vpc.load_balancer_listeners.create", resp, err)

	lb := waitActive(vpc, lbID)
	if lb.Hostname == nil || *lb.Hostname == "" || len(lb.PublicIps) == 0 || str(lb.OperatingStatus) != "online" {
		fail("active load balancer has no hostname / public IP / online status: %s", dump(lb))
	}
	ok("vpc.load_balancers.get: active, hostname %s", str(lb.Hostname))

	list, _, err := vpc.ListLoadBalancers(&vpcv1.ListLoadBalancersOptions{})
	must(err, "vpc.load_balancers.list")
	found := false
	for _, l := range list.LoadBalancers {
		found = found || str(l.ID) == lbID
	}
	if !found {
		fail("vpc.load_balancers.list does not list %s", lbID)
	}
	ok("vpc.load_balancers.list: %d", len(list.LoadBalancers))

	listeners, _, err := vpc.ListLoadBalancerListeners(&vpcv1.ListLoadBalancerListenersOptions{LoadBalancerID: &lbID})
	must(err, "vpc.load_balancer_listeners.list")
	pools, _, err := vpc.ListLoadBalancerPools(&vpcv1.ListLoadBalancerPoolsOptions{LoadBalancerID: &lbID})
	must(err, "vpc.load_balancer_pools.list")
	if len(listeners.Listeners) != 1 || len(pools.Pools) != 1 || listeners.Listeners[0].DefaultPool == nil ||
		str(listeners.Listeners[0].DefaultPool.ID) != str(pools.Pools[0].ID) || *listeners.Listeners[0].Port != 80 {
		fail("the inline listener and pool do not read back: %s %s", dump(listeners), dump(pools))
	}
	p0 := pools.Pools[0]
	if p0.HealthMonitor == nil || *p0.HealthMonitor.Delay != 5 || *p0.HealthMonitor.MaxRetries != 2 || *p0.HealthMonitor.Timeout != 2 ||
		str(p0.HealthMonitor.Type) != "tcp" || p0.HealthMonitor.Port == nil || *p0.HealthMonitor.Port != 30080 || str(p0.Algorithm) != "round_robin" {
		fail("pool health monitor does not read back: %s", dump(p0))
	}
	ok("vpc.load_balancer_listeners.list / pools.list: listener 80 -> pool %s", str(p0.Name))

	// A second port: pool, then listener, then members.
	p2, resp, err := vpc.CreateLoadBalancerPool(&vpcv1.CreateLoadBalancerPoolOptions{
		LoadBalancerID: &lbID, Name: core.StringPtr("tcp-443-30443"), Algorithm: core.StringPtr("round_robin"),
		Protocol:      core.StringPtr("tcp"),
		HealthMonitor: &vpcv1.LoadBalancerPoolHealthMonitorPrototype{Delay: i64(5), MaxRetries: i64(2), Timeout: i64(2), Type: core.StringPtr("tcp"), Port: i64(30443)},
		ProxyProtocol: core.StringPtr("v1"),
	})
	must(err, "vpc.load_balancer_pools.create")
	if statusOf(resp) != 201 || str(p2.ProvisioningStatus) != "create_pending" || str(p2.ProxyProtocol) != "v1" {
		fail("vpc.load_balancer_pools.create reply: %d %s", statusOf(resp), dump(p2))
	}
	lb, _, err = vpc.GetLoadBalancer(&vpcv1.GetLoadBalancerOptions{ID: &lbID})
	must(err, "vpc.load_balancers.get")
	if str(lb.ProvisioningStatus) != "update_pending" {
		fail("after a pool create the load balancer should be update_pending, is %s", str(lb.ProvisioningStatus))
	}
	ok("vpc.load_balancer_pools.create: %s, load balancer update_pending", str(p2.ID))
	resp, err = vpc.DeleteLoadBalancer(&vpcv1.DeleteLoadBalancerOptions{ID: &lbID})
	expectConflict("vpc.load_balancers.delete", resp, err)
	waitActive(vpc, lbID)

	l2, resp, err := vpc.CreateLoadBalancerListener(&vpcv1.CreateLoadBalancerListenerOptions{
		LoadBalancerID: &lbID, Port: i64(443), Protocol: core.StringPtr("tcp"), DefaultPool: &vpcv1.LoadBalancerPoolIdentityByID{ID: p2.ID},
	})
	must(err, "vpc.load_balancer_listeners.create")
	if statusOf(resp) != 201 || l2.DefaultPool == nil || str(l2.DefaultPool.ID) != str(p2.ID) {
		fail("vpc.load_balancer_listeners.create reply: %s", dump(l2))
	}
	ok("vpc.load_balancer_listeners.create: 443 -> %s", str(l2.DefaultPool.Name))
	waitActive(vpc, lbID)

	for _, addr := range []string{"10.0.0.10", "10.0.0.11"} {
		m, resp, err := vpc.CreateLoadBalancerPoolMember(&vpcv1.CreateLoadBalancerPoolMemberOptions{
			LoadBalancerID: &lbID, PoolID: p2.ID, Port: i64(30443),
			Target: &vpcv1.LoadBalancerPoolMemberTargetPrototypeIP{Address: core.StringPtr(addr)},
		})
		must(err, "vpc.load_balancer_pool_members.create")
		tgt, isIP := m.Target.(*vpcv1.LoadBalancerPoolMemberTarget)
		if statusOf(resp) != 201 || !isIP || str(tgt.Address) != addr || *m.Port != 30443 {
			fail("vpc.load_balancer_pool_members.create reply: %s", dump(m))
		}
		waitActive(vpc, lbID)
	}
	members, _, err := vpc.ListLoadBalancerPoolMembers(&vpcv1.ListLoadBalancerPoolMembersOptions{LoadBalancerID: &lbID, PoolID: p2.ID})
	must(err, "vpc.load_balancer_pool_members.list")
	if len(members.Members) != 2 {
		fail("want 2 members, got %s", dump(members))
	}
	ok("vpc.load_balancer_pool_members.create/list: 2 members")

	// Replace the members (node change): one old, one new.
	replaced, resp, err := vpc.ReplaceLoadBalancerPoolMembers(&vpcv1.ReplaceLoadBalancerPoolMembersOptions{
		LoadBalancerID: &lbID, PoolID: p2.ID,
		Members: []vpcv1.LoadBalancerPoolMemberPrototype{
			{Port: i64(30443), Target: &vpcv1.LoadBalancerPoolMemberTargetPrototypeIP{Address: core.StringPtr("10.0.0.11")}},
			{Port: i64(30443), Target: &vpcv1.LoadBalancerPoolMemberTargetPrototypeIP{Address: core.StringPtr("10.0.1.12")}},
		},
	})
	must(err, "vpc.load_balancer_pool_members.replace")
	if statusOf(resp) != 202 || len(replaced.Members) != 2 {
		fail("vpc.load_balancer_pool_members.replace reply: %d %s", statusOf(resp), dump(replaced))
	}
	_, resp, err = vpc.ReplaceLoadBalancerPoolMembers(&vpcv1.ReplaceLoadBalancerPoolMembersOptions{
		LoadBalancerID: &lbID, PoolID: p2.ID, Members: []vpcv1.LoadBalancerPoolMemberPrototype{},
	})
	expectConflict("vpc.load_balancer_pool_members.replace", resp, err)
	waitActive(vpc, lbID)
	members, _, err = vpc.ListLoadBalancerPoolMembers(&vpcv1.ListLoadBalancerPoolMembersOptions{LoadBalancerID: &lbID, PoolID: p2.ID})
	must(err, "vpc.load_balancer_pool_members.list")
	addrs := []string{}
	for _, m := range members.Members {
		addrs = append(addrs, str(m.Target.(*vpcv1.LoadBalancerPoolMemberTarget).Address))
	}
	sort.Strings(addrs)
	if strings.Join(addrs, ",") != "10.0.0.11,10.0.1.12" {
		fail("after replace: want members 10.0.0.11,10.0.1.12, got %v", addrs)
	}
	ok("vpc.load_balancer_pool_members.replace: %v", addrs)

	// Delete one member.
	_, err = vpc.DeleteLoadBalancerPoolMember(&vpcv1.DeleteLoadBalancerPoolMemberOptions{LoadBalancerID: &lbID, PoolID: p2.ID, ID: members.Members[0].ID})
	must(err, "vpc.load_balancer_pool_members.delete")
	waitActive(vpc, lbID)
	members, _, err = vpc.ListLoadBalancerPoolMembers(&vpcv1.ListLoadBalancerPoolMembersOptions{LoadBalancerID: &lbID, PoolID: p2.ID})
	must(err, "vpc.load_balancer_pool_members.list")
	if len(members.Members) != 1 {
		fail("after a member delete: want 1 member, got %d", len(members.Members))
	}
	ok("vpc.load_balancer_pool_members.delete")

	// Health monitor: TCP on the node port -> HTTP on the health-check node port (Local).
	patch, err := (&vpcv1.LoadBalancerPoolPatch{HealthMonitor: &vpcv1.LoadBalancerPoolHealthMonitorPatch{
		Delay: i64(5), MaxRetries: i64(2), Timeout: i64(2), Type: core.StringPtr("http"), Port: i64(31999), URLPath: core.StringPtr("/"),
	}}).AsPatch()
	must(err, "pool patch")
	up, _, err := vpc.UpdateLoadBalancerPool(&vpcv1.UpdateLoadBalancerPoolOptions{LoadBalancerID: &lbID, ID: p2.ID, LoadBalancerPoolPatch: patch})
	must(err, "vpc.load_balancer_pools.update")
	if str(up.HealthMonitor.Type) != "http" || *up.HealthMonitor.Port != 31999 || str(up.HealthMonitor.URLPath) != "/" ||
		str(up.ProvisioningStatus) != "update_pending" {
		fail("vpc.load_balancer_pools.update reply: %s", dump(up))
	}
	ok("vpc.load_balancer_pools.update: health monitor http:31999/")
	waitActive(vpc, lbID)

	// A pool in use by a listener cannot be deleted; delete listener then pool.
	resp, err = vpc.DeleteLoadBalancerPool(&vpcv1.DeleteLoadBalancerPoolOptions{LoadBalancerID: &lbID, ID: p2.ID})
	if err == nil || statusOf(resp) != 409 {
		fail("deleting a listener's default pool: want 409, got %d (%v)", statusOf(resp), err)
	}
	ok("vpc.load_balancer_pools.delete of a default pool -> 409 (%v)", err)
	_, err = vpc.DeleteLoadBalancerListener(&vpcv1.DeleteLoadBalancerListenerOptions{LoadBalancerID: &lbID, ID: l2.ID})
	must(err, "vpc.load_balancer_listeners.delete")
	waitActive(vpc, lbID)
	_, err = vpc.DeleteLoadBalancerPool(&vpcv1.DeleteLoadBalancerPoolOptions{LoadBalancerID: &lbID, ID: p2.ID})
	must(err, "vpc.load_balancer_pools.delete")
	waitActive(vpc, lbID)
	listeners, _, err = vpc.ListLoadBalancerListeners(&vpcv1.ListLoadBalancerListenersOptions{LoadBalancerID: &lbID})
	must(err, "vpc.load_balancer_listeners.list")
	pools, _, err = vpc.ListLoadBalancerPools(&vpcv1.ListLoadBalancerPoolsOptions{LoadBalancerID: &lbID})
	must(err, "vpc.load_balancer_pools.list")
	if len(listeners.Listeners) != 1 || len(pools.Pools) != 1 {
		fail("after deleting listener and pool of 443: %d listeners, %d pools", len(listeners.Listeners), len(pools.Pools))
	}
	ok("vpc.load_balancer_listeners.delete, vpc.load_balancer_pools.delete")

	// Delete the load balancer: delete_pending, then gone (404).
	resp, err = vpc.DeleteLoadBalancer(&vpcv1.DeleteLoadBalancerOptions{ID: &lbID})
	must(err, "vpc.load_balancers.delete")
	lb, _, err = vpc.GetLoadBalancer(&vpcv1.GetLoadBalancerOptions{ID: &lbID})
	if err == nil && str(lb.ProvisioningStatus) != "delete_pending" {
		fail("after delete the load balancer should be delete_pending, is %s", str(lb.ProvisioningStatus))
	}
	deadline := time.Now().Add(60 * time.Second)
	for {
		_, resp, err = vpc.GetLoadBalancer(&vpcv1.GetLoadBalancerOptions{ID: &lbID})
		if err != nil && statusOf(resp) == 404 {
			break
		}
		if err != nil {
			fail("vpc.load_balancers.get while deleting: %v", err)
		}
		if time.Now().After(deadline) {
			fail("load balancer %s not gone 60 s after delete", lbID)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ok("vpc.load_balancers.delete: delete_pending, then 404 (%v)", err)
}

// errCode is the first `errors[].code` of an IBM error reply as the SDK hands it back.
func errCode(resp *core.DetailedResponse) string {
	if resp == nil {
		return ""
	}
	m, isMap := resp.Result.(map[string]interface{})
	if !isMap {
		return ""
	}
	list, _ := m["errors"].([]interface{})
	if len(list) == 0 {
		return ""
	}
	e, _ := list[0].(map[string]interface{})
	c, _ := e["code"].(string)
	return c
}

// admin calls the emulator kit's admin API (`/__emulator/<path>`, JSON), as a test would.
func admin(base, method, path string, body interface{}) {
	b, _ := json.Marshal(body)
	if body == nil {
		b = nil
	}
	req, err := http.NewRequest(method, base+"/__emulator/"+path, bytes.NewReader(b))
	must(err, "admin "+path)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	must(err, "admin "+path)
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		fail("admin %s %s: %d", method, path, resp.StatusCode)
	}
}

// behaviour checks what IBM Cloud does, not only that its replies parse: a pool member
// outside the load balancer's VPC is refused; a load balancer whose provisioning failed is
// `failed` (operating_status `offline`) and can be deleted; the region's load balancer quota.
func behaviour(base string, vpc *vpcv1.VpcV1, subnets map[string]vpcv1.Subnet) {
	subnet := subnets["subnet-a"]
	hm := &vpcv1.LoadBalancerPoolHealthMonitorPrototype{Delay: i64(5), MaxRetries: i64(2), Timeout: i64(2), Type: core.StringPtr("tcp"), Port: i64(30080)}
	create := func(name string, members []vpcv1.LoadBalancerPoolMemberPrototype) (*vpcv1.LoadBalancer, *core.DetailedResponse, error) {
		opts := &vpcv1.CreateLoadBalancerOptions{
			Name: core.StringPtr(name), IsPublic: core.BoolPtr(false),
			Subnets: []vpcv1.SubnetIdentityIntf{&vpcv1.SubnetIdentityByID{ID: subnet.ID}},
		}
		if members != nil {
			opts.Pools = []vpcv1.LoadBalancerPoolPrototype{{Name: core.StringPtr("tcp-80-30080"), Algorithm: core.StringPtr("round_robin"),
				Protocol: core.StringPtr("tcp"), HealthMonitor: hm, Members: members}}
		}
		return vpc.CreateLoadBalancer(opts)
	}

	// A member in another VPC (other-0 is in vpc-other; the load balancer in vpc-1).
	_, resp, err := create("kube-fidelity-other-vpc", []vpcv1.LoadBalancerPoolMemberPrototype{
		{Port: i64(30080), Target: &vpcv1.LoadBalancerPoolMemberTargetPrototypeIP{Address: core.StringPtr("10.9.0.10")}},
	})
	if err == nil || statusOf(resp) != 400 || errCode(resp) != "load_balancer_pool_member_target_not_in_vpc" {
		fail("a member of another VPC: want 400 load_balancer_pool_member_target_not_in_vpc, got %d %q (%v)", statusOf(resp), errCode(resp), err)
	}
	ok("vpc.load_balancers.create with a member of another VPC -> 400 %s", errCode(resp))

	// A failed provisioning: `failed`, `offline`; deleting it is accepted and it goes.
	admin(base, "POST", "operation-failures", map[string]interface{}{"target": "load_balancers/*", "action": "create", "times": 1, "message": "provisioning failed"})
	lb, _, err := create("kube-fidelity-fails", nil)
	must(err, "vpc.load_balancers.create (failing)")
	id := str(lb.ID)
	deadline := time.Now().Add(60 * time.Second)
	for str(lb.ProvisioningStatus) == "create_pending" {
		if time.Now().After(deadline) {
			fail("load balancer %s still create_pending after 60 s", id)
		}
		time.Sleep(200 * time.Millisecond)
		lb, _, err = vpc.GetLoadBalancer(&vpcv1.GetLoadBalancerOptions{ID: &id})
		must(err, "vpc.load_balancers.get (failing)")
	}
	if str(lb.ProvisioningStatus) != "failed" || str(lb.OperatingStatus) != "offline" {
		fail("a failed provisioning: want failed/offline, got %s/%s", str(lb.ProvisioningStatus), str(lb.OperatingStatus))
	}
	ok("vpc.load_balancers.get after a failed provisioning: provisioning_status failed, operating_status offline")
	_, resp, err = vpc.CreateLoadBalancerListener(&vpcv1.CreateLoadBalancerListenerOptions{LoadBalancerID: &id, Port: i64(80), Protocol: core.StringPtr("tcp")})
	if err == nil || statusOf(resp) != 409 {
		fail("a change to a failed load balancer: want 409, got %d (%v)", statusOf(resp), err)
	}
	ok("vpc.load_balancer_listeners.create on a failed load balancer -> 409 %s", errCode(resp))
	resp, err = vpc.DeleteLoadBalancer(&vpcv1.DeleteLoadBalancerOptions{ID: &id})
	if err != nil || statusOf(resp) != 202 {
		fail("deleting a failed load balancer: want 202, got %d (%v)", statusOf(resp), err)
	}
	for {
		_, resp, err = vpc.GetLoadBalancer(&vpcv1.GetLoadBalancerOptions{ID: &id})
		if err != nil && statusOf(resp) == 404 {
			break
		}
		if time.Now().After(deadline) {
			fail("failed load balancer %s not gone after its delete", id)
		}
		time.Sleep(200 * time.Millisecond)
	}
	ok("vpc.load_balancers.delete of a failed load balancer: 202, then 404")
	admin(base, "DELETE", "operation-failures", nil)

	// Quota: load balancers per region (IBM's default 50).
	all, _, err := vpc.ListLoadBalancers(&vpcv1.ListLoadBalancersOptions{})
	must(err, "vpc.load_balancers.list (quota)")
	n := len(all.LoadBalancers)
	for ; n < 50; n++ {
		_, _, err = create(fmt.Sprintf("kube-fidelity-quota-%d", n), nil)
		must(err, "vpc.load_balancers.create up to the quota")
	}
	_, resp, err = create("kube-fidelity-quota-over", nil)
	if err == nil || statusOf(resp) != 400 || errCode(resp) != "over_quota" {
		fail("a load balancer past the quota: want 400 over_quota, got %d %q (%v)", statusOf(resp), errCode(resp), err)
	}
	ok("vpc.load_balancers.create past the region's quota (50) -> 400 %s", errCode(resp))
}

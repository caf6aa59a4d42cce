// Fidelity check of the OpenStack emulator: gophercloud v2 (the SDK upstream's
// openstack-cloud-controller-manager uses) drives Keystone, Nova, Neutron and Octavia through
// every operation our provider calls and fails when a reply does not parse or does not mean
// what OpenStack means. Run by ci/fidelity/run openstack (EMULATOR_URL is the emulator's URL).
package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/gophercloud/gophercloud/v2"
	"github.com/gophercloud/gophercloud/v2/openstack"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/availabilityzones"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/flavors"
	"github.com/gophercloud/gophercloud/v2/openstack/compute/v2/servers"
	"github.com/gophercloud/gophercloud/v2/openstack/identity/v3/tokens"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/apiversions"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/listeners"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/loadbalancers"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/monitors"
	"github.com/gophercloud/gophercloud/v2/openstack/loadbalancer/v2/pools"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/attributestags"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/extraroutes"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/floatingips"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/layer3/routers"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/portsecurity"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/groups"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/security/rules"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/trunk_details"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/extensions/trunks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/networks"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/ports"
	"github.com/gophercloud/gophercloud/v2/openstack/networking/v2/subnets"
	"github.com/gophercloud/gophercloud/v2/pagination"
)

var ctx = context.Background()

func fail(format string, a ...any) {
	fmt.Printf("FAIL "+format+"\n", a...)
	os.Exit(1)
}

func ok(name string) { fmt.Println("ok " + name) }

func must(err error, what string) {
	if err != nil {
		fail("%s: %v", what, err)
	}
}

func is(err error, code int) bool {
	return gophercloud.ResponseCodeIs(err, code)
}

func main() {
	url := os.Getenv("EMULATOR_URL")
	if url == "" {
		fail("EMULATOR_URL is not set")
	}
	auth := gophercloud.AuthOptions{
		IdentityEndpoint: url + "/identity",
		Username:         "admin",
		Password:         "openstack-emulator-password",
		DomainName:       "Default",
		TenantName:       "demo",
		AllowReauth:      true,
	}
	// Keystone: version discovery, password auth, the catalog.
	provider, err := openstack.AuthenticatedClient(ctx, auth)
	must(err, "keystone password auth")
	if provider.Token() == "" {
		fail("no X-Subject-Token")
	}
	ok("keystone.password")
	bad := auth
	bad.Password = "wrong"
	if _, err := openstack.AuthenticatedClient(ctx, bad); !is(err, http.StatusUnauthorized) {
		fail("a wrong password: want 401, got %v", err)
	}
	ok("keystone.password.wrong_is_401")
	_, err = openstack.AuthenticatedClient(ctx, gophercloud.AuthOptions{
		IdentityEndpoint:            url + "/identity/v3",
		ApplicationCredentialID:     "emulator-app-cred",
		ApplicationCredentialSecret: "openstack-emulator-app-cred-secret",
	})
	must(err, "keystone application credential auth")
	ok("keystone.application_credential")
	eo := gophercloud.EndpointOpts{Region: "RegionOne"}
	compute, err := openstack.NewComputeV2(provider, eo)
	must(err, "catalog: compute")
	network, err := openstack.NewNetworkV2(provider, eo)
	must(err, "catalog: network")
	lbc, err := openstack.NewLoadBalancerV2(provider, eo)
	must(err, "catalog: load-balancer")
	if _, err := openstack.NewComputeV2(provider, gophercloud.EndpointOpts{Region: "Nowhere"}); err == nil {
		fail("catalog: an unknown region must not resolve")
	}
	ok("keystone.catalog")

	// Nova.
	compute.Microversion = "2.47"
	pages := 0
	var all []servers.Server
	err = servers.List(compute, servers.ListOpts{Limit: 2}).EachPage(ctx, func(_ context.Context, p pagination.Page) (bool, error) {
		pages++
		s, err := servers.ExtractServers(p)
		all = append(all, s...)
		return true, err
	})
	must(err, "servers list")
	// node-5 is deleted (not listed); node-6 is SUSPENDED (listed).
	if len(all) != 7 || pages != 4 {
		fail("servers list paged by 2: want 7 servers in 4 pages, got %d in %d", len(all), pages)
	}
	ok("nova.servers.list.paging")
	// Nova links a full page to the next (its _get_collection_links: the page holds `limit`,
	// or `[api] max_limit`, servers), even when none follow: the pager reads an empty page
	// and stops there. An unknown marker is Nova's 400 badRequest "marker [<id>] not found".
	pages, all7 := 0, 0
	err = servers.List(compute, servers.ListOpts{Limit: 7}).EachPage(ctx, func(_ context.Context, p pagination.Page) (bool, error) {
		pages++
		s, err := servers.ExtractServers(p)
		all7 += len(s)
		return true, err
	})
	must(err, "servers list paged by 7")
	if all7 != 7 || pages != 1 {
		fail("servers list paged by 7: want 7 servers in 1 page (then an empty one), got %d in %d", all7, pages)
	}
	ok("nova.servers.list.full_page_links_to_an_empty_one")
	_, err = servers.List(compute, servers.ListOpts{Marker: "no-such-server"}).AllPages(ctx)
	if !is(err, 400) {
		fail("servers list with an unknown marker: want 400, got %v", err)
	}
	var markerErr struct {
		BadRequest struct {
			Code    int    `json:"code"`
			Message string `json:"message"`
		} `json:"badRequest"`
	}
	_ = json.Unmarshal([]byte(errBody(err)), &markerErr)
	if markerErr.BadRequest.Code != 400 || markerErr.BadRequest.Message != "marker [no-such-server] not found" {
		fail("servers list with an unknown marker: want Nova's badRequest \"marker [no-such-server] not found\", got %s", errBody(err))
	}
	ok("nova.servers.list.unknown_marker_400")
	p, err := servers.List(compute, servers.ListOpts{Name: "^node\\-1$"}).AllPages(ctx)
	must(err, "servers list by name")
	byName, err := servers.ExtractServers(p)
	must(err, "servers extract")
	if len(byName) != 1 || byName[0].Name != "node-1" {
		fail("name regex ^node\\-1$: want only node-1, got %d", len(byName))
	}
	s1 := byName[0]
	if s1.Status != "ACTIVE" || s1.AvailabilityZone != "nova" || s1.Flavor["original_name"] != "m1.small" {
		fail("node-1: status %q az %q flavor %v", s1.Status, s1.AvailabilityZone, s1.Flavor)
	}
	addrs, _ := s1.Addresses["private"].([]any)
	if len(addrs) != 2 {
		fail("node-1 addresses: want a fixed and a floating address on private, got %v", s1.Addresses)
	}
	types := map[string]string{}
	for _, a := range addrs {
		m := a.(map[string]any)
		types[m["OS-EXT-IPS:type"].(string)] = m["addr"].(string)
	}
	if types["fixed"] != "10.0.0.11" || types["floating"] != "172.24.4.101" {
		fail("node-1 addresses: %v", types)
	}
	ok("nova.servers.list.name_regex_addresses_flavor_az")
	for _, s := range all {
		if s.Name == "node-4" && s.Status != "SHUTOFF" {
			fail("node-4 is stopped: want SHUTOFF, got %s", s.Status)
		}
		if s.Name == "node-2" && (s.Flavor["original_name"] != "m1.large" || s.AvailabilityZone != "az-2") {
			fail("node-2: flavor %v az %s", s.Flavor, s.AvailabilityZone)
		}
	}
	ok("nova.servers.status_shutoff")
	got, err := servers.Get(ctx, compute, s1.ID).Extract()
	must(err, "server get")
	if got.Name != "node-1" || got.TenantID == "" {
		fail("server get: %+v", got)
	}
	if _, err := servers.Get(ctx, compute, "00000000-0000-4000-8000-000000000000").Extract(); !is(err, 404) {
		fail("server get unknown: want 404, got %v", err)
	}
	ok("nova.servers.get")
	compute.Microversion = ""
	old, err := servers.Get(ctx, compute, s1.ID).Extract()
	must(err, "server get 2.1")
	fid, _ := old.Flavor["id"].(string)
	fl, err := flavors.Get(ctx, compute, fid).Extract()
	must(err, "flavor get")
	if fl.Name != "m1.small" {
		fail("flavor of node-1 at 2.1: %q", fl.Name)
	}
	ok("nova.flavors.get")
	ap, err := availabilityzones.List(compute).AllPages(ctx)
	must(err, "availability zones")
	azs, err := availabilityzones.ExtractAvailabilityZones(ap)
	must(err, "availability zones extract")
	if len(azs) != 2 {
		fail("availability zones: %v", azs)
	}
	ok("nova.availability_zones.list")

	// Neutron.
	ep, err := extensions.List(network).AllPages(ctx)
	must(err, "extensions")
	exts, err := extensions.ExtractExtensions(ep)
	must(err, "extensions extract")
	found := map[string]bool{}
	for _, e := range exts {
		found[e.Alias] = true
	}
	if !found["extraroute-atomic"] || !found["security-group"] || !found["allowed-address-pairs"] {
		fail("extensions: %v", found)
	}
	ok("neutron.extensions.list")
	np, err := networks.List(network, networks.ListOpts{Name: "public"}).AllPages(ctx)
	must(err, "networks")
	nets, err := networks.ExtractNetworks(np)
	must(err, "networks extract")
	if len(nets) != 1 {
		fail("networks named public: %d", len(nets))
	}
	public := nets[0]
	sp, err := subnets.List(network, subnets.ListOpts{Name: "private-subnet"}).AllPages(ctx)
	must(err, "subnets")
	subs, err := subnets.ExtractSubnets(sp)
	must(err, "subnets extract")
	if len(subs) != 1 || subs[0].CIDR != "10.0.0.0/24" {
		fail("subnets: %+v", subs)
	}
	subnet := subs[0]
	ok("neutron.networks_subnets.list")
	pp, err := ports.List(network, ports.ListOpts{DeviceID: s1.ID}).AllPages(ctx)
	must(err, "ports by device")
	ps, err := ports.ExtractPorts(pp)
	must(err, "ports extract")
	if len(ps) != 1 || ps[0].FixedIPs[0].IPAddress != "10.0.0.11" || ps[0].NetworkID != subnet.NetworkID {
		fail("ports of node-1: %+v", ps)
	}
	port := ps[0]
	ok("neutron.ports.list.device_id")

	// Security groups and rules.
	sg, err := groups.Create(ctx, network, groups.CreateOpts{Name: "lb-sg-fidelity", Description: "fidelity"}).Extract()
	must(err, "security group create")
	if len(sg.Rules) != 2 {
		fail("a new security group has the two default egress rules, got %d", len(sg.Rules))
	}
	ropts := rules.CreateOpts{Direction: rules.DirIngress, EtherType: rules.EtherType4, SecGroupID: sg.ID,
		Protocol: rules.ProtocolTCP, PortRangeMin: 30080, PortRangeMax: 30080, RemoteIPPrefix: "0.0.0.0/0"}
	rule, err := rules.Create(ctx, network, ropts).Extract()
	must(err, "rule create")
	if _, err := rules.Create(ctx, network, ropts).Extract(); !is(err, 409) {
		fail("a duplicate rule: want 409, got %v", err)
	}
	gp, err := groups.List(network, groups.ListOpts{Name: "lb-sg-fidelity"}).AllPages(ctx)
	must(err, "groups list")
	gs, _ := groups.ExtractGroups(gp)
	if len(gs) != 1 || len(gs[0].Rules) != 3 {
		fail("groups list: %+v", gs)
	}
	ok("neutron.security_groups_rules")
	// Ports: security groups and allowed address pairs.
	sgs := append(port.SecurityGroups, sg.ID)
	pairs := []ports.AddressPair{{IPAddress: "10.244.1.0/24"}}
	up, err := ports.Update(ctx, network, port.ID, ports.UpdateOpts{SecurityGroups: &sgs, AllowedAddressPairs: &pairs}).Extract()
	must(err, "port update")
	if len(up.SecurityGroups) != 2 || len(up.AllowedAddressPairs) != 1 || up.AllowedAddressPairs[0].IPAddress != "10.244.1.0/24" {
		fail("port update: %+v", up)
	}
	if err := groups.Delete(ctx, network, sg.ID).ExtractErr(); !is(err, 409) {
		fail("deleting a security group in use: want 409, got %v", err)
	}
	ok("neutron.ports.update")
	orig := port.SecurityGroups
	noPairs := []ports.AddressPair{}
	_, err = ports.Update(ctx, network, port.ID, ports.UpdateOpts{SecurityGroups: &orig, AllowedAddressPairs: &noPairs}).Extract()
	must(err, "port restore")
	must(rules.Delete(ctx, network, rule.ID).ExtractErr(), "rule delete")
	must(groups.Delete(ctx, network, sg.ID).ExtractErr(), "group delete")
	if err := groups.Delete(ctx, network, sg.ID).ExtractErr(); !is(err, 404) {
		fail("deleting a deleted group: want 404, got %v", err)
	}
	ok("neutron.security_groups.delete")

	// Routers: extra routes.
	rp, err := routers.List(network, routers.ListOpts{Name: "router1"}).AllPages(ctx)
	must(err, "routers list")
	rs, _ := routers.ExtractRouters(rp)
	if len(rs) != 1 || rs[0].GatewayInfo.NetworkID != public.ID {
		fail("routers: %+v", rs)
	}
	router := rs[0]
	add := []routers.Route{{DestinationCIDR: "10.244.1.0/24", NextHop: "10.0.0.11"}, {DestinationCIDR: "10.244.2.0/24", NextHop: "10.0.0.12"}}
	r2, err := extraroutes.Add(ctx, network, router.ID, extraroutes.Opts{Routes: &add}).Extract()
	must(err, "add_extraroutes")
	if len(r2.Routes) != 2 {
		fail("after add_extraroutes: %+v", r2.Routes)
	}
	rm := add[:1]
	r3, err := extraroutes.Remove(ctx, network, router.ID, extraroutes.Opts{Routes: &rm}).Extract()
	must(err, "remove_extraroutes")
	if len(r3.Routes) != 1 || r3.Routes[0].DestinationCIDR != "10.244.2.0/24" {
		fail("after remove_extraroutes: %+v", r3.Routes)
	}
	badRoute := []routers.Route{{DestinationCIDR: "10.244.3.0/24", NextHop: "192.168.99.1"}}
	if _, err := extraroutes.Add(ctx, network, router.ID, extraroutes.Opts{Routes: &badRoute}).Extract(); !is(err, 400) {
		fail("a next hop off every subnet: want 400, got %v", err)
	}
	none := []routers.Route{}
	r4, err := routers.Update(ctx, network, router.ID, routers.UpdateOpts{Routes: &none}).Extract()
	must(err, "router update routes")
	if len(r4.Routes) != 0 {
		fail("routes after full update: %+v", r4.Routes)
	}
	ok("neutron.routers.extraroutes")

	// Octavia.
	lb, err := loadbalancers.Create(ctx, lbc, loadbalancers.CreateOpts{Name: "kube_service_kubernetes_default_web",
		VipSubnetID: subnet.ID, Tags: []string{"kube_service_kubernetes_default_web"}}).Extract()
	must(err, "lb create")
	if lb.ProvisioningStatus != "PENDING_CREATE" || lb.VipAddress == "" || lb.VipPortID == "" {
		fail("a new lb: %+v", lb)
	}
	if _, err := listeners.Create(ctx, lbc, listeners.CreateOpts{LoadbalancerID: lb.ID, Protocol: listeners.ProtocolTCP, ProtocolPort: 80}).Extract(); !is(err, 409) {
		fail("a listener on a PENDING_CREATE lb: want 409, got %v", err)
	}
	ok("octavia.loadbalancers.create_pending_immutable")
	wait := func() {
		deadline := time.Now().Add(60 * time.Second)
		for time.Now().Before(deadline) {
			l, err := loadbalancers.Get(ctx, lbc, lb.ID).Extract()
			must(err, "lb get")
			if l.ProvisioningStatus == "ACTIVE" {
				return
			}
			time.Sleep(300 * time.Millisecond)
		}
		fail("lb %s never became ACTIVE", lb.ID)
	}
	wait()
	ok("octavia.loadbalancers.active")
	fip, err := floatingips.Create(ctx, network, floatingips.CreateOpts{FloatingNetworkID: public.ID, PortID: lb.VipPortID,
		Description: "kube_service_kubernetes_default_web"}).Extract()
	must(err, "floating ip create")
	if fip.FixedIP != lb.VipAddress || fip.FloatingIP == "" || fip.PortID != lb.VipPortID {
		fail("floating ip: %+v", fip)
	}
	fp, err := floatingips.List(network, floatingips.ListOpts{PortID: lb.VipPortID}).AllPages(ctx)
	must(err, "floating ips list")
	fs, _ := floatingips.ExtractFloatingIPs(fp)
	if len(fs) != 1 || fs[0].ID != fip.ID {
		fail("floating ips of the vip port: %+v", fs)
	}
	must(attributestags.ReplaceAll(ctx, network, "floatingips", fip.ID, attributestags.ReplaceAllOpts{Tags: []string{"cluster_kubernetes"}}).Err, "tags")
	ok("neutron.floatingips.create_list_tags")
	ln, err := listeners.Create(ctx, lbc, listeners.CreateOpts{LoadbalancerID: lb.ID, Protocol: listeners.ProtocolTCP, ProtocolPort: 80,
		Name: "listener_0_kube_service_kubernetes_default_web"}).Extract()
	must(err, "listener create")
	wait()
	pool, err := pools.Create(ctx, lbc, pools.CreateOpts{ListenerID: ln.ID, Protocol: pools.ProtocolTCP, LBMethod: pools.LBMethodRoundRobin,
		Name: "pool_0_kube_service_kubernetes_default_web"}).Extract()
	must(err, "pool create")
	wait()
	members := []pools.BatchUpdateMemberOpts{{Address: "10.0.0.10", ProtocolPort: 30080}, {Address: "10.0.0.11", ProtocolPort: 30080}}
	must(pools.BatchUpdateMembers(ctx, lbc, pool.ID, members).ExtractErr(), "batch update members")
	wait()
	mon, err := monitors.Create(ctx, lbc, monitors.CreateOpts{PoolID: pool.ID, Type: monitors.TypeTCP, Delay: 5, Timeout: 3, MaxRetries: 1,
		Name: "monitor_0_kube_service_kubernetes_default_web"}).Extract()
	must(err, "monitor create")
	wait()
	pl, err := pools.Get(ctx, lbc, pool.ID).Extract()
	must(err, "pool get")
	if len(pl.Members) != 2 || pl.MonitorID != mon.ID || len(pl.Listeners) != 1 || pl.Listeners[0].ID != ln.ID {
		fail("pool: members %d monitor %q listeners %+v", len(pl.Members), pl.MonitorID, pl.Listeners)
	}
	lg, err := listeners.Get(ctx, lbc, ln.ID).Extract()
	must(err, "listener get")
	if lg.DefaultPoolID != pool.ID {
		fail("listener default pool: %q", lg.DefaultPoolID)
	}
	ok("octavia.listener_pool_members_monitor")
	members = []pools.BatchUpdateMemberOpts{{Address: "10.0.0.11", ProtocolPort: 30080}, {Address: "10.0.0.12", ProtocolPort: 30080}}
	must(pools.BatchUpdateMembers(ctx, lbc, pool.ID, members).ExtractErr(), "batch update members 2")
	l2, err := loadbalancers.Get(ctx, lbc, lb.ID).Extract()
	must(err, "lb get")
	if l2.ProvisioningStatus != "PENDING_UPDATE" {
		fail("after a member update the lb is PENDING_UPDATE, got %s", l2.ProvisioningStatus)
	}
	wait()
	mp, err := pools.ListMembers(lbc, pool.ID, pools.ListMembersOpts{}).AllPages(ctx)
	must(err, "members list")
	ms, _ := pools.ExtractMembers(mp)
	addrsSeen := map[string]bool{}
	for _, m := range ms {
		addrsSeen[m.Address] = true
	}
	if len(ms) != 2 || !addrsSeen["10.0.0.11"] || !addrsSeen["10.0.0.12"] {
		fail("members after batch update: %+v", ms)
	}
	ok("octavia.members.batch_update")
	cl := 100
	_, err = listeners.Update(ctx, lbc, ln.ID, listeners.UpdateOpts{ConnLimit: &cl}).Extract()
	must(err, "listener update")
	wait()
	lp, err := listeners.List(lbc, listeners.ListOpts{LoadbalancerID: lb.ID}).AllPages(ctx)
	must(err, "listeners list")
	ls, _ := listeners.ExtractListeners(lp)
	if len(ls) != 1 || ls[0].ConnLimit != 100 {
		fail("listeners: %+v", ls)
	}
	ok("octavia.listeners.update_list")
	// A second port's listener, pool and monitor: updated, then deleted child by child (a
	// port removed from a Service), monitor first.
	ln2, err := listeners.Create(ctx, lbc, listeners.CreateOpts{LoadbalancerID: lb.ID, Protocol: listeners.ProtocolTCP, ProtocolPort: 443,
		Name: "listener_1_kube_service_kubernetes_default_web"}).Extract()
	must(err, "listener 2 create")
	wait()
	pool2, err := pools.Create(ctx, lbc, pools.CreateOpts{ListenerID: ln2.ID, Protocol: pools.ProtocolTCP, LBMethod: pools.LBMethodRoundRobin,
		Name: "pool_1_kube_service_kubernetes_default_web"}).Extract()
	must(err, "pool 2 create")
	wait()
	mon2, err := monitors.Create(ctx, lbc, monitors.CreateOpts{PoolID: pool2.ID, Type: monitors.TypeTCP, Delay: 5, Timeout: 3, MaxRetries: 1,
		Name: "monitor_1_kube_service_kubernetes_default_web"}).Extract()
	must(err, "monitor 2 create")
	wait()
	p2, err := pools.Update(ctx, lbc, pool2.ID, pools.UpdateOpts{LBMethod: pools.LBMethodLeastConnections}).Extract()
	must(err, "pool update")
	if p2.LBMethod != string(pools.LBMethodLeastConnections) {
		fail("pool update: lb_algorithm %q", p2.LBMethod)
	}
	wait()
	m2, err := monitors.Update(ctx, lbc, mon2.ID, monitors.UpdateOpts{Delay: 10, Timeout: 4}).Extract()
	must(err, "monitor update")
	if m2.Delay != 10 || m2.Timeout != 4 {
		fail("monitor update: %+v", m2)
	}
	wait()
	must(monitors.Delete(ctx, lbc, mon2.ID).ExtractErr(), "monitor delete")
	wait()
	must(pools.Delete(ctx, lbc, pool2.ID).ExtractErr(), "pool delete")
	wait()
	must(listeners.Delete(ctx, lbc, ln2.ID).ExtractErr(), "listener delete")
	wait()
	if _, err := listeners.Get(ctx, lbc, ln2.ID).Extract(); !is(err, 404) {
		fail("a deleted listener: want 404, got %v", err)
	}
	ok("octavia.pool_monitor_update_and_child_deletes")
	// A floating IP disassociated (keep-floatingip) and associated again.
	// gophercloud sends an empty port ID as `"port_id": null`, as our provider does.
	noPort := ""
	fu, err := floatingips.Update(ctx, network, fip.ID, floatingips.UpdateOpts{PortID: &noPort}).Extract()
	must(err, "floating ip disassociate")
	if fu.PortID != "" || fu.FixedIP != "" {
		fail("a disassociated floating ip: %+v", fu)
	}
	fu, err = floatingips.Update(ctx, network, fip.ID, floatingips.UpdateOpts{PortID: &lb.VipPortID}).Extract()
	must(err, "floating ip associate")
	if fu.PortID != lb.VipPortID || fu.FixedIP != lb.VipAddress {
		fail("a re-associated floating ip: %+v", fu)
	}
	ok("neutron.floatingips.update")
	lbp, err := loadbalancers.List(lbc, loadbalancers.ListOpts{Name: "kube_service_kubernetes_default_web"}).AllPages(ctx)
	must(err, "lb list")
	lbs, _ := loadbalancers.ExtractLoadBalancers(lbp)
	if len(lbs) != 1 || len(lbs[0].Listeners) != 1 || len(lbs[0].Pools) != 1 {
		fail("lb list by name: %+v", lbs)
	}
	ok("octavia.loadbalancers.list")
	if err := loadbalancers.Delete(ctx, lbc, lb.ID, nil).ExtractErr(); !is(err, 400) {
		fail("deleting an lb with children without cascade: want 400, got %v", err)
	}
	must(floatingips.Delete(ctx, network, fip.ID).ExtractErr(), "floating ip delete")
	must(loadbalancers.Delete(ctx, lbc, lb.ID, loadbalancers.DeleteOpts{Cascade: true}).ExtractErr(), "lb cascade delete")
	deadline := time.Now().Add(60 * time.Second)
	for {
		l, err := loadbalancers.Get(ctx, lbc, lb.ID).Extract()
		if is(err, 404) {
			break
		}
		must(err, "lb get while deleting")
		if l.ProvisioningStatus != "PENDING_DELETE" {
			fail("a deleting lb: %s", l.ProvisioningStatus)
		}
		if time.Now().After(deadline) {
			fail("lb never went away")
		}
		time.Sleep(300 * time.Millisecond)
	}
	if _, err := pools.Get(ctx, lbc, pool.ID).Extract(); !is(err, 404) {
		fail("a cascade-deleted pool: want 404, got %v", err)
	}
	ok("octavia.loadbalancers.cascade_delete")

	// Octavia version discovery: every v2 minor version up to the current one, as a current
	// Octavia lists them (upstream's CCM gates tags on >= 2.5, allowed_cidrs on >= 2.12 and
	// HTTP monitors on UDP pools on >= 2.16 by the highest one listed).
	vp, err := apiversions.List(lbc).AllPages(ctx)
	must(err, "octavia versions")
	vs, err := apiversions.ExtractAPIVersions(vp)
	must(err, "octavia versions extract")
	current, listed := "", map[string]string{}
	for _, v := range vs {
		listed[v.ID] = v.Status
		if v.Status == "CURRENT" {
			current = v.ID
		}
	}
	if current != "v2.27" || listed["v2.0"] != "SUPPORTED" || listed["v2.5"] != "SUPPORTED" ||
		listed["v2.12"] != "SUPPORTED" || listed["v2.16"] != "SUPPORTED" || len(vs) != 28 {
		fail("octavia versions: want v2.0..v2.26 SUPPORTED and v2.27 CURRENT, got %+v", vs)
	}
	ok("octavia.versions")

	// Octavia's fully populated create: one POST carries listeners with their default pools,
	// members and health monitors; every child is created (ids, PENDING_CREATE with the load
	// balancer, then ACTIVE) and readable on its own.
	tcpMembers := []pools.CreateMemberOpts{{Address: "10.0.0.10", ProtocolPort: 30080}, {Address: "10.0.0.11", ProtocolPort: 30080}}
	fullOpts := loadbalancers.CreateOpts{Name: "kube_service_kubernetes_default_full", VipSubnetID: subnet.ID,
		Tags: []string{"kube_service_kubernetes_default_full"},
		Listeners: []listeners.CreateOpts{
			{Name: "listener_0_full", Protocol: listeners.ProtocolTCP, ProtocolPort: 80,
				DefaultPool: &pools.CreateOpts{Name: "pool_0_full", Protocol: pools.ProtocolTCP, LBMethod: pools.LBMethodRoundRobin,
					Members: tcpMembers,
					Monitor: monitors.CreateOpts{Name: "monitor_0_full", Type: "TCP", Delay: 5, Timeout: 3, MaxRetries: 1}}},
			{Name: "listener_1_full", Protocol: listeners.ProtocolUDP, ProtocolPort: 53,
				DefaultPool: &pools.CreateOpts{Name: "pool_1_full", Protocol: pools.ProtocolUDP, LBMethod: pools.LBMethodSourceIp,
					Members: []pools.CreateMemberOpts{{Address: "10.0.0.10", ProtocolPort: 30053}}}},
		}}
	full, err := loadbalancers.Create(ctx, lbc, fullOpts).Extract()
	must(err, "fully populated lb create")
	if full.ProvisioningStatus != "PENDING_CREATE" || len(full.Listeners) != 2 || len(full.Pools) != 2 {
		fail("a fully populated create answers the whole tree: %d listeners, %d pools (%s)", len(full.Listeners), len(full.Pools), full.ProvisioningStatus)
	}
	for _, p := range full.Pools {
		if p.ID == "" || p.ProvisioningStatus != "PENDING_CREATE" || len(p.Members) == 0 || p.Members[0].ID == "" {
			fail("a fully populated create's pool: %+v", p)
		}
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		l, err := loadbalancers.Get(ctx, lbc, full.ID).Extract()
		must(err, "fully populated lb get")
		if l.ProvisioningStatus == "ACTIVE" {
			break
		}
		if time.Now().After(deadline) {
			fail("the fully populated lb never became ACTIVE")
		}
	}
	fullLp, err := listeners.List(lbc, listeners.ListOpts{LoadbalancerID: full.ID}).AllPages(ctx)
	must(err, "fully populated listeners list")
	fls, _ := listeners.ExtractListeners(fullLp)
	if len(fls) != 2 {
		fail("the fully populated lb's listeners: %+v", fls)
	}
	for _, l := range fls {
		if l.DefaultPoolID == "" || l.ProvisioningStatus != "ACTIVE" {
			fail("a fully populated listener: %+v", l)
		}
		p, err := pools.Get(ctx, lbc, l.DefaultPoolID).Extract()
		must(err, "a fully populated listener's default pool")
		mp, err := pools.ListMembers(lbc, p.ID, pools.ListMembersOpts{}).AllPages(ctx)
		must(err, "a fully populated pool's members")
		ms, _ := pools.ExtractMembers(mp)
		switch l.ProtocolPort {
		case 80:
			if len(ms) != 2 || p.MonitorID == "" || p.LBMethod != "ROUND_ROBIN" {
				fail("the TCP listener's pool: %+v, members %+v", p, ms)
			}
			m, err := monitors.Get(ctx, lbc, p.MonitorID).Extract()
			must(err, "a fully populated pool's monitor")
			if m.Type != "TCP" || m.MaxRetries != 1 || len(m.Pools) != 1 || m.Pools[0].ID != p.ID {
				fail("the TCP pool's monitor: %+v", m)
			}
		case 53:
			if len(ms) != 1 || ms[0].ProtocolPort != 30053 || p.MonitorID != "" || p.Protocol != "UDP" {
				fail("the UDP listener's pool: %+v, members %+v", p, ms)
			}
		default:
			fail("an unexpected listener: %+v", l)
		}
	}
	ok("octavia.loadbalancers.create_fully_populated")
	// The same validation as the separate creates, and all or nothing: two listeners on one
	// port is the listener create's 409, and no part of the tree is left behind.
	dup := fullOpts
	dup.Name = "kube_service_kubernetes_default_dup"
	dup.Listeners = []listeners.CreateOpts{fullOpts.Listeners[0], fullOpts.Listeners[0]}
	if _, err := loadbalancers.Create(ctx, lbc, dup).Extract(); !is(err, 409) {
		fail("a fully populated create with two listeners on port 80: want 409, got %v", err)
	}
	dp, err := loadbalancers.List(lbc, loadbalancers.ListOpts{Name: dup.Name}).AllPages(ctx)
	must(err, "lb list after a refused tree")
	if dls, _ := loadbalancers.ExtractLoadBalancers(dp); len(dls) != 0 {
		fail("a refused fully populated create left a load balancer: %+v", dls)
	}
	ok("octavia.loadbalancers.create_fully_populated_refused_whole")
	must(loadbalancers.Delete(ctx, lbc, full.ID, loadbalancers.DeleteOpts{Cascade: true}).ExtractErr(), "fully populated lb cascade delete")

	barbican(url, provider, lbc, subnet)
	behaviour(url, provider, compute, network, lbc, subnet, public, s1, all)

	// Token expiry: the emulator issues 6 s tokens (emulator-args); a call after expiry is a
	// 401 that gophercloud answers by re-authenticating.
	before := provider.Token()
	time.Sleep(6500 * time.Millisecond)
	_, err = servers.Get(ctx, compute, s1.ID).Extract()
	must(err, "a call after the token expired")
	if provider.Token() == before {
		fail("the token was not renewed")
	}
	ok("keystone.token_expiry_reauth")
	var e gophercloud.ErrUnexpectedResponseCode
	_, err = servers.Get(ctx, compute, "nope").Extract()
	if !errors.As(err, &e) || e.Actual != 404 || len(e.Body) == 0 {
		fail("a Nova 404 carries its error body: %v", err)
	}
	ok("nova.error_body")
}

// A token Keystone issues for these options (tokens.Create), failing on any error.
func token(url string, opts tokens.AuthOptions) (string, error) {
	p, err := openstack.NewClient(url + "/identity")
	must(err, "identity client")
	id := &gophercloud.ServiceClient{ProviderClient: p, Endpoint: url + "/identity/v3/"}
	r := tokens.Create(ctx, id, &opts)
	if r.Err != nil {
		return "", r.Err
	}
	return r.ExtractTokenID()
}

// Service clients that send `tok` (no catalog needed).
func clients(url, tok string) (compute, network, lbc *gophercloud.ServiceClient) {
	p, err := openstack.NewClient(url + "/identity")
	must(err, "client")
	p.SetToken(tok)
	compute = &gophercloud.ServiceClient{ProviderClient: p, Endpoint: url + "/compute/v2.1/"}
	network = &gophercloud.ServiceClient{ProviderClient: p, Endpoint: url + "/network/", ResourceBase: url + "/network/v2.0/"}
	lbc = &gophercloud.ServiceClient{ProviderClient: p, Endpoint: url + "/load-balancer/", ResourceBase: url + "/load-balancer/v2/"}
	return
}

func neutronType(err error) string {
	var e gophercloud.ErrUnexpectedResponseCode
	if !errors.As(err, &e) {
		return ""
	}
	var b struct {
		NeutronError struct{ Type string } `json:"NeutronError"`
	}
	_ = json.Unmarshal(e.Body, &b)
	return b.NeutronError.Type
}

func errBody(err error) string {
	var e gophercloud.ErrUnexpectedResponseCode
	if errors.As(err, &e) {
		return string(e.Body)
	}
	return ""
}

// The behavioural rules (issue 31): each check makes the call a client of the real cloud
// would make and wants the cloud's status and error.
func behaviour(url string, provider *gophercloud.ProviderClient, compute, network, lbc *gophercloud.ServiceClient,
	subnet subnets.Subnet, public networks.Network, s1 servers.Server, all []servers.Server) {
	member := tokens.AuthOptions{Username: "member", Password: "openstack-emulator-member-password", DomainName: "Default"}

	// Keystone: a user is looked up in the domain the request names.
	wrongDomain := member
	wrongDomain.DomainName = "Other"
	if _, err := token(url, wrongDomain); !is(err, 401) {
		fail("password auth with a user domain not the user's: want 401, got %v", err)
	}
	ok("keystone.password.user_domain_mismatch_is_401")
	// A project the request names must be one the user has a role on.
	noRole := member
	noRole.Scope = tokens.Scope{ProjectName: "nowhere", DomainName: "Default"}
	if _, err := token(url, noRole); !is(err, 401) {
		fail("a scope naming an unknown project: want 401, got %v", err)
	}
	ok("keystone.scope.unknown_project_is_401")
	// An unscoped token (no scope, no default project) is refused by the services (403).
	unscoped, err := token(url, member)
	must(err, "unscoped token")
	uc, un, ul := clients(url, unscoped)
	if _, err := servers.Get(ctx, uc, s1.ID).Extract(); !is(err, 403) {
		fail("Nova with an unscoped token: want 403, got %v", err)
	}
	if _, err := networks.Get(ctx, un, public.ID).Extract(); !is(err, 403) {
		fail("Neutron with an unscoped token: want 403, got %v", err)
	}
	if _, err := loadbalancers.List(ul, nil).AllPages(ctx); !is(err, 403) {
		fail("Octavia with an unscoped token: want 403, got %v", err)
	}
	ok("keystone.unscoped_token_is_403_on_services")

	// A domain scope (upstream's client asks for one with domain-id/-name and no project):
	// the token has the domain, roles and a catalog but no project; the services refuse it
	// (403); a user without a role on the domain is refused (401).
	dip, err := openstack.NewClient(url + "/identity")
	must(err, "identity client")
	didc := &gophercloud.ServiceClient{ProviderClient: dip, Endpoint: url + "/identity/v3/"}
	domOpts := tokens.AuthOptions{Username: "admin", Password: "openstack-emulator-password",
		DomainName: "Default", Scope: tokens.Scope{DomainName: "Default"}}
	dr := tokens.Create(ctx, didc, &domOpts)
	must(dr.Err, "a domain-scoped token")
	if d, err := dr.ExtractDomain(); err != nil || d == nil || d.ID != "default" || d.Name != "Default" {
		fail("a domain-scoped token's domain: %+v %v", d, err)
	}
	if p, _ := dr.ExtractProject(); p != nil {
		fail("a domain-scoped token has a project: %+v", p)
	}
	if c, err := dr.ExtractServiceCatalog(); err != nil || len(c.Entries) == 0 {
		fail("a domain-scoped token has no catalog: %v", err)
	}
	domTok, err := dr.ExtractTokenID()
	must(err, "the domain-scoped token")
	dc, dn, dl := clients(url, domTok)
	if _, err := servers.Get(ctx, dc, s1.ID).Extract(); !is(err, 403) {
		fail("Nova with a domain-scoped token: want 403, got %v", err)
	}
	if _, err := networks.Get(ctx, dn, public.ID).Extract(); !is(err, 403) {
		fail("Neutron with a domain-scoped token: want 403, got %v", err)
	}
	if _, err := loadbalancers.List(dl, nil).AllPages(ctx); !is(err, 403) {
		fail("Octavia with a domain-scoped token: want 403, got %v", err)
	}
	noDomRole := member
	noDomRole.Scope = tokens.Scope{DomainName: "Default"}
	if _, err := token(url, noDomRole); !is(err, 401) {
		fail("a domain scope for a user without a role there: want 401, got %v", err)
	}
	ok("keystone.domain_scoped_token")

	// Trunks: POST /v2.0/trunks makes the sub-ports trunk:subport ports of the trunk, the
	// parent port lists them in trunk_details (ports listing, as upstream's node addresses
	// read them); a parent port cannot be deleted while its trunk exists (409).
	mkPort := func(name, ip string) ports.Port {
		p, err := ports.Create(ctx, network, ports.CreateOpts{NetworkID: subnet.NetworkID, Name: name,
			FixedIPs: []ports.IP{{SubnetID: subnet.ID, IPAddress: ip}}}).Extract()
		must(err, "port "+name)
		return *p
	}
	parent, child := mkPort("trunk-parent", "10.0.0.240"), mkPort("trunk-child", "10.0.0.241")
	trk, err := trunks.Create(ctx, network, trunks.CreateOpts{PortID: parent.ID, Name: "fidelity-trunk",
		Subports: []trunks.Subport{{PortID: child.ID, SegmentationType: "vlan", SegmentationID: 100}}}).Extract()
	must(err, "trunk create")
	if trk.PortID != parent.ID || len(trk.Subports) != 1 || trk.Subports[0].SegmentationID != 100 {
		fail("the trunk: %+v", trk)
	}
	tp, err := trunks.List(network, trunks.ListOpts{PortID: parent.ID}).AllPages(ctx)
	must(err, "trunk list")
	if l, err := trunks.ExtractTrunks(tp); err != nil || len(l) != 1 || l[0].ID != trk.ID {
		fail("trunk list by port: %+v %v", l, err)
	}
	var withDetails []struct {
		ports.Port
		trunk_details.TrunkDetailsExt
	}
	pp2, err := ports.List(network, ports.ListOpts{ID: parent.ID}).AllPages(ctx)
	must(err, "the parent port")
	must(ports.ExtractPortsInto(pp2, &withDetails), "trunk_details")
	if len(withDetails) != 1 || withDetails[0].TrunkDetails.TrunkID != trk.ID ||
		len(withDetails[0].TrunkDetails.SubPorts) != 1 || withDetails[0].TrunkDetails.SubPorts[0].PortID != child.ID {
		fail("the parent port's trunk_details: %+v", withDetails)
	}
	cp, err := ports.Get(ctx, network, child.ID).Extract()
	must(err, "the sub-port")
	if cp.DeviceOwner != "trunk:subport" || cp.DeviceID != trk.ID {
		fail("the sub-port's device: %q %q", cp.DeviceOwner, cp.DeviceID)
	}
	if err := ports.Delete(ctx, network, parent.ID).ExtractErr(); !is(err, 409) {
		fail("deleting a trunk's parent port: want 409, got %v", err)
	}
	must(trunks.Delete(ctx, network, trk.ID).ExtractErr(), "trunk delete")
	must(ports.Delete(ctx, network, child.ID).ExtractErr(), "sub-port delete")
	must(ports.Delete(ctx, network, parent.ID).ExtractErr(), "parent port delete")
	ok("neutron.trunks.trunk_details")

	// A token scoped to project alt sees nothing of project demo: Nova and Neutron answer 404
	// (they hide another project's objects), Octavia 403 (policy).
	alt := member
	alt.Scope = tokens.Scope{ProjectName: "alt", DomainName: "Default"}
	altTok, err := token(url, alt)
	must(err, "a token scoped to alt")
	ac, an, al := clients(url, altTok)
	if _, err := servers.Get(ctx, ac, s1.ID).Extract(); !is(err, 404) {
		fail("project alt reading demo's server: want 404, got %v", err)
	}
	pp, err := ports.List(network, ports.ListOpts{DeviceID: s1.ID}).AllPages(ctx)
	must(err, "ports of node-1")
	p1, _ := ports.ExtractPorts(pp)
	if _, err := ports.Get(ctx, an, p1[0].ID).Extract(); !is(err, 404) || neutronType(err) != "PortNotFound" {
		fail("project alt reading demo's port: want 404 PortNotFound, got %v", err)
	}
	demoLB, err := loadbalancers.Create(ctx, lbc, loadbalancers.CreateOpts{Name: "scope-check", VipSubnetID: subnet.ID}).Extract()
	must(err, "lb for the scope check")
	if _, err := loadbalancers.Get(ctx, al, demoLB.ID).Extract(); !is(err, 403) {
		fail("project alt reading demo's load balancer: want 403, got %v", err)
	}
	lp, err := loadbalancers.List(al, nil).AllPages(ctx)
	must(err, "alt's lb list")
	if l, _ := loadbalancers.ExtractLoadBalancers(lp); len(l) != 0 {
		fail("project alt lists demo's load balancers: %+v", l)
	}
	sp, err := servers.List(ac, nil).AllPages(ctx)
	must(err, "alt's server list")
	if l, _ := servers.ExtractServers(sp); len(l) != 0 {
		fail("project alt lists demo's servers: %d", len(l))
	}
	ok("keystone.scope.other_project_404_nova_neutron_403_octavia")

	// A trust-scoped token: the trustee gets the trust's project and roles, and the token
	// says which trust; anyone else is refused (403), an unknown trust is a 404.
	trust := member
	trust.Scope = tokens.Scope{TrustID: "emulator-trust"}
	idp, err := openstack.NewClient(url + "/identity")
	must(err, "identity client")
	idc := &gophercloud.ServiceClient{ProviderClient: idp, Endpoint: url + "/identity/v3/"}
	tr := tokens.Create(ctx, idc, &trust)
	must(tr.Err, "a trust-scoped token")
	tt, err := tr.ExtractTrust()
	must(err, "OS-TRUST:trust")
	proj, err := tr.ExtractProject()
	must(err, "the trust token's project")
	roles, err := tr.ExtractRoles()
	must(err, "the trust token's roles")
	if tt == nil || tt.ID != "emulator-trust" || proj == nil || proj.Name != "demo" || len(roles) != 1 || roles[0].Name != "member" {
		fail("a trust-scoped token: trust %+v project %+v roles %+v", tt, proj, roles)
	}
	trustTok, _ := tr.ExtractTokenID()
	tc, _, _ := clients(url, trustTok)
	if _, err := servers.Get(ctx, tc, s1.ID).Extract(); err != nil {
		fail("a trust-scoped token on its project's server: %v", err)
	}
	notTrustee := tokens.AuthOptions{Username: "admin", Password: "openstack-emulator-password", DomainName: "Default",
		Scope: tokens.Scope{TrustID: "emulator-trust"}}
	if _, err := token(url, notTrustee); !is(err, 403) {
		fail("a trust used by a user who is not its trustee: want 403, got %v", err)
	}
	unknown := member
	unknown.Scope = tokens.Scope{TrustID: "no-such-trust"}
	if _, err := token(url, unknown); !is(err, 404) {
		fail("an unknown trust: want 404, got %v", err)
	}
	ok("keystone.trust_scoped_token")

	// Magnum's cloud.conf: the trustee by user ID (no domain) with its password and the trust.
	mr := tokens.Create(ctx, idc, &member)
	must(mr.Err, "the member's token")
	mu, err := mr.ExtractUser()
	must(err, "the member's user")
	byID := tokens.AuthOptions{UserID: mu.ID, Password: "openstack-emulator-member-password",
		Scope: tokens.Scope{TrustID: "emulator-trust"}}
	br := tokens.Create(ctx, idc, &byID)
	must(br.Err, "a trust-scoped token for the trustee by user ID")
	bp, err := br.ExtractProject()
	must(err, "the trustee-by-ID token's project")
	if bp == nil || bp.Name != "demo" {
		fail("the trustee by user ID: want the trustor's project demo, got %+v", bp)
	}
	ok("keystone.trust_scoped_token.trustee_by_user_id")

	// An application credential by name: its user named by ID, or by name in its domain; the
	// same name with another user is a 401.
	ar := tokens.Create(ctx, idc, &tokens.AuthOptions{Username: "admin", Password: "openstack-emulator-password", DomainName: "Default"})
	must(ar.Err, "the admin's token")
	au, err := ar.ExtractUser()
	must(err, "the admin's user")
	for _, o := range []tokens.AuthOptions{
		{ApplicationCredentialName: "emulator-app-cred-by-name", ApplicationCredentialSecret: "openstack-emulator-app-cred-secret", UserID: au.ID},
		{ApplicationCredentialName: "emulator-app-cred-by-name", ApplicationCredentialSecret: "openstack-emulator-app-cred-secret", Username: "admin", DomainName: "Default"},
	} {
		r := tokens.Create(ctx, idc, &o)
		must(r.Err, "an application credential by name and user")
		p, err := r.ExtractProject()
		must(err, "the application credential token's project")
		if p == nil || p.Name != "demo" {
			fail("an application credential by name: want project demo, got %+v", p)
		}
	}
	otherUser := tokens.AuthOptions{ApplicationCredentialName: "emulator-app-cred-by-name",
		ApplicationCredentialSecret: "openstack-emulator-app-cred-secret", Username: "member", DomainName: "Default"}
	if _, err := token(url, otherUser); !is(err, 401) {
		fail("an application credential name with another user: want 401, got %v", err)
	}
	ok("keystone.application_credential.by_name_and_user")

	// Nova: more statuses than ACTIVE/SHUTOFF; a deleted server is a 404 itemNotFound, listed
	// only by an admin asking deleted=true.
	for _, s := range all {
		if s.Name == "node-6" && s.Status != "SUSPENDED" {
			fail("node-6 is suspended: want SUSPENDED, got %s", s.Status)
		}
		if s.Name == "node-5" {
			fail("a deleted server is listed: %+v", s)
		}
	}
	ok("nova.servers.status_suspended")
	var del struct{ Servers []servers.Server }
	_, err = compute.Get(ctx, compute.ServiceURL("servers", "detail")+"?deleted=true", &del, nil)
	must(err, "servers list deleted=true")
	if len(del.Servers) != 1 || del.Servers[0].Name != "node-5" || del.Servers[0].Status != "DELETED" {
		fail("servers deleted=true (admin): want node-5 DELETED, got %+v", del.Servers)
	}
	_, err = servers.Get(ctx, compute, del.Servers[0].ID).Extract()
	if !is(err, 404) || !strings.Contains(errBody(err), "itemNotFound") {
		fail("GET of a deleted server: want 404 itemNotFound, got %v", err)
	}
	ok("nova.servers.deleted_is_404_listed_with_deleted_true")

	// Neutron: a floating IP's subnet_id must be a subnet of the floating network, and the
	// address comes from it.
	pubSubs, err := subnets.List(network, subnets.ListOpts{NetworkID: public.ID}).AllPages(ctx)
	must(err, "public subnets")
	ps, _ := subnets.ExtractSubnets(pubSubs)
	if len(ps) == 0 {
		fail("the external network has no subnet")
	}
	f1, err := floatingips.Create(ctx, network, floatingips.CreateOpts{FloatingNetworkID: public.ID, SubnetID: ps[0].ID}).Extract()
	must(err, "floating ip by subnet_id")
	_, cidr, _ := net.ParseCIDR(ps[0].CIDR)
	if !cidr.Contains(net.ParseIP(f1.FloatingIP)) {
		fail("a floating ip from subnet %s: got %s", ps[0].CIDR, f1.FloatingIP)
	}
	if _, err := floatingips.Create(ctx, network, floatingips.CreateOpts{FloatingNetworkID: public.ID, SubnetID: subnet.ID}).Extract(); !is(err, 400) {
		fail("a floating ip from a subnet of another network: want 400, got %v", err)
	}
	must(floatingips.Delete(ctx, network, f1.ID).ExtractErr(), "floating ip delete")
	ok("neutron.floatingips.subnet_id")
	// Only an admin chooses the address (policy): a member gets a 403.
	memberDemo := member
	memberDemo.Scope = tokens.Scope{ProjectName: "demo", DomainName: "Default"}
	mTok, err := token(url, memberDemo)
	must(err, "member token")
	_, mn, _ := clients(url, mTok)
	_, err = floatingips.Create(ctx, mn, floatingips.CreateOpts{FloatingNetworkID: public.ID, FloatingIP: "172.24.4.222"}).Extract()
	if !is(err, 403) || neutronType(err) != "PolicyNotAuthorized" {
		fail("a member choosing a floating address: want 403 PolicyNotAuthorized, got %v", err)
	}
	f2, err := floatingips.Create(ctx, network, floatingips.CreateOpts{FloatingNetworkID: public.ID, FloatingIP: "172.24.4.222"}).Extract()
	must(err, "an admin choosing a floating address")
	must(floatingips.Delete(ctx, network, f2.ID).ExtractErr(), "floating ip delete")
	ok("neutron.floatingips.fixed_address_needs_admin")

	// Port security: security groups on a port without port security are a 409.
	off := false
	bare, err := ports.Create(ctx, network, portsecurity.PortCreateOptsExt{
		CreateOptsBuilder:   ports.CreateOpts{NetworkID: subnet.NetworkID, Name: "no-port-security"},
		PortSecurityEnabled: &off}).Extract()
	must(err, "a port without port security")
	sg, err := groups.Create(ctx, network, groups.CreateOpts{Name: "ps-check"}).Extract()
	must(err, "sg")
	with := []string{sg.ID}
	_, err = ports.Update(ctx, network, bare.ID, ports.UpdateOpts{SecurityGroups: &with}).Extract()
	if !is(err, 409) || neutronType(err) != "PortSecurityAndIPRequiredForSecurityGroups" {
		fail("security groups on a port without port security: want 409 PortSecurityAndIPRequiredForSecurityGroups, got %v", err)
	}
	pairs := []ports.AddressPair{{IPAddress: "10.244.9.0/24"}}
	_, err = ports.Update(ctx, network, bare.ID, ports.UpdateOpts{AllowedAddressPairs: &pairs}).Extract()
	if !is(err, 409) || neutronType(err) != "AddressPairAndPortSecurityRequired" {
		fail("address pairs on a port without port security: want 409 AddressPairAndPortSecurityRequired, got %v", err)
	}
	must(ports.Delete(ctx, network, bare.ID).ExtractErr(), "port delete")
	ok("neutron.ports.port_security_409")

	// max_routes: 30 routes per router; the 31st is a 400 RoutesExhausted.
	rp, err := routers.List(network, routers.ListOpts{Name: "router1"}).AllPages(ctx)
	must(err, "routers")
	rs, _ := routers.ExtractRouters(rp)
	many := []routers.Route{}
	for i := 0; i < 31; i++ {
		many = append(many, routers.Route{DestinationCIDR: fmt.Sprintf("10.250.%d.0/24", i), NextHop: "10.0.0.11"})
	}
	_, err = extraroutes.Add(ctx, network, rs[0].ID, extraroutes.Opts{Routes: &many}).Extract()
	if !is(err, 400) || neutronType(err) != "RoutesExhausted" {
		fail("31 routes on a router: want 400 RoutesExhausted, got %v", err)
	}
	thirty := many[:30]
	_, err = extraroutes.Add(ctx, network, rs[0].ID, extraroutes.Opts{Routes: &thirty}).Extract()
	must(err, "30 routes")
	none := []routers.Route{}
	_, err = routers.Update(ctx, network, rs[0].ID, routers.UpdateOpts{Routes: &none}).Extract()
	must(err, "routes cleared")
	ok("neutron.routers.max_routes")

	// Quotas (Neutron's defaults): security groups 10, rules 100, floating IPs 50 per project;
	// one more is a 409 OverQuota.
	var made []string
	for i := 0; ; i++ {
		g, err := groups.Create(ctx, network, groups.CreateOpts{Name: fmt.Sprintf("quota-%d", i)}).Extract()
		if err != nil {
			if !is(err, 409) || neutronType(err) != "OverQuota" || i > 10 {
				fail("security groups over quota: want 409 OverQuota after at most 10, got %v after %d", err, i)
			}
			break
		}
		made = append(made, g.ID)
	}
	rulesMade := 0
	for i := 0; ; i++ {
		_, err := rules.Create(ctx, network, rules.CreateOpts{Direction: rules.DirIngress, EtherType: rules.EtherType4, SecGroupID: sg.ID,
			Protocol: rules.ProtocolTCP, PortRangeMin: 1000 + i, PortRangeMax: 1000 + i}).Extract()
		if err != nil {
			if !is(err, 409) || neutronType(err) != "OverQuota" || i > 100 {
				fail("rules over quota: want 409 OverQuota after at most 100, got %v after %d", err, i)
			}
			break
		}
		rulesMade++
	}
	var fips []string
	for i := 0; ; i++ {
		f, err := floatingips.Create(ctx, network, floatingips.CreateOpts{FloatingNetworkID: public.ID}).Extract()
		if err != nil {
			if !is(err, 409) || neutronType(err) != "OverQuota" || i > 50 {
				fail("floating ips over quota: want 409 OverQuota after at most 50, got %v after %d", err, i)
			}
			break
		}
		fips = append(fips, f.ID)
	}
	for _, id := range made {
		must(groups.Delete(ctx, network, id).ExtractErr(), "quota sg delete")
	}
	for _, id := range fips {
		must(floatingips.Delete(ctx, network, id).ExtractErr(), "quota fip delete")
	}
	must(groups.Delete(ctx, network, sg.ID).ExtractErr(), "sg delete")
	ok(fmt.Sprintf("neutron.quotas_over_quota_409 (%d more groups, %d rules, %d floating ips)", len(made), rulesMade, len(fips)))

	// Octavia: vip_port_id is used (its address; the port stays after the delete).
	vport, err := ports.Create(ctx, network, ports.CreateOpts{NetworkID: subnet.NetworkID, Name: "my-vip",
		FixedIPs: []ports.IP{{SubnetID: subnet.ID, IPAddress: "10.0.0.77"}}}).Extract()
	must(err, "vip port")
	vlb, err := loadbalancers.Create(ctx, lbc, loadbalancers.CreateOpts{Name: "vip-port", VipPortID: vport.ID}).Extract()
	must(err, "lb on a vip port")
	if vlb.VipPortID != vport.ID || vlb.VipAddress != "10.0.0.77" || vlb.VipSubnetID != subnet.ID {
		fail("an lb on vip_port_id: port %s address %s subnet %s", vlb.VipPortID, vlb.VipAddress, vlb.VipSubnetID)
	}
	ok("octavia.loadbalancers.vip_port_id")
	// vip_address: outside the subnet 400, in use 409.
	if _, err := loadbalancers.Create(ctx, lbc, loadbalancers.CreateOpts{Name: "x", VipSubnetID: subnet.ID, VipAddress: "10.0.9.9"}).Extract(); !is(err, 400) {
		fail("a vip_address outside the subnet: want 400, got %v", err)
	}
	if _, err := loadbalancers.Create(ctx, lbc, loadbalancers.CreateOpts{Name: "x", VipSubnetID: subnet.ID, VipAddress: "10.0.0.11"}).Extract(); !is(err, 409) {
		fail("a vip_address in use: want 409, got %v", err)
	}
	ok("octavia.loadbalancers.vip_address_validated")
	// Provider, flavor, availability zone: unknown ones are a 400.
	for what, o := range map[string]loadbalancers.CreateOpts{
		"provider":          {Name: "x", VipSubnetID: subnet.ID, Provider: "f5"},
		"flavor":            {Name: "x", VipSubnetID: subnet.ID, FlavorID: "00000000-0000-4000-8000-000000000000"},
		"availability zone": {Name: "x", VipSubnetID: subnet.ID, AvailabilityZone: "nowhere"},
	} {
		if _, err := loadbalancers.Create(ctx, lbc, o).Extract(); !is(err, 400) {
			fail("an unknown %s: want 400, got %v", what, err)
		}
	}
	ok("octavia.loadbalancers.provider_flavor_az_validated")
	for _, l := range []string{vlb.ID, demoLB.ID} {
		for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) {
			x, err := loadbalancers.Get(ctx, lbc, l).Extract()
			must(err, "lb get")
			if x.ProvisioningStatus == "ACTIVE" {
				break
			}
			if time.Now().After(deadline) {
				fail("lb %s never became ACTIVE", l)
			}
		}
		must(loadbalancers.Delete(ctx, lbc, l, nil).ExtractErr(), "lb delete")
	}
	for deadline := time.Now().Add(60 * time.Second); ; time.Sleep(300 * time.Millisecond) {
		_, err := loadbalancers.Get(ctx, lbc, vlb.ID).Extract()
		if is(err, 404) {
			break
		}
		if time.Now().After(deadline) {
			fail("lb %s never went away", vlb.ID)
		}
	}
	if _, err := ports.Get(ctx, network, vport.ID).Extract(); err != nil {
		fail("the caller's vip port after the lb's delete: %v", err)
	}
	must(ports.Delete(ctx, network, vport.ID).ExtractErr(), "vip port delete")
	ok("octavia.loadbalancers.vip_port_id_kept_on_delete")
}

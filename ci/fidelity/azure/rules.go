package main

// Behavioural rules of ARM's Network resource provider (issue 31): for each, the request a
// client of the real cloud would make, and the error the SDK must see (status and ARM's
// error code). Sources are in docs/emulators.md (Azure table).

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

func checkRules(ctx context.Context, base, token string, network *armnetwork.ClientFactory, clusterPipID string) {
	pips := network.NewPublicIPAddressesClient()
	lbs := network.NewLoadBalancersClient()
	lbName := "rules-lb"
	lbID := fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/loadBalancers/%s", sub, rg, lbName)
	subnetID := fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/virtualNetworks/vnet/subnets/subnet", sub, rg)
	ref := func(kind, name string) *armnetwork.SubResource {
		return &armnetwork.SubResource{ID: to.Ptr(lbID + "/" + kind + "/" + name)}
	}
	pipRef := func(id string) *armnetwork.PublicIPAddress { return &armnetwork.PublicIPAddress{ID: to.Ptr(id)} }
	publicFE := func(name, pipID string) *armnetwork.FrontendIPConfiguration {
		return &armnetwork.FrontendIPConfiguration{Name: to.Ptr(name),
			Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{PublicIPAddress: pipRef(pipID)}}
	}
	privateFE := func(name, addr string, zones ...string) *armnetwork.FrontendIPConfiguration {
		p := &armnetwork.FrontendIPConfigurationPropertiesFormat{Subnet: &armnetwork.Subnet{ID: to.Ptr(subnetID)}}
		if addr != "" {
			p.PrivateIPAddress = to.Ptr(addr)
			p.PrivateIPAllocationMethod = to.Ptr(armnetwork.IPAllocationMethodStatic)
		}
		fe := &armnetwork.FrontendIPConfiguration{Name: to.Ptr(name), Properties: p}
		for _, z := range zones {
			fe.Zones = append(fe.Zones, to.Ptr(z))
		}
		return fe
	}
	rule := func(name, fe string, proto armnetwork.TransportProtocol, front, back int32, floating bool) *armnetwork.LoadBalancingRule {
		return &armnetwork.LoadBalancingRule{Name: to.Ptr(name), Properties: &armnetwork.LoadBalancingRulePropertiesFormat{
			Protocol: to.Ptr(proto), FrontendPort: to.Ptr(front), BackendPort: to.Ptr(back),
			EnableFloatingIP: to.Ptr(floating), IdleTimeoutInMinutes: to.Ptr[int32](4),
			FrontendIPConfiguration: ref("frontendIPConfigurations", fe),
			BackendAddressPool:      ref("backendAddressPools", "pool"),
			Probe:                   ref("probes", "probe"),
		}}
	}
	probe := func(interval, count int32) []*armnetwork.Probe {
		return []*armnetwork.Probe{{Name: to.Ptr("probe"), Properties: &armnetwork.ProbePropertiesFormat{
			Protocol: to.Ptr(armnetwork.ProbeProtocolTCP), Port: to.Ptr[int32](30080),
			IntervalInSeconds: to.Ptr(interval), ProbeThreshold: to.Ptr(count)}}}
	}
	lb := func(fes []*armnetwork.FrontendIPConfiguration, rules ...*armnetwork.LoadBalancingRule) armnetwork.LoadBalancer {
		return armnetwork.LoadBalancer{
			Location: to.Ptr("eastus"),
			SKU:      &armnetwork.LoadBalancerSKU{Name: to.Ptr(armnetwork.LoadBalancerSKUNameStandard)},
			Properties: &armnetwork.LoadBalancerPropertiesFormat{
				FrontendIPConfigurations: fes,
				BackendAddressPools:      []*armnetwork.BackendAddressPool{{Name: to.Ptr("pool")}},
				Probes:                   probe(5, 2),
				LoadBalancingRules:       rules,
			},
		}
	}
	putLB := func(body armnetwork.LoadBalancer) (armnetwork.LoadBalancer, error) {
		p, err := lbs.BeginCreateOrUpdate(ctx, rg, lbName, body, nil)
		if err != nil {
			return armnetwork.LoadBalancer{}, err
		}
		r, err := p.PollUntilDone(ctx, &runtimePoll)
		return r.LoadBalancer, err
	}
	newPip := func(name, location string, sku armnetwork.PublicIPAddressSKUName, zones []string, idle int32) armnetwork.PublicIPAddress {
		p := armnetwork.PublicIPAddress{
			Location: to.Ptr(location),
			SKU:      &armnetwork.PublicIPAddressSKU{Name: to.Ptr(sku)},
			Properties: &armnetwork.PublicIPAddressPropertiesFormat{
				PublicIPAllocationMethod: to.Ptr(armnetwork.IPAllocationMethodStatic),
				PublicIPAddressVersion:   to.Ptr(armnetwork.IPVersionIPv4),
			},
		}
		if idle != 0 {
			p.Properties.IdleTimeoutInMinutes = to.Ptr(idle)
		}
		for _, z := range zones {
			p.Zones = append(p.Zones, to.Ptr(z))
		}
		return p
	}
	putPip := func(name string, body armnetwork.PublicIPAddress) armnetwork.PublicIPAddress {
		p, err := pips.BeginCreateOrUpdate(ctx, rg, name, body, nil)
		must(err, "publicIPAddresses.createOrUpdate "+name)
		r, err := p.PollUntilDone(ctx, &runtimePoll)
		must(err, "publicIPAddresses.createOrUpdate poll "+name)
		return r.PublicIPAddress
	}

	// Zones: Standard public IPs keep their zones; changing them is refused; Basic has none.
	zonal := putPip("zonal-pip", newPip("zonal-pip", "eastus", armnetwork.PublicIPAddressSKUNameStandard, []string{"1", "2", "3"}, 0))
	got, err := pips.Get(ctx, rg, "zonal-pip", nil)
	must(err, "publicIPAddresses.get zonal-pip")
	if len(got.Zones) != 3 {
		fail("a zonal public IP: want zones [1 2 3] kept, got %v", got.Zones)
	}
	ok("network.public_ip_addresses: zones [1 2 3] kept")
	changed := got.PublicIPAddress
	changed.Zones = []*string{to.Ptr("1")}
	_, err = pips.BeginCreateOrUpdate(ctx, rg, "zonal-pip", changed, nil)
	armErr(err, 400, "ResourceAvailabilityZonesCannotBeModified", "network.public_ip_addresses.create_or_update changing zones")
	_, err = pips.BeginCreateOrUpdate(ctx, rg, "basic-zonal-pip", newPip("basic-zonal-pip", "eastus", armnetwork.PublicIPAddressSKUNameBasic, []string{"1"}, 0), nil)
	armErr(err, 400, "AvailabilityZonesNotSupportedForBasicSku", "network.public_ip_addresses.create_or_update Basic with zones")
	_, err = pips.BeginCreateOrUpdate(ctx, rg, "idle-pip", newPip("idle-pip", "eastus", armnetwork.PublicIPAddressSKUNameStandard, nil, 31), nil)
	armErr(err, 400, "PublicIPAddressIdleTimeoutIsOutOfRange", "network.public_ip_addresses.create_or_update idleTimeoutInMinutes 31")

	// A frontend's public IP: SKU, location and provisioning state must fit.
	basic := putPip("basic-pip", newPip("basic-pip", "eastus", armnetwork.PublicIPAddressSKUNameBasic, nil, 0))
	_, err = putLB(lb([]*armnetwork.FrontendIPConfiguration{publicFE("fe", *basic.ID)}, rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true)))
	armErr(err, 400, "PublicIPAndLBSkuDoNotMatch", "network.load_balancers.create_or_update Standard LB with a Basic public IP")
	west := putPip("west-pip", newPip("west-pip", "westus", armnetwork.PublicIPAddressSKUNameStandard, nil, 0))
	_, err = putLB(lb([]*armnetwork.FrontendIPConfiguration{publicFE("fe", *west.ID)}, rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true)))
	armErr(err, 400, "InvalidResourceReference", "network.load_balancers.create_or_update with a public IP of another location")
	pending, err := pips.BeginCreateOrUpdate(ctx, rg, "pending-pip", newPip("pending-pip", "eastus", armnetwork.PublicIPAddressSKUNameStandard, nil, 0), nil)
	must(err, "publicIPAddresses.createOrUpdate pending-pip")
	pendingID := fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/publicIPAddresses/pending-pip", sub, rg)
	_, err = putLB(lb([]*armnetwork.FrontendIPConfiguration{publicFE("fe", pendingID)}, rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true)))
	armErr(err, 400, "ReferencedResourceNotProvisioned", "network.load_balancers.create_or_update with a public IP still Updating")
	_, err = pending.PollUntilDone(ctx, &runtimePoll)
	must(err, "publicIPAddresses.createOrUpdate pending-pip poll")

	// One public IP, two frontends (of this load balancer, or this and the cluster's).
	_, err = putLB(lb([]*armnetwork.FrontendIPConfiguration{publicFE("fe", *zonal.ID), publicFE("fe2", *zonal.ID)}, rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true)))
	armErr(err, 400, "PublicIPReferencedByMultipleIPConfigs", "network.load_balancers.create_or_update one public IP on two frontends")
	_, err = putLB(lb([]*armnetwork.FrontendIPConfiguration{publicFE("fe", clusterPipID)}, rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true)))
	armErr(err, 400, "PublicIPReferencedByMultipleIPConfigs", "network.load_balancers.create_or_update a public IP another load balancer's frontend uses")
	// Public and private frontends on one load balancer.
	_, err = putLB(lb([]*armnetwork.FrontendIPConfiguration{publicFE("fe", *zonal.ID), privateFE("internal", "")}, rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true)))
	armErr(err, 400, "LoadBalancerCannotHavePublicAndPrivateFrontendIPConfigurations", "network.load_balancers.create_or_update public and private frontends")
	both := publicFE("fe", *zonal.ID)
	both.Properties.Subnet = &armnetwork.Subnet{ID: to.Ptr(subnetID)}
	_, err = putLB(lb([]*armnetwork.FrontendIPConfiguration{both}, rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true)))
	armErr(err, 400, "FrontendIPConfigHasBothSubnetAndPublicIP", "network.load_balancers.create_or_update a frontend with a subnet and a public IP")

	// Rules on a public load balancer.
	_, err = putLB(lb([]*armnetwork.FrontendIPConfiguration{publicFE("fe", *zonal.ID)},
		rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true), rule("r80b", "fe", armnetwork.TransportProtocolTCP, 80, 30081, true)))
	armErr(err, 400, "LoadBalancingRulesUseSameFrontendIPConfigurationProtocolAndPort", "network.load_balancers.create_or_update two rules on one frontend port and protocol")
	_, err = putLB(lb([]*armnetwork.FrontendIPConfiguration{publicFE("fe", *zonal.ID)},
		rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, false), rule("r81", "fe", armnetwork.TransportProtocolTCP, 81, 30080, false)))
	armErr(err, 400, "RulesUseSameBackendPortProtocolAndPool", "network.load_balancers.create_or_update two rules on one backend port, protocol and pool (no floating IP)")
	_, err = putLB(lb([]*armnetwork.FrontendIPConfiguration{publicFE("fe", *zonal.ID)}, rule("ha", "fe", armnetwork.TransportProtocolAll, 0, 0, true)))
	armErr(err, 400, "HaPortsRuleNotSupportedOnPublicLoadBalancer", "network.load_balancers.create_or_update HA ports on a public load balancer")
	idle := lb([]*armnetwork.FrontendIPConfiguration{publicFE("fe", *zonal.ID)}, rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true))
	idle.Properties.LoadBalancingRules[0].Properties.IdleTimeoutInMinutes = to.Ptr[int32](101)
	_, err = putLB(idle)
	armErr(err, 400, "LoadBalancingRuleIdleTimeoutIsOutOfRange", "network.load_balancers.create_or_update idleTimeoutInMinutes 101")
	for _, c := range [][2]int32{{3, 2}, {5, 0}, {61, 2}} {
		bad := lb([]*armnetwork.FrontendIPConfiguration{publicFE("fe", *zonal.ID)}, rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true))
		bad.Properties.Probes = probe(c[0], c[1])
		_, err = putLB(bad)
		armErr(err, 400, "InvalidProbeIntervalOrNumberOfProbes", fmt.Sprintf("network.load_balancers.create_or_update probe interval %d s × %d", c[0], c[1]))
	}
	good, err := putLB(lb([]*armnetwork.FrontendIPConfiguration{publicFE("fe", *zonal.ID)},
		rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true), rule("r443", "fe", armnetwork.TransportProtocolTCP, 443, 30443, true)))
	must(err, "loadBalancers.createOrUpdate rules-lb (public, zonal public IP)")
	ok("network.load_balancers.create_or_update rules-lb: %d rules on one frontend, Succeeded", len(good.Properties.LoadBalancingRules))
	del, err := lbs.BeginDelete(ctx, rg, lbName, nil)
	must(err, "loadBalancers.delete rules-lb")
	_, err = del.PollUntilDone(ctx, &runtimePoll)
	must(err, "loadBalancers.delete rules-lb poll")

	// An internal load balancer: static private IPs in the subnet and free; frontend zones
	// kept and immutable; HA ports allowed.
	_, err = putLB(lb([]*armnetwork.FrontendIPConfiguration{privateFE("fe", "10.240.0.4")}, rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true)))
	armErr(err, 400, "PrivateIPAddressIsAllocated", "network.load_balancers.create_or_update static private IP a NIC holds")
	_, err = putLB(lb([]*armnetwork.FrontendIPConfiguration{privateFE("fe", "10.99.0.10")}, rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true)))
	armErr(err, 400, "PrivateIPAddressNotInSubnet", "network.load_balancers.create_or_update static private IP outside the subnet")
	_, err = putLB(lb([]*armnetwork.FrontendIPConfiguration{privateFE("fe", "10.240.3.3"), privateFE("fe2", "10.240.3.3")}, rule("r80", "fe", armnetwork.TransportProtocolTCP, 80, 30080, true)))
	armErr(err, 400, "PrivateIPAddressIsAllocated", "network.load_balancers.create_or_update one static private IP on two frontends")
	internal, err := putLB(lb([]*armnetwork.FrontendIPConfiguration{privateFE("fe", "10.240.3.3", "1", "2", "3")}, rule("ha", "fe", armnetwork.TransportProtocolAll, 0, 0, true)))
	must(err, "loadBalancers.createOrUpdate rules-lb (internal, HA ports, zonal frontend)")
	fe := internal.Properties.FrontendIPConfigurations[0]
	if str(fe.Properties.PrivateIPAddress) != "10.240.3.3" || len(fe.Zones) != 3 {
		fail("internal frontend: address %s zones %v", str(fe.Properties.PrivateIPAddress), fe.Zones)
	}
	ok("network.load_balancers.create_or_update internal: static 10.240.3.3, zones [1 2 3] kept, HA ports rule")
	internal.Properties.FrontendIPConfigurations[0].Zones = []*string{to.Ptr("1")}
	_, err = lbs.BeginCreateOrUpdate(ctx, rg, lbName, internal, nil)
	armErr(err, 400, "ResourceAvailabilityZonesCannotBeModified", "network.load_balancers.create_or_update changing a frontend's zones")
	del, err = lbs.BeginDelete(ctx, rg, lbName, nil)
	must(err, "loadBalancers.delete rules-lb")
	_, err = del.PollUntilDone(ctx, &runtimePoll)
	must(err, "loadBalancers.delete rules-lb poll")
	for _, name := range []string{"zonal-pip", "basic-pip", "west-pip", "pending-pip"} {
		p, err := pips.BeginDelete(ctx, rg, name, nil)
		must(err, "publicIPAddresses.delete "+name)
		_, err = p.PollUntilDone(ctx, &runtimePoll)
		must(err, "publicIPAddresses.delete poll "+name)
	}

	// api-version: not of ARM's form, or not one the provider serves.
	apiVersion := func(v string) (int, string) {
		req, _ := http.NewRequest("GET", base+"/subscriptions/"+sub+"/resourceGroups/"+rg+"/providers/Microsoft.Network/loadBalancers?api-version="+v, nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := httpClient.Do(req)
		must(err, "GET with api-version "+v)
		defer resp.Body.Close()
		var e struct{ Error struct{ Code string } }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		return resp.StatusCode, e.Error.Code
	}
	for _, c := range []struct{ v, code string }{{"2099-01-01", "NoRegisteredProviderFound"}, {"2014-01-01", "NoRegisteredProviderFound"}, {"banana", "InvalidApiVersionParameter"}, {"2024-13-01", "InvalidApiVersionParameter"}} {
		if status, code := apiVersion(c.v); status != 400 || code != c.code {
			fail("api-version %s: want 400 %s, got %d %q", c.v, c.code, status, code)
		}
		ok("arm: api-version=%s -> 400 %s", c.v, c.code)
	}
	for _, v := range []string{"2024-05-01", "2024-07-01", "2023-09-01", "2025-05-01"} {
		if status, code := apiVersion(v); status != 200 {
			fail("api-version %s (the provider's, upstream's or the SDK's): got %d %q", v, status, code)
		}
	}
	ok("arm: api-versions 2023-09-01, 2024-05-01, 2024-07-01, 2025-05-01 accepted")
}

// checkFailedOperations: an operation the kit fails (POST /__emulator/operation-failures) ends
// as ARM's do: the Azure-AsyncOperation status Failed with error{code,message}, the resource
// left with provisioningState Failed, and the next PUT succeeds.
func checkFailedOperations(ctx context.Context, base string, network *armnetwork.ClientFactory) {
	pips := network.NewPublicIPAddressesClient()
	name := "failing-pip"
	resp, err := httpClient.Post(base+"/__emulator/operation-failures", "application/json",
		bytes.NewBufferString(`{"target":"*/publicIPAddresses/`+name+`","action":"create","times":1,"message":"Allocation of the public IP address failed (injected)."}`))
	must(err, "admin operation-failures")
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		fail("admin operation-failures: %d", resp.StatusCode)
	}
	body := armnetwork.PublicIPAddress{
		Location: to.Ptr("eastus"),
		SKU:      &armnetwork.PublicIPAddressSKU{Name: to.Ptr(armnetwork.PublicIPAddressSKUNameStandard)},
		Properties: &armnetwork.PublicIPAddressPropertiesFormat{
			PublicIPAllocationMethod: to.Ptr(armnetwork.IPAllocationMethodStatic),
		},
	}
	poller, err := pips.BeginCreateOrUpdate(ctx, rg, name, body, nil)
	must(err, "publicIPAddresses.createOrUpdate "+name)
	_, err = poller.PollUntilDone(ctx, &runtimePoll)
	var re *azcore.ResponseError
	if !errors.As(err, &re) || re.ErrorCode == "" || !strings.Contains(err.Error(), "Allocation of the public IP address failed") {
		fail("a failed operation: want the SDK's ResponseError with ARM's error code and message, got %v", err)
	}
	ok("network.public_ip_addresses.create_or_update, operation Failed -> SDK error %s (%.60s…)", re.ErrorCode, "Allocation of the public IP address failed")
	got, err := pips.Get(ctx, rg, name, nil)
	must(err, "publicIPAddresses.get "+name)
	if got.Properties.ProvisioningState == nil || *got.Properties.ProvisioningState != armnetwork.ProvisioningStateFailed {
		fail("after a failed operation: want provisioningState Failed, got %v", got.Properties.ProvisioningState)
	}
	ok("network.public_ip_addresses.get after a failed operation: provisioningState Failed")
	poller, err = pips.BeginCreateOrUpdate(ctx, rg, name, body, nil)
	must(err, "publicIPAddresses.createOrUpdate "+name+" again")
	again, err := poller.PollUntilDone(ctx, &runtimePoll)
	must(err, "publicIPAddresses.createOrUpdate "+name+" again poll")
	if *again.Properties.ProvisioningState != armnetwork.ProvisioningStateSucceeded {
		fail("the PUT after a failed operation: %v", *again.Properties.ProvisioningState)
	}
	ok("network.public_ip_addresses.create_or_update after a failed operation: Succeeded")
	del, err := pips.BeginDelete(ctx, rg, name, nil)
	must(err, "publicIPAddresses.delete "+name)
	_, err = del.PollUntilDone(ctx, &runtimePoll)
	must(err, "publicIPAddresses.delete "+name+" poll")
}

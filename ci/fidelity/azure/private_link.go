package main

// Private link services and the region's zones (issue 33 items 2 and 3): armnetwork's
// PrivateLinkServicesClient drives the emulator's Microsoft.Network/privateLinkServices (PUT
// and DELETE as long-running operations, GET, both lists) and ARM's rules: a PLS needs a NAT
// subnet whose privateLinkServiceNetworkPolicies are Disabled; one frontend serves one PLS; a
// load balancer whose frontend a PLS uses cannot be deleted; the policies cannot be turned on
// again while a PLS is in the subnet. The region's zones are Microsoft.Compute's
// virtualMachines zoneMappings (GET /subscriptions/{sub}/providers/Microsoft.Compute, as
// upstream's zone repository reads it through armresources).

import (
	"context"
	"encoding/json"
	"net/http"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

func checkPrivateLinkServices(ctx context.Context, base, token string, network *armnetwork.ClientFactory) {
	// The region's zones.
	{
		req, _ := http.NewRequest("GET", base+"/subscriptions/"+sub+"/providers/Microsoft.Compute?api-version=2021-04-01", nil)
		req.Header.Set("Authorization", "Bearer "+token)
		resp, err := httpClient.Do(req)
		must(err, "resources.providers.get Microsoft.Compute")
		var p struct {
			Namespace     string `json:"namespace"`
			ResourceTypes []struct {
				ResourceType string `json:"resourceType"`
				ZoneMappings []struct {
					Location string   `json:"location"`
					Zones    []string `json:"zones"`
				} `json:"zoneMappings"`
			} `json:"resourceTypes"`
		}
		err = json.NewDecoder(resp.Body).Decode(&p)
		resp.Body.Close()
		must(err, "resources.providers.get: decode")
		zones := ""
		for _, t := range p.ResourceTypes {
			if strings.EqualFold(t.ResourceType, "virtualMachines") {
				for _, m := range t.ZoneMappings {
					if strings.EqualFold(strings.ReplaceAll(m.Location, " ", ""), "eastus") {
						zones = strings.Join(m.Zones, ",")
					}
				}
			}
		}
		if resp.StatusCode != 200 || p.Namespace != "Microsoft.Compute" || zones != "1,2,3" {
			fail("resources.providers.get Microsoft.Compute: %d %+v", resp.StatusCode, p)
		}
		ok("resources.providers.get Microsoft.Compute: virtualMachines zoneMappings eastus -> %s", zones)
	}

	lbs := network.NewLoadBalancersClient()
	subnets := network.NewSubnetsClient()
	plss := network.NewPrivateLinkServicesClient()
	snResp, err := subnets.Get(ctx, rg, "vnet", "subnet", nil)
	must(err, "subnets.get vnet/subnet")
	subnetID := *snResp.ID
	lbPoller, err := lbs.BeginCreateOrUpdate(ctx, rg, "pls-lb", armnetwork.LoadBalancer{
		Location: to.Ptr("eastus"),
		SKU:      &armnetwork.LoadBalancerSKU{Name: to.Ptr(armnetwork.LoadBalancerSKUNameStandard)},
		Properties: &armnetwork.LoadBalancerPropertiesFormat{
			FrontendIPConfigurations: []*armnetwork.FrontendIPConfiguration{{
				Name:       to.Ptr("fe"),
				Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{Subnet: &armnetwork.Subnet{ID: to.Ptr(subnetID)}},
			}},
		},
	}, nil)
	must(err, "loadBalancers.create_or_update pls-lb")
	lbRes, err := lbPoller.PollUntilDone(ctx, &runtimePoll)
	must(err, "loadBalancers.create_or_update pls-lb poll")
	feID := *lbRes.Properties.FrontendIPConfigurations[0].ID
	pls := func(frontend string) armnetwork.PrivateLinkService {
		return armnetwork.PrivateLinkService{
			Location: to.Ptr("eastus"),
			Tags:     map[string]*string{"k8s-azure-cluster-name": to.Ptr(cluster), "k8s-azure-owner-service": to.Ptr("default/web")},
			Properties: &armnetwork.PrivateLinkServiceProperties{
				LoadBalancerFrontendIPConfigurations: []*armnetwork.FrontendIPConfiguration{{ID: to.Ptr(frontend)}},
				IPConfigurations: []*armnetwork.PrivateLinkServiceIPConfiguration{{
					Name: to.Ptr("subnet-pls-dynamic-0"),
					Properties: &armnetwork.PrivateLinkServiceIPConfigurationProperties{
						Primary:                   to.Ptr(true),
						PrivateIPAllocationMethod: to.Ptr(armnetwork.IPAllocationMethodDynamic),
						PrivateIPAddressVersion:   to.Ptr(armnetwork.IPVersionIPv4),
						Subnet:                    &armnetwork.Subnet{ID: to.Ptr(subnetID)},
					},
				}},
				Visibility:          &armnetwork.PrivateLinkServicePropertiesVisibility{Subscriptions: []*string{to.Ptr("*")}},
				AutoApproval:        &armnetwork.PrivateLinkServicePropertiesAutoApproval{Subscriptions: []*string{to.Ptr(sub)}},
				EnableProxyProtocol: to.Ptr(true),
				Fqdns:               []*string{to.Ptr("web.example.com")},
			},
		}
	}

	// The subnet's policies are on (ARM's default): refused.
	_, err = plss.BeginCreateOrUpdate(ctx, rg, "pls", pls(feID), nil)
	armErr(err, 400, "PrivateLinkServiceCannotBeCreatedInSubnetThatHasNetworkPoliciesEnabled",
		"network.private_link_services.create_or_update in a subnet with network policies on")
	sn := snResp.Subnet
	sn.Properties.PrivateLinkServiceNetworkPolicies = to.Ptr(armnetwork.VirtualNetworkPrivateLinkServiceNetworkPoliciesDisabled)
	snPoller, err := subnets.BeginCreateOrUpdate(ctx, rg, "vnet", "subnet", sn, nil)
	must(err, "subnets.create_or_update privateLinkServiceNetworkPolicies Disabled")
	_, err = snPoller.PollUntilDone(ctx, &runtimePoll)
	must(err, "subnets.create_or_update poll")

	p, err := plss.BeginCreateOrUpdate(ctx, rg, "pls", pls(feID), nil)
	must(err, "privateLinkServices.create_or_update pls")
	made, err := p.PollUntilDone(ctx, &runtimePoll)
	must(err, "privateLinkServices.create_or_update pls poll")
	got, err := plss.Get(ctx, rg, "pls", nil)
	must(err, "privateLinkServices.get pls")
	gp := got.Properties
	if made.ID == nil || gp == nil || str((*string)(gp.ProvisioningState)) != "Succeeded" || str(gp.Alias) == "<nil>" ||
		!strings.HasPrefix(str(gp.Alias), "pls.") || len(gp.IPConfigurations) != 1 ||
		str(gp.IPConfigurations[0].Properties.PrivateIPAddress) == "<nil>" || gp.EnableProxyProtocol == nil || !*gp.EnableProxyProtocol ||
		gp.Visibility == nil || len(gp.Visibility.Subscriptions) != 1 || *gp.Visibility.Subscriptions[0] != "*" ||
		len(gp.LoadBalancerFrontendIPConfigurations) != 1 || !strings.EqualFold(*gp.LoadBalancerFrontendIPConfigurations[0].ID, feID) {
		fail("privateLinkServices.get pls: %+v", gp)
	}
	ok("network.private_link_services.create_or_update (LRO) + get: Succeeded, alias %s, NAT address %s", str(gp.Alias), str(gp.IPConfigurations[0].Properties.PrivateIPAddress))
	n := 0
	for pg := plss.NewListPager(rg, nil); pg.More(); {
		page, err := pg.NextPage(ctx)
		must(err, "privateLinkServices.list")
		n += len(page.Value)
	}
	m := 0
	for pg := plss.NewListBySubscriptionPager(nil); pg.More(); {
		page, err := pg.NextPage(ctx)
		must(err, "privateLinkServices.listBySubscription")
		m += len(page.Value)
	}
	if n != 1 || m != 1 {
		fail("privateLinkServices lists: %d in the resource group, %d in the subscription", n, m)
	}
	ok("network.private_link_services.{list,list_all}: the PLS in both")

	_, err = plss.BeginCreateOrUpdate(ctx, rg, "pls-2", pls(feID), nil)
	armErr(err, 400, "LoadBalancerFrontendIpConfigurationAlreadyUsedByPrivateLinkService",
		"network.private_link_services.create_or_update on a frontend another PLS uses")
	_, err = lbs.BeginDelete(ctx, rg, "pls-lb", nil)
	armErr(err, 400, "LoadBalancerFrontendIpConfigurationInUseByPrivateLinkService",
		"network.load_balancers.delete while a PLS uses its frontend")
	again, err := subnets.Get(ctx, rg, "vnet", "subnet", nil)
	must(err, "subnets.get vnet/subnet again")
	on := again.Subnet
	on.Properties.PrivateLinkServiceNetworkPolicies = to.Ptr(armnetwork.VirtualNetworkPrivateLinkServiceNetworkPoliciesEnabled)
	_, err = subnets.BeginCreateOrUpdate(ctx, rg, "vnet", "subnet", on, nil)
	armErr(err, 400, "PrivateLinkServiceNetworkPoliciesCannotBeEnabledOnPrivateLinkServiceSubnet",
		"network.subnets.create_or_update enabling policies with a PLS in the subnet")

	d, err := plss.BeginDelete(ctx, rg, "pls", nil)
	must(err, "privateLinkServices.delete pls")
	_, err = d.PollUntilDone(ctx, &runtimePoll)
	must(err, "privateLinkServices.delete pls poll")
	_, err = plss.Get(ctx, rg, "pls", nil)
	armErr(err, 404, "ResourceNotFound", "network.private_link_services.delete (LRO), then get")
	ld, err := lbs.BeginDelete(ctx, rg, "pls-lb", nil)
	must(err, "loadBalancers.delete pls-lb after its PLS")
	_, err = ld.PollUntilDone(ctx, &runtimePoll)
	must(err, "loadBalancers.delete pls-lb poll")
	ok("network.load_balancers.delete: allowed once the PLS is gone")
}

package main

// Compute's deletes (issue 31): a VM's and a scale-set VM's DELETE is a long-running operation
// (202 with Azure-AsyncOperation and Location); while it runs the resource reads
// provisioningState Deleting; when it ends the resource is 404 ResourceNotFound; the VM's NIC
// stays, detached (NICs go with a VM only when its network profile says deleteOption
// Delete); a scale-set VM's NIC goes with it and the set's capacity drops by one. Deleting what
// does not exist is ARM's 204 (nothing to poll); in a resource group that does not exist, 404
// ResourceGroupNotFound.

import (
	"context"
	"net/http"
	"strings"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"

	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

func checkComputeDeletes(ctx context.Context, compute *armcompute.ClientFactory, network *armnetwork.ClientFactory) {
	vms := compute.NewVirtualMachinesClient()
	nics := network.NewInterfacesClient()
	poller, err := vms.BeginDelete(ctx, rg, "vm-3", nil)
	must(err, "virtualMachines.delete vm-3")
	during, err := vms.Get(ctx, rg, "vm-3", nil)
	must(err, "virtualMachines.get vm-3 while it is deleted")
	if during.Properties == nil || str(during.Properties.ProvisioningState) != "Deleting" {
		fail("a VM being deleted: want provisioningState Deleting, got %v", during.Properties)
	}
	_, err = poller.PollUntilDone(ctx, &runtimePoll)
	must(err, "virtualMachines.delete vm-3 poll")
	_, err = vms.Get(ctx, rg, "vm-3", nil)
	armErr(err, 404, "ResourceNotFound", "compute.virtual_machines.delete (LRO, Deleting while it runs), then get")
	nic, err := nics.Get(ctx, rg, "vm-3-nic", nil)
	must(err, "networkInterfaces.get vm-3-nic after its VM was deleted")
	if nic.Properties == nil || nic.Properties.VirtualMachine != nil || len(nic.Properties.IPConfigurations) == 0 {
		fail("the NIC of a deleted VM: want it kept, detached (no virtualMachine), got %+v", nic.Properties)
	}
	ok("network.network_interfaces.get vm-3-nic: kept after its VM's delete, no virtualMachine")
	again, err := vms.BeginDelete(ctx, rg, "vm-3", nil)
	must(err, "virtualMachines.delete vm-3 again")
	_, err = again.PollUntilDone(ctx, &runtimePoll)
	must(err, "virtualMachines.delete vm-3 again poll")
	ok("compute.virtual_machines.delete of a deleted VM: 204, done")
	_, err = vms.BeginDelete(ctx, "no-such-rg", "vm-3", nil)
	armErr(err, 404, "ResourceGroupNotFound", "compute.virtual_machines.delete in a missing resource group")

	sets := compute.NewVirtualMachineScaleSetsClient()
	ssvms := compute.NewVirtualMachineScaleSetVMsClient()
	before, err := sets.Get(ctx, rg, "pool", nil)
	must(err, "virtualMachineScaleSets.get pool")
	p2, err := ssvms.BeginDelete(ctx, rg, "pool", "10", nil)
	must(err, "virtualMachineScaleSetVMs.delete pool/10")
	going, err := ssvms.Get(ctx, rg, "pool", "10", nil)
	must(err, "virtualMachineScaleSetVMs.get pool/10 while it is deleted")
	if going.Properties == nil || str(going.Properties.ProvisioningState) != "Deleting" {
		fail("a scale-set VM being deleted: want provisioningState Deleting, got %v", going.Properties)
	}
	ok("compute.virtual_machine_scale_set_vms.get pool/10 while deleted: provisioningState Deleting")
	_, err = p2.PollUntilDone(ctx, &runtimePoll)
	must(err, "virtualMachineScaleSetVMs.delete pool/10 poll")
	_, err = ssvms.Get(ctx, rg, "pool", "10", nil)
	armErr(err, 404, "ResourceNotFound", "compute.virtual_machine_scale_set_vms.delete (LRO), then get")
	after, err := sets.Get(ctx, rg, "pool", nil)
	must(err, "virtualMachineScaleSets.get pool")
	if *after.SKU.Capacity != *before.SKU.Capacity-1 {
		fail("scale set capacity after an instance's delete: %d -> %d", *before.SKU.Capacity, *after.SKU.Capacity)
	}
	left := []string{}
	for p := nics.NewListVirtualMachineScaleSetNetworkInterfacesPager(rg, "pool", nil); p.More(); {
		page, err := p.NextPage(ctx)
		must(err, "networkInterfaces.listVirtualMachineScaleSetNetworkInterfaces")
		for _, n := range page.Value {
			left = append(left, str(n.ID))
		}
	}
	for _, id := range left {
		if strings.Contains(id, "/virtualMachines/10/") {
			fail("the NIC of deleted scale-set VM pool/10 is still listed: %v", left)
		}
	}
	ok("compute.virtual_machine_scale_sets.get pool: capacity %d -> %d; %d NICs left", *before.SKU.Capacity, *after.SKU.Capacity, len(left))
	_, err = ssvms.BeginDelete(ctx, rg, "no-such-set", "0", nil)
	armErr(err, 404, "ResourceNotFound", "compute.virtual_machine_scale_set_vms.delete in a missing scale set")
}

// checkBarePut: some ARM creates answer 201 with no Azure-AsyncOperation or Location header;
// the resource reads provisioningState Updating until it settles, and the SDK's poller reads
// the resource itself until then (the emulator's switch POST /__azure/put-without-operation-header).
func checkBarePut(ctx context.Context, base string, network *armnetwork.ClientFactory) {
	sw := func(on string) {
		resp, err := httpClient.Post(base+"/__azure/put-without-operation-header?on="+on, "application/json", nil)
		must(err, "emulator switch put-without-operation-header")
		resp.Body.Close()
		if resp.StatusCode != 200 {
			fail("emulator switch put-without-operation-header: %d", resp.StatusCode)
		}
	}
	sw("true")
	defer sw("false")
	pips := network.NewPublicIPAddressesClient()
	var raw *http.Response
	pctx := policy.WithCaptureResponse(ctx, &raw)
	poller, err := pips.BeginCreateOrUpdate(pctx, rg, "bare-pip", armnetwork.PublicIPAddress{
		Location: to.Ptr("eastus"),
		SKU:      &armnetwork.PublicIPAddressSKU{Name: to.Ptr(armnetwork.PublicIPAddressSKUNameStandard)},
		Properties: &armnetwork.PublicIPAddressPropertiesFormat{
			PublicIPAllocationMethod: to.Ptr(armnetwork.IPAllocationMethodStatic),
		},
	}, nil)
	must(err, "publicIPAddresses.createOrUpdate bare-pip")
	if raw == nil || raw.StatusCode != 201 || raw.Header.Get("Azure-AsyncOperation") != "" || raw.Header.Get("Location") != "" {
		fail("a bare create: want 201 without operation headers, got %v", raw)
	}
	now, err := pips.Get(ctx, rg, "bare-pip", nil)
	must(err, "publicIPAddresses.get bare-pip")
	if str((*string)(now.Properties.ProvisioningState)) != "Updating" {
		fail("a bare create right after the PUT: want provisioningState Updating, got %v", str((*string)(now.Properties.ProvisioningState)))
	}
	done, err := poller.PollUntilDone(ctx, &runtimePoll)
	must(err, "publicIPAddresses.createOrUpdate bare-pip poll (the resource itself)")
	if *done.Properties.ProvisioningState != armnetwork.ProvisioningStateSucceeded {
		fail("a bare create after polling the resource: %v", *done.Properties.ProvisioningState)
	}
	ok("network.public_ip_addresses.create_or_update answered 201 without an operation header: Updating, the SDK polls the resource until Succeeded")
	del, err := pips.BeginDelete(ctx, rg, "bare-pip", nil)
	must(err, "publicIPAddresses.delete bare-pip")
	_, err = del.PollUntilDone(ctx, &runtimePoll)
	must(err, "publicIPAddresses.delete bare-pip poll")
}

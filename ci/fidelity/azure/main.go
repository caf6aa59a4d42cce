// Fidelity check of the Azure emulator (testbed/emulators/src/azure.rs): Azure's own Go SDK
// (azure-sdk-for-go: azidentity v1.13.1, azcore v1.21.0, armcompute/v7 v7.3.0,
// armnetwork/v9 v9.0.0) drives every ARM call the Azure provider makes, and the program exits
// non-zero when a reply does not parse or does not mean what ARM means.
//
// Usage: EMULATOR_URL=https://127.0.0.1:PORT go run .
// (ci/fidelity starts the emulator with ci/fidelity/azure/world.yaml and emulator-args, sets
// EMULATOR_URL.) The emulator's certificate is from a throw-away CA; this program checks the
// API, not TLS trust (the provider's own tests trust the CA explicitly), so it skips
// verification.
package main

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"strings"
	"time"

	"github.com/Azure/azure-sdk-for-go/sdk/azcore"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/arm"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/cloud"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/policy"
	"github.com/Azure/azure-sdk-for-go/sdk/azcore/to"
	"github.com/Azure/azure-sdk-for-go/sdk/azidentity"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/compute/armcompute/v7"
	"github.com/Azure/azure-sdk-for-go/sdk/resourcemanager/network/armnetwork/v9"
)

// The emulator's defaults (testbed/emulators/src/azure.rs AzureOptions::default).
const (
	tenant   = "72f988bf-0000-0000-0000-00000000e0a1"
	sub      = "8ecadfc9-0000-0000-0000-00000000abcd"
	clientID = "00000000-0000-0000-0000-0000000c1e47"
	secret   = "azure-emulator-secret"
	rg       = "rg"
	nsgName  = "k8s-nsg"
	cluster  = "kubernetes"
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

// armErr wants an ARM error with this status and code.
func armErr(err error, status int, code, what string) {
	var re *azcore.ResponseError
	if err == nil {
		fail("%s: want %d %s, got success", what, status, code)
	}
	if !errors.As(err, &re) || re.StatusCode != status || re.ErrorCode != code {
		fail("%s: want an ARM error %d %s, got %v", what, status, code, err)
	}
	ok("%s -> %d %s", what, status, code)
}

type transport struct{ c *http.Client }

func (t transport) Do(r *http.Request) (*http.Response, error) { return t.c.Do(r) }

var httpClient = &http.Client{
	Timeout:   30 * time.Second,
	Transport: &http.Transport{TLSClientConfig: &tls.Config{InsecureSkipVerify: true}},
}

func main() {
	base := strings.TrimRight(os.Getenv("EMULATOR_URL"), "/")
	if base == "" {
		fail("EMULATOR_URL is not set")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 240*time.Second)
	defer cancel()
	cfg := cloud.Configuration{
		ActiveDirectoryAuthorityHost: base + "/",
		Services: map[cloud.ServiceName]cloud.ServiceConfiguration{
			cloud.ResourceManager: {Endpoint: base, Audience: "https://management.azure.com"},
		},
	}
	copts := azcore.ClientOptions{
		Cloud:     cfg,
		Transport: transport{httpClient},
		Retry:     policy.RetryOptions{MaxRetries: 3, RetryDelay: 200 * time.Millisecond, MaxRetryDelay: 2 * time.Second},
	}

	// ARM's cloud environments, as upstream cloud-provider-azure reads them from azure.json's
	// resourceManagerEndpoint before it builds any client: a JSON array, the environment named
	// like azure.json's `cloud` (any case), non-empty audiences, the AAD login endpoint.
	envs := armEnvironments(base)
	for _, name := range []string{"AzurePublicCloud", "azurestackcloud", "AzureCloud"} {
		e, found := envs[strings.ToLower(name)]
		if !found || len(e.Authentication.Audiences) == 0 || strings.TrimRight(e.ResourceManager, "/") != base ||
			strings.TrimRight(e.Authentication.LoginEndpoint, "/") != base || e.Suffixes.AcrLoginServer == nil {
			fail("arm.metadata_endpoints: environment %q: %+v", name, e)
		}
	}
	ok("arm.metadata_endpoints (api-version=2019-05-01): %d environments, audiences %v", len(envs), envs["azurepubliccloud"].Authentication.Audiences)
	// Build the cloud configuration from it, as upstream does, and authenticate with AAD
	// instance discovery ON (msal-go asks https://login.microsoftonline.com/common/discovery/instance
	// about an authority it does not know; the transport sends that host to the emulator).
	pub := envs["azurepubliccloud"]
	discovered := cloud.Configuration{
		ActiveDirectoryAuthorityHost: pub.Authentication.LoginEndpoint,
		Services: map[cloud.ServiceName]cloud.ServiceConfiguration{
			cloud.ResourceManager: {Endpoint: pub.ResourceManager, Audience: pub.Authentication.Audiences[0]},
		},
	}
	dopts := copts
	dopts.Cloud = discovered
	dopts.Transport = aadHostTransport{c: httpClient, emulator: base}
	before := counter(base, "aad.instance_discovery")
	dcred, err := azidentity.NewClientSecretCredential(tenant, clientID, secret, &azidentity.ClientSecretCredentialOptions{ClientOptions: dopts})
	must(err, "client secret credential (instance discovery on)")
	dcompute, err := armcompute.NewClientFactory(sub, dcred, &arm.ClientOptions{ClientOptions: dopts})
	must(err, "compute client factory (from ARM metadata)")
	dn := 0
	for p := dcompute.NewVirtualMachinesClient().NewListPager(rg, nil); p.More(); {
		page, err := p.NextPage(ctx)
		must(err, "virtualMachines.list with a credential from instance discovery")
		dn += len(page.Value)
	}
	if dn != 4 || counter(base, "aad.instance_discovery") <= before {
		fail("instance discovery: %d VMs listed, discovery calls %d -> %d", dn, before, counter(base, "aad.instance_discovery"))
	}
	ok("aad.instance_discovery: msal-go discovered the tenant, got a token; ARM listed %d VMs", dn)
	// An authority AAD does not know is refused the AAD way.
	{
		resp, err := httpClient.Get(base + "/common/discovery/instance?api-version=1.1&authorization_endpoint=" +
			url.QueryEscape("https://aad.example.org/"+tenant+"/oauth2/v2.0/authorize"))
		must(err, "instance discovery for an unknown authority")
		var e struct {
			Error      string `json:"error"`
			ErrorCodes []int  `json:"error_codes"`
		}
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 400 || e.Error != "invalid_instance" || len(e.ErrorCodes) == 0 || e.ErrorCodes[0] != 50049 {
			fail("instance discovery for an unknown authority: %d %+v", resp.StatusCode, e)
		}
		ok("aad.instance_discovery: an unknown authority -> 400 invalid_instance (AADSTS50049)")
	}

	// AAD: a wrong secret is refused; the right one gets a token ARM accepts.
	badCred, err := azidentity.NewClientSecretCredential(tenant, clientID, "wrong", &azidentity.ClientSecretCredentialOptions{ClientOptions: copts, DisableInstanceDiscovery: true})
	must(err, "client secret credential")
	if _, err := badCred.GetToken(ctx, policy.TokenRequestOptions{Scopes: []string{"https://management.azure.com/.default"}}); err == nil {
		fail("AAD accepted a wrong client secret")
	} else {
		ok("aad.token: wrong secret refused (%.80s…)", err.Error())
	}
	cred, err := azidentity.NewClientSecretCredential(tenant, clientID, secret, &azidentity.ClientSecretCredentialOptions{ClientOptions: copts, DisableInstanceDiscovery: true})
	must(err, "client secret credential")
	tok, err := cred.GetToken(ctx, policy.TokenRequestOptions{Scopes: []string{"https://management.azure.com/.default"}})
	must(err, "aad.token")
	if tok.Token == "" || time.Until(tok.ExpiresOn) < time.Minute {
		fail("aad.token: empty or short-lived token (expires %v)", tok.ExpiresOn)
	}
	ok("aad.token: client credentials -> bearer token expiring %v", tok.ExpiresOn.Format(time.RFC3339))

	aopts := &arm.ClientOptions{ClientOptions: copts}
	compute, err := armcompute.NewClientFactory(sub, cred, aopts)
	must(err, "compute client factory")
	network, err := armnetwork.NewClientFactory(sub, cred, aopts)
	must(err, "network client factory")

	// ARM without a token: 401 with ARM's error.
	{
		req, _ := http.NewRequest("GET", base+"/subscriptions/"+sub+"/resourceGroups/"+rg+"/providers/Microsoft.Compute/virtualMachines?api-version=2024-07-01", nil)
		resp, err := httpClient.Do(req)
		must(err, "unauthenticated GET")
		var e struct{ Error struct{ Code string } }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 401 || e.Error.Code != "AuthenticationFailed" || resp.Header.Get("WWW-Authenticate") == "" {
			fail("unauthenticated ARM call: want 401 AuthenticationFailed with WWW-Authenticate, got %d %q", resp.StatusCode, e.Error.Code)
		}
		ok("arm: no token -> 401 AuthenticationFailed + WWW-Authenticate")
	}

	// VMs: list by resource group pages through nextLink (page size 2).
	vms := compute.NewVirtualMachinesClient()
	pages, names := 0, []string{}
	for p := vms.NewListPager(rg, nil); p.More(); {
		page, err := p.NextPage(ctx)
		must(err, "virtualMachines.list")
		pages++
		for _, vm := range page.Value {
			names = append(names, str(vm.Name))
		}
	}
	if len(names) != 4 || pages != 2 {
		fail("virtualMachines.list: want 4 VMs on 2 pages, got %v on %d", names, pages)
	}
	ok("compute.virtual_machines.list: %v on %d pages", names, pages)
	all := 0
	for p := vms.NewListAllPager(nil); p.More(); {
		page, err := p.NextPage(ctx)
		must(err, "virtualMachines.listAll")
		all += len(page.Value)
	}
	if all != 4 {
		fail("virtualMachines.listAll: want 4, got %d", all)
	}
	ok("compute.virtual_machines.list_all: %d", all)
	vm0, err := vms.Get(ctx, rg, "vm-0", &armcompute.VirtualMachinesClientGetOptions{Expand: to.Ptr(armcompute.InstanceViewTypesInstanceView)})
	must(err, "virtualMachines.get vm-0")
	if string(*vm0.Properties.HardwareProfile.VMSize) != "Standard_D4s_v3" || len(vm0.Zones) != 1 || *vm0.Zones[0] != "1" || str(vm0.Location) != "eastus" {
		fail("vm-0: size %v zones %v location %v", vm0.Properties.HardwareProfile.VMSize, vm0.Zones, str(vm0.Location))
	}
	power := func(iv *armcompute.VirtualMachineInstanceView) string {
		for _, s := range iv.Statuses {
			if strings.HasPrefix(str(s.Code), "PowerState/") {
				return str(s.Code)
			}
		}
		return ""
	}
	if power(vm0.Properties.InstanceView) != "PowerState/running" || str(vm0.Properties.OSProfile.ComputerName) != "vm-0" {
		fail("vm-0 instance view: %q, computer name %q", power(vm0.Properties.InstanceView), str(vm0.Properties.OSProfile.ComputerName))
	}
	ok("compute.virtual_machines.get vm-0 ($expand=instanceView): %s zone %s %s", *vm0.Properties.HardwareProfile.VMSize, *vm0.Zones[0], power(vm0.Properties.InstanceView))
	iv, err := vms.InstanceView(ctx, rg, "vm-2", nil)
	must(err, "virtualMachines.instanceView vm-2")
	if iv.PlatformFaultDomain == nil || *iv.PlatformFaultDomain != 1 || power(&iv.VirtualMachineInstanceView) != "PowerState/stopped" {
		fail("vm-2 instance view: fault domain %v power %q", iv.PlatformFaultDomain, power(&iv.VirtualMachineInstanceView))
	}
	ok("compute.virtual_machines.instance_view vm-2: fault domain 1, PowerState/stopped")
	vm3, err := vms.Get(ctx, rg, "vm-3", &armcompute.VirtualMachinesClientGetOptions{Expand: to.Ptr(armcompute.InstanceViewTypesInstanceView)})
	must(err, "virtualMachines.get vm-3")
	if power(vm3.Properties.InstanceView) != "PowerState/deallocated" {
		fail("vm-3: want deallocated, got %q", power(vm3.Properties.InstanceView))
	}
	ok("compute.virtual_machines.get vm-3: PowerState/deallocated")
	_, err = vms.Get(ctx, rg, "no-such-vm", nil)
	armErr(err, 404, "ResourceNotFound", "compute.virtual_machines.get missing VM")

	// NICs and public IPs of a VM.
	nics := network.NewInterfacesClient()
	nicID := *vm0.Properties.NetworkProfile.NetworkInterfaces[0].ID
	nicName := nicID[strings.LastIndex(nicID, "/")+1:]
	nic, err := nics.Get(ctx, rg, nicName, nil)
	must(err, "networkInterfaces.get")
	ipc := nic.Properties.IPConfigurations[0]
	if str(ipc.Properties.PrivateIPAddress) != "10.240.0.4" || ipc.Properties.PublicIPAddress == nil || !*ipc.Properties.Primary {
		fail("vm-0 NIC: %+v", ipc.Properties)
	}
	ok("network.network_interfaces.get %s: primary %s", nicName, *ipc.Properties.PrivateIPAddress)
	pips := network.NewPublicIPAddressesClient()
	pipID := *ipc.Properties.PublicIPAddress.ID
	vmPip, err := pips.Get(ctx, rg, pipID[strings.LastIndex(pipID, "/")+1:], nil)
	must(err, "publicIPAddresses.get")
	if str(vmPip.Properties.IPAddress) != "20.0.0.4" {
		fail("vm-0 public IP: %v", str(vmPip.Properties.IPAddress))
	}
	ok("network.public_ip_addresses.get: %s", *vmPip.Properties.IPAddress)
	nic1, err := nics.Get(ctx, rg, "vm-1-nic", nil)
	must(err, "networkInterfaces.get vm-1-nic")
	v6 := ""
	for _, c := range nic1.Properties.IPConfigurations {
		if c.Properties.PrivateIPAddressVersion != nil && *c.Properties.PrivateIPAddressVersion == armnetwork.IPVersionIPv6 {
			v6 = str(c.Properties.PrivateIPAddress)
		}
	}
	if v6 != "fd00::5" {
		fail("vm-1 NIC: want IPv6 fd00::5, got %q", v6)
	}
	ok("network.network_interfaces.get vm-1-nic: IPv6 %s", v6)

	// Scale sets.
	sets := compute.NewVirtualMachineScaleSetsClient()
	ss, err := sets.Get(ctx, rg, "pool", nil)
	must(err, "virtualMachineScaleSets.get")
	if ss.Properties.OrchestrationMode == nil || *ss.Properties.OrchestrationMode != armcompute.OrchestrationModeUniform {
		fail("pool: orchestration mode %v", ss.Properties.OrchestrationMode)
	}
	ok("compute.virtual_machine_scale_sets.get pool: Uniform, capacity %d", *ss.SKU.Capacity)
	nsets := 0
	for p := sets.NewListPager(rg, nil); p.More(); {
		page, err := p.NextPage(ctx)
		must(err, "virtualMachineScaleSets.list")
		nsets += len(page.Value)
	}
	if nsets != 1 {
		fail("virtualMachineScaleSets.list: %d", nsets)
	}
	ok("compute.virtual_machine_scale_sets.list: %d", nsets)
	ssvms := compute.NewVirtualMachineScaleSetVMsClient()
	computerNames := []string{}
	for p := ssvms.NewListPager(rg, "pool", &armcompute.VirtualMachineScaleSetVMsClientListOptions{Expand: to.Ptr("instanceView")}); p.More(); {
		page, err := p.NextPage(ctx)
		must(err, "virtualMachineScaleSetVMs.list")
		for _, v := range page.Value {
			if v.Properties.InstanceView == nil || len(v.Properties.InstanceView.Statuses) == 0 {
				fail("scale-set VM %s without instance view", str(v.Name))
			}
			computerNames = append(computerNames, str(v.Properties.OSProfile.ComputerName)+"/"+str(v.InstanceID)+"/"+str(v.SKU.Name))
		}
	}
	if len(computerNames) != 3 || !strings.HasPrefix(computerNames[0], "pool000000/0/") ||
		!strings.HasPrefix(computerNames[1], "pool000001/1/") || !strings.HasPrefix(computerNames[2], "pool00000a/10/") {
		fail("virtualMachineScaleSetVMs.list: want computer names prefix + 6 base-36 digits of the instance ID, got %v", computerNames)
	}
	ok("compute.virtual_machine_scale_set_vms.list ($expand=instanceView, paged): %v", computerNames)
	ssvm, err := ssvms.Get(ctx, rg, "pool", "1", nil)
	must(err, "virtualMachineScaleSetVMs.get")
	if !strings.HasSuffix(str(ssvm.ID), "/virtualMachineScaleSets/pool/virtualMachines/1") || len(ssvm.Zones) != 1 {
		fail("pool/1: id %s zones %v", str(ssvm.ID), ssvm.Zones)
	}
	ok("compute.virtual_machine_scale_set_vms.get pool/1: %s", *ssvm.ID)
	ssiv, err := ssvms.GetInstanceView(ctx, rg, "pool", "1", nil)
	must(err, "virtualMachineScaleSetVMs.getInstanceView")
	if len(ssiv.Statuses) != 2 {
		fail("pool/1 instance view: %d statuses", len(ssiv.Statuses))
	}
	ok("compute.virtual_machine_scale_set_vms.instance_view pool/1")

	// The provider's batched node lookups: VMs of a resource group with their instance views
	// (upstream ListVMInstanceView), and a scale set's NICs (Microsoft.Compute path, network
	// API version 2018-10-01): all of the set's, one VM's, one NIC.
	ivs := 0
	for p := vms.NewListPager(rg, &armcompute.VirtualMachinesClientListOptions{Expand: to.Ptr(armcompute.ExpandTypeForListVMsInstanceView)}); p.More(); {
		page, err := p.NextPage(ctx)
		must(err, "virtualMachines.list ($expand=instanceView)")
		for _, vm := range page.Value {
			if vm.Properties.InstanceView == nil || power(vm.Properties.InstanceView) == "" {
				fail("virtualMachines.list ($expand=instanceView): %s without power state", str(vm.Name))
			}
			ivs++
		}
	}
	if ivs != 4 {
		fail("virtualMachines.list ($expand=instanceView): want 4 VMs, got %d", ivs)
	}
	ok("compute.virtual_machines.list ($expand=instanceView): %d with power states", ivs)
	ssNics := []string{}
	for p := nics.NewListVirtualMachineScaleSetNetworkInterfacesPager(rg, "pool", nil); p.More(); {
		page, err := p.NextPage(ctx)
		must(err, "networkInterfaces.listVirtualMachineScaleSetNetworkInterfaces")
		for _, n := range page.Value {
			if n.Properties == nil || n.Properties.VirtualMachine == nil || len(n.Properties.IPConfigurations) == 0 {
				fail("scale-set NIC %s: no VM or IP configurations", str(n.ID))
			}
			c := n.Properties.IPConfigurations[0]
			if c.Properties.PrivateIPAddress == nil || c.Properties.Primary == nil || !*c.Properties.Primary {
				fail("scale-set NIC %s: primary IP configuration %+v", str(n.ID), c.Properties)
			}
			ssNics = append(ssNics, str(n.Properties.VirtualMachine.ID)[strings.LastIndex(str(n.Properties.VirtualMachine.ID), "/")+1:]+"="+str(c.Properties.PrivateIPAddress))
		}
	}
	if len(ssNics) != 3 {
		fail("networkInterfaces.listVirtualMachineScaleSetNetworkInterfaces: %v", ssNics)
	}
	ok("network.network_interfaces.list_virtual_machine_scale_set_network_interfaces pool: %v", ssNics)
	vmNics := 0
	for p := nics.NewListVirtualMachineScaleSetVMNetworkInterfacesPager(rg, "pool", "1", nil); p.More(); {
		page, err := p.NextPage(ctx)
		must(err, "networkInterfaces.listVirtualMachineScaleSetVMNetworkInterfaces")
		vmNics += len(page.Value)
	}
	if vmNics != 1 {
		fail("networkInterfaces.listVirtualMachineScaleSetVMNetworkInterfaces pool/1: %d", vmNics)
	}
	ssNicID := *ssvm.Properties.NetworkProfile.NetworkInterfaces[0].ID
	ssNic, err := nics.GetVirtualMachineScaleSetNetworkInterface(ctx, rg, "pool", "1", ssNicID[strings.LastIndex(ssNicID, "/")+1:], nil)
	must(err, "networkInterfaces.getVirtualMachineScaleSetNetworkInterface")
	if !strings.EqualFold(str(ssNic.ID), ssNicID) {
		fail("scale-set NIC: want %s, got %s", ssNicID, str(ssNic.ID))
	}
	ok("network.network_interfaces.{list_virtual_machine_scale_set_vm_network_interfaces,get_virtual_machine_scale_set_network_interface} pool/1: %s", *ssNic.ID)
	// Private link services: an empty list in a resource group and in the subscription.
	plsClient := network.NewPrivateLinkServicesClient()
	npls := 0
	for p := plsClient.NewListPager(rg, nil); p.More(); {
		page, err := p.NextPage(ctx)
		must(err, "privateLinkServices.list")
		npls += len(page.Value)
	}
	for p := plsClient.NewListBySubscriptionPager(nil); p.More(); {
		page, err := p.NextPage(ctx)
		must(err, "privateLinkServices.listBySubscription")
		npls += len(page.Value)
	}
	if npls != 0 {
		fail("privateLinkServices: want none, got %d", npls)
	}
	ok("network.private_link_services.{list,list_all}: {\"value\":[]}")
	_, err = nics.GetVirtualMachineScaleSetNetworkInterface(ctx, rg, "pool", "1", "no-such-nic", nil)
	armErr(err, 404, "ResourceNotFound", "getVirtualMachineScaleSetNetworkInterface missing NIC")

	// Subnet, NSG, route table.
	subnets := network.NewSubnetsClient()
	sn, err := subnets.Get(ctx, rg, "vnet", "subnet", nil)
	must(err, "subnets.get")
	if str(sn.Properties.AddressPrefix) != "10.240.0.0/16" {
		fail("subnet prefix %v", str(sn.Properties.AddressPrefix))
	}
	ok("network.subnets.get: %s", *sn.Properties.AddressPrefix)
	_, err = subnets.Get(ctx, rg, "vnet", "nope", nil)
	armErr(err, 404, "NotFound", "network.subnets.get missing subnet")

	// Public IP for a Service: PUT is a long-running operation; the address is allocated.
	svcPip := cluster + "-a0123456789abcdef0123456789abcde"
	poller, err := pips.BeginCreateOrUpdate(ctx, rg, svcPip, armnetwork.PublicIPAddress{
		Location: to.Ptr("eastus"),
		SKU:      &armnetwork.PublicIPAddressSKU{Name: to.Ptr(armnetwork.PublicIPAddressSKUNameStandard)},
		Tags:     map[string]*string{"k8s-azure-service": to.Ptr("default/web"), "k8s-azure-cluster-name": to.Ptr(cluster)},
		Properties: &armnetwork.PublicIPAddressPropertiesFormat{
			PublicIPAllocationMethod: to.Ptr(armnetwork.IPAllocationMethodStatic),
			PublicIPAddressVersion:   to.Ptr(armnetwork.IPVersionIPv4),
		},
	}, nil)
	must(err, "publicIPAddresses.createOrUpdate")
	pipRes, err := poller.PollUntilDone(ctx, &runtimePoll)
	must(err, "publicIPAddresses.createOrUpdate poll")
	if str(pipRes.Properties.IPAddress) == "" || *pipRes.Properties.ProvisioningState != armnetwork.ProvisioningStateSucceeded {
		fail("service public IP: %+v", pipRes.Properties)
	}
	ok("network.public_ip_addresses.create_or_update (LRO): %s %s", *pipRes.Properties.IPAddress, *pipRes.Properties.ProvisioningState)
	if pipRes.SKU == nil || pipRes.SKU.Tier == nil || *pipRes.SKU.Tier != armnetwork.PublicIPAddressSKUTierRegional {
		fail("a public IP created with sku {name: Standard}: want tier Regional, got %+v", pipRes.SKU)
	}
	ok("network.public_ip_addresses: sku.tier defaults to Regional")

	// Load balancer: a rule that names a missing probe is refused.
	lbs := network.NewLoadBalancersClient()
	lbID := fmt.Sprintf("/subscriptions/%s/resourceGroups/%s/providers/Microsoft.Network/loadBalancers/%s", sub, rg, cluster)
	fe := "a0123456789abcdef0123456789abcde"
	lb := armnetwork.LoadBalancer{
		Location: to.Ptr("eastus"),
		SKU:      &armnetwork.LoadBalancerSKU{Name: to.Ptr(armnetwork.LoadBalancerSKUNameStandard)},
		Properties: &armnetwork.LoadBalancerPropertiesFormat{
			FrontendIPConfigurations: []*armnetwork.FrontendIPConfiguration{{
				Name:       to.Ptr(fe),
				Properties: &armnetwork.FrontendIPConfigurationPropertiesFormat{PublicIPAddress: &armnetwork.PublicIPAddress{ID: pipRes.ID}},
			}},
			BackendAddressPools: []*armnetwork.BackendAddressPool{{Name: to.Ptr(cluster)}},
			LoadBalancingRules: []*armnetwork.LoadBalancingRule{{
				Name: to.Ptr(fe + "-TCP-80"),
				Properties: &armnetwork.LoadBalancingRulePropertiesFormat{
					Protocol:                to.Ptr(armnetwork.TransportProtocolTCP),
					FrontendPort:            to.Ptr[int32](80),
					BackendPort:             to.Ptr[int32](80),
					EnableFloatingIP:        to.Ptr(true),
					IdleTimeoutInMinutes:    to.Ptr[int32](4),
					EnableTCPReset:          to.Ptr(true),
					FrontendIPConfiguration: &armnetwork.SubResource{ID: to.Ptr(lbID + "/frontendIPConfigurations/" + fe)},
					BackendAddressPool:      &armnetwork.SubResource{ID: to.Ptr(lbID + "/backendAddressPools/" + cluster)},
					Probe:                   &armnetwork.SubResource{ID: to.Ptr(lbID + "/probes/" + fe + "-TCP-80")},
				},
			}},
		},
	}
	_, err = lbs.BeginCreateOrUpdate(ctx, rg, cluster, lb, nil)
	armErr(err, 400, "InvalidResourceReference", "network.load_balancers.create_or_update rule naming a missing probe")
	lb.Properties.Probes = []*armnetwork.Probe{{
		Name: to.Ptr(fe + "-TCP-80"),
		Properties: &armnetwork.ProbePropertiesFormat{
			Protocol: to.Ptr(armnetwork.ProbeProtocolTCP), Port: to.Ptr[int32](30080),
			IntervalInSeconds: to.Ptr[int32](5), ProbeThreshold: to.Ptr[int32](2),
		},
	}}
	lbPoller, err := lbs.BeginCreateOrUpdate(ctx, rg, cluster, lb, nil)
	must(err, "loadBalancers.createOrUpdate")
	lbRes, err := lbPoller.PollUntilDone(ctx, &runtimePoll)
	must(err, "loadBalancers.createOrUpdate poll")
	if *lbRes.Properties.ProvisioningState != armnetwork.ProvisioningStateSucceeded || lbRes.Etag == nil ||
		str(lbRes.Properties.LoadBalancingRules[0].Properties.Probe.ID) != lbID+"/probes/"+fe+"-TCP-80" ||
		str(lbRes.Properties.BackendAddressPools[0].ID) != lbID+"/backendAddressPools/"+cluster {
		fail("load balancer after create: %+v", lbRes.Properties)
	}
	ok("network.load_balancers.create_or_update (LRO): frontend, pool, probe, rule; etag %s", *lbRes.Etag)
	if lbRes.SKU == nil || lbRes.SKU.Tier == nil || *lbRes.SKU.Tier != armnetwork.LoadBalancerSKUTierRegional {
		fail("a load balancer created with sku {name: Standard}: want tier Regional, got %+v", lbRes.SKU)
	}
	ok("network.load_balancers: sku.tier defaults to Regional")
	// A stale ETag is a 412.
	stale := "W/\"00000000-0000-0000-0000-000000000000\""
	_, err = lbs.BeginCreateOrUpdate(policy.WithHTTPHeader(ctx, http.Header{"If-Match": {stale}}), rg, cluster, lbRes.LoadBalancer, nil)
	armErr(err, 412, "PreconditionFailed", "network.load_balancers.create_or_update with a stale If-Match")
	nlb := 0
	for p := lbs.NewListPager(rg, nil); p.More(); {
		page, err := p.NextPage(ctx)
		must(err, "loadBalancers.list")
		nlb += len(page.Value)
	}
	if nlb != 1 {
		fail("loadBalancers.list: %d", nlb)
	}
	ok("network.load_balancers.list: %d", nlb)

	// Backend membership through the NIC's ipConfiguration (VMAS), with the NIC's ETag.
	poolID := lbID + "/backendAddressPools/" + cluster
	nic.Properties.IPConfigurations[0].Properties.LoadBalancerBackendAddressPools = []*armnetwork.BackendAddressPool{{ID: to.Ptr(poolID)}}
	nicPoller, err := nics.BeginCreateOrUpdate(policy.WithHTTPHeader(ctx, http.Header{"If-Match": {str(nic.Etag)}}), rg, nicName, nic.Interface, nil)
	must(err, "networkInterfaces.createOrUpdate")
	_, err = nicPoller.PollUntilDone(ctx, &runtimePoll)
	must(err, "networkInterfaces.createOrUpdate poll")
	ok("network.network_interfaces.create_or_update (LRO, If-Match): pool membership")
	// ... and through a scale-set VM's network profile.
	ssvm.Properties.NetworkProfileConfiguration.NetworkInterfaceConfigurations[0].Properties.IPConfigurations[0].Properties.LoadBalancerBackendAddressPools = []*armcompute.SubResource{{ID: to.Ptr(poolID)}}
	ssPoller, err := ssvms.BeginUpdate(ctx, rg, "pool", "1", ssvm.VirtualMachineScaleSetVM, nil)
	must(err, "virtualMachineScaleSetVMs.update")
	_, err = ssPoller.PollUntilDone(ctx, &runtimePoll)
	must(err, "virtualMachineScaleSetVMs.update poll")
	ok("compute.virtual_machine_scale_set_vms.update (LRO): pool membership")
	// ... and in the scale set's model, so instances it adds later join (upstream's ensureVMSSInPool).
	ssModel, err := sets.Get(ctx, rg, "pool", nil)
	must(err, "virtualMachineScaleSets.get")
	ssModel.Properties.VirtualMachineProfile.NetworkProfile.NetworkInterfaceConfigurations[0].Properties.IPConfigurations[0].Properties.LoadBalancerBackendAddressPools = []*armcompute.SubResource{{ID: to.Ptr(poolID)}}
	ssModelPoller, err := sets.BeginCreateOrUpdate(ctx, rg, "pool", ssModel.VirtualMachineScaleSet, nil)
	must(err, "virtualMachineScaleSets.createOrUpdate")
	_, err = ssModelPoller.PollUntilDone(ctx, &runtimePoll)
	must(err, "virtualMachineScaleSets.createOrUpdate poll")
	ok("compute.virtual_machine_scale_sets.create_or_update (LRO): pool in the model")
	// Compute's PUT keeps what the body omits and ignores read-only properties: upstream
	// cloud-provider-azure puts a scale-set VM with only its location, hardware profile and
	// network profile configuration; its networkProfile, osProfile, zones and vmId stay.
	vm10, err := ssvms.Get(ctx, rg, "pool", "10", nil)
	must(err, "virtualMachineScaleSetVMs.get pool/10")
	partialVM := func(pools []*armcompute.SubResource) armcompute.VirtualMachineScaleSetVM {
		cfg := vm10.Properties.NetworkProfileConfiguration
		cfg.NetworkInterfaceConfigurations[0].Properties.IPConfigurations[0].Properties.LoadBalancerBackendAddressPools = pools
		return armcompute.VirtualMachineScaleSetVM{Location: vm10.Location, Properties: &armcompute.VirtualMachineScaleSetVMProperties{
			HardwareProfile: vm10.Properties.HardwareProfile, NetworkProfileConfiguration: cfg}}
	}
	vm10Poller, err := ssvms.BeginUpdate(ctx, rg, "pool", "10", partialVM([]*armcompute.SubResource{{ID: to.Ptr(poolID)}}), nil)
	must(err, "virtualMachineScaleSetVMs.update pool/10 (partial body)")
	_, err = vm10Poller.PollUntilDone(ctx, &runtimePoll)
	must(err, "virtualMachineScaleSetVMs.update pool/10 (partial body) poll")
	vm10After, err := ssvms.Get(ctx, rg, "pool", "10", nil)
	must(err, "virtualMachineScaleSetVMs.get pool/10")
	if vm10After.Properties.NetworkProfile == nil || len(vm10After.Properties.NetworkProfile.NetworkInterfaces) != 1 ||
		str(vm10After.Properties.NetworkProfile.NetworkInterfaces[0].ID) != str(vm10.Properties.NetworkProfile.NetworkInterfaces[0].ID) ||
		vm10After.Properties.OSProfile == nil || str(vm10After.Properties.OSProfile.ComputerName) != "pool00000a" ||
		len(vm10After.Zones) != 1 || str(vm10After.Properties.VMID) != str(vm10.Properties.VMID) || str(vm10After.InstanceID) != "10" {
		fail("a scale-set VM after a partial PUT lost what the body omitted: %+v", vm10After.Properties)
	}
	ok("compute.virtual_machine_scale_set_vms.update (partial body): networkProfile, osProfile, zones, vmId kept")
	got, err := lbs.Get(ctx, rg, cluster, nil)
	must(err, "loadBalancers.get")
	members := got.Properties.BackendAddressPools[0].Properties.BackendIPConfigurations
	if len(members) != 3 {
		fail("backend pool: want 3 backendIPConfigurations (NIC + two scale-set VMs), got %d", len(members))
	}
	ssMember := false
	for _, m := range members {
		if strings.HasSuffix(str(m.ID), "/virtualMachineScaleSets/pool/virtualMachines/1/networkInterfaces/pool/ipConfigurations/ipconfig1") {
			ssMember = true
		}
	}
	if !ssMember {
		fail("backend pool: no scale-set VM IP configuration <vm>/networkInterfaces/<nic config>/ipConfigurations/<ip config> among %d", len(members))
	}
	ok("network.load_balancers.get: pool has %d backendIPConfigurations", len(members))
	pipRead, err := pips.Get(ctx, rg, svcPip, nil)
	must(err, "publicIPAddresses.get service PIP")
	if pipRead.Properties.IPConfiguration == nil || !strings.HasSuffix(str(pipRead.Properties.IPConfiguration.ID), "/frontendIPConfigurations/"+fe) {
		fail("service PIP ipConfiguration: %v", pipRead.Properties.IPConfiguration)
	}
	ok("network.public_ip_addresses.get: ipConfiguration -> the frontend")
	// The load balancer lists a resource group's public IPs (release, loadBalancerIP lookup).
	npip, svcListed := 0, false
	for p := pips.NewListPager(rg, nil); p.More(); {
		page, err := p.NextPage(ctx)
		must(err, "publicIPAddresses.list")
		for _, x := range page.Value {
			if str(x.Name) == svcPip && str(x.Properties.IPAddress) == str(pipRes.Properties.IPAddress) {
				svcListed = true
			}
		}
		npip += len(page.Value)
	}
	if !svcListed {
		fail("publicIPAddresses.list: %d, without the service PIP %s", npip, svcPip)
	}
	ok("network.public_ip_addresses.list: %d", npip)

	// ARM's behavioural rules for load balancers, public IPs and api-versions (rules.go).
	checkRules(ctx, base, tok.Token, network, *pipRes.ID)
	checkFailedOperations(ctx, base, network)

	// Deleting the public IP while the frontend uses it, or the LB while its pool is used, fails.
	_, err = pips.BeginDelete(ctx, rg, svcPip, nil)
	armErr(err, 400, "PublicIPAddressCannotBeDeleted", "network.public_ip_addresses.delete in use")
	_, err = lbs.BeginDelete(ctx, rg, cluster, nil)
	armErr(err, 400, "InUseBackendAddressPoolCannotBeDeleted", "network.load_balancers.delete with a used pool")

	// NSG: rules with priorities; a duplicate priority is refused.
	nsgs := network.NewSecurityGroupsClient()
	nsg, err := nsgs.Get(ctx, rg, nsgName, nil)
	must(err, "securityGroups.get")
	if len(nsg.Properties.DefaultSecurityRules) == 0 {
		fail("NSG without default rules")
	}
	rule := func(name string, prio int32) *armnetwork.SecurityRule {
		return &armnetwork.SecurityRule{Name: to.Ptr(name), Properties: &armnetwork.SecurityRulePropertiesFormat{
			Protocol: to.Ptr(armnetwork.SecurityRuleProtocolTCP), Access: to.Ptr(armnetwork.SecurityRuleAccessAllow),
			Direction: to.Ptr(armnetwork.SecurityRuleDirectionInbound), Priority: to.Ptr(prio),
			SourceAddressPrefix: to.Ptr("Internet"), SourcePortRange: to.Ptr("*"),
			DestinationAddressPrefixes: []*string{pipRes.Properties.IPAddress}, DestinationPortRanges: []*string{to.Ptr("80")},
		}}
	}
	nsg.Properties.SecurityRules = []*armnetwork.SecurityRule{rule("k8s-azure-lb_allow_IPv4_a", 500), rule("k8s-azure-lb_allow_IPv4_b", 500)}
	_, err = nsgs.BeginCreateOrUpdate(ctx, rg, nsgName, nsg.SecurityGroup, nil)
	armErr(err, 400, "SecurityRuleConflict", "network.network_security_groups.create_or_update duplicate priority")
	nsg.Properties.SecurityRules = nsg.Properties.SecurityRules[:1]
	nsgPoller, err := nsgs.BeginCreateOrUpdate(ctx, rg, nsgName, nsg.SecurityGroup, nil)
	must(err, "securityGroups.createOrUpdate")
	nsgRes, err := nsgPoller.PollUntilDone(ctx, &runtimePoll)
	must(err, "securityGroups.createOrUpdate poll")
	if len(nsgRes.Properties.SecurityRules) != 1 || str(nsgRes.Properties.SecurityRules[0].ID) == "" {
		fail("NSG rules after update: %v", nsgRes.Properties.SecurityRules)
	}
	ok("network.network_security_groups.create_or_update (LRO): %s", *nsgRes.Properties.SecurityRules[0].Name)

	// Route table: absent at first, created with routes in one PUT.
	rts := network.NewRouteTablesClient()
	_, err = rts.Get(ctx, rg, cluster+"-routetable", nil)
	armErr(err, 404, "ResourceNotFound", "network.route_tables.get absent table")
	rtPoller, err := rts.BeginCreateOrUpdate(ctx, rg, cluster+"-routetable", armnetwork.RouteTable{
		Location: to.Ptr("eastus"),
		Properties: &armnetwork.RouteTablePropertiesFormat{Routes: []*armnetwork.Route{
			{Name: to.Ptr("vm-0"), Properties: &armnetwork.RoutePropertiesFormat{AddressPrefix: to.Ptr("10.244.0.0/24"), NextHopType: to.Ptr(armnetwork.RouteNextHopTypeVirtualAppliance), NextHopIPAddress: to.Ptr("10.240.0.4")}},
			{Name: to.Ptr("vm-1____fd00--200--64"), Properties: &armnetwork.RoutePropertiesFormat{AddressPrefix: to.Ptr("fd00::200/120"), NextHopType: to.Ptr(armnetwork.RouteNextHopTypeVirtualAppliance), NextHopIPAddress: to.Ptr("fd00::5")}},
		}},
	}, nil)
	must(err, "routeTables.createOrUpdate")
	rt, err := rtPoller.PollUntilDone(ctx, &runtimePoll)
	must(err, "routeTables.createOrUpdate poll")
	if len(rt.Properties.Routes) != 2 {
		fail("route table: %d routes", len(rt.Properties.Routes))
	}
	ok("network.route_tables.create_or_update (LRO): %d routes", len(rt.Properties.Routes))
	// A second PUT of a Network resource while the first runs: ARM cancels the first (its
	// operation ends Canceled, CanceledAndSupersededDueToAnotherOperation) and the second
	// proceeds.
	firstPut, err := rts.BeginCreateOrUpdate(ctx, rg, cluster+"-routetable", rt.RouteTable, nil)
	must(err, "routeTables.createOrUpdate (first)")
	secondPut, err := rts.BeginCreateOrUpdate(ctx, rg, cluster+"-routetable", rt.RouteTable, nil)
	must(err, "routeTables.createOrUpdate while another PUT runs")
	_, err = firstPut.PollUntilDone(ctx, &runtimePoll)
	var canceled *azcore.ResponseError
	if !errors.As(err, &canceled) || canceled.ErrorCode != "CanceledAndSupersededDueToAnotherOperation" {
		fail("the superseded PUT: want its operation Canceled with CanceledAndSupersededDueToAnotherOperation, got %v", err)
	}
	_, err = secondPut.PollUntilDone(ctx, &runtimePoll)
	must(err, "the superseding PUT")
	ok("network.route_tables.create_or_update twice: the first Canceled (CanceledAndSupersededDueToAnotherOperation), the second Succeeded")

	// Take the pool members out, then delete the load balancer and the public IP (LRO).
	nic2, err := nics.Get(ctx, rg, nicName, nil)
	must(err, "networkInterfaces.get")
	nic2.Properties.IPConfigurations[0].Properties.LoadBalancerBackendAddressPools = nil
	nicPoller, err = nics.BeginCreateOrUpdate(ctx, rg, nicName, nic2.Interface, nil)
	must(err, "networkInterfaces.createOrUpdate (remove)")
	_, err = nicPoller.PollUntilDone(ctx, &runtimePoll)
	must(err, "networkInterfaces.createOrUpdate (remove) poll")
	ssvm2, err := ssvms.Get(ctx, rg, "pool", "1", nil)
	must(err, "virtualMachineScaleSetVMs.get")
	ssvm2.Properties.NetworkProfileConfiguration.NetworkInterfaceConfigurations[0].Properties.IPConfigurations[0].Properties.LoadBalancerBackendAddressPools = nil
	ssPoller, err = ssvms.BeginUpdate(ctx, rg, "pool", "1", ssvm2.VirtualMachineScaleSetVM, nil)
	must(err, "virtualMachineScaleSetVMs.update (remove)")
	_, err = ssPoller.PollUntilDone(ctx, &runtimePoll)
	must(err, "virtualMachineScaleSetVMs.update (remove) poll")
	vm10Poller, err = ssvms.BeginUpdate(ctx, rg, "pool", "10", partialVM(nil), nil)
	must(err, "virtualMachineScaleSetVMs.update pool/10 (partial body, remove)")
	_, err = vm10Poller.PollUntilDone(ctx, &runtimePoll)
	must(err, "virtualMachineScaleSetVMs.update pool/10 (partial body, remove) poll")
	// The scale set's model, with upstream's partial body (location and the network profile
	// only): its SKU, orchestration mode and OS profile stay.
	ssModel2, err := sets.Get(ctx, rg, "pool", nil)
	must(err, "virtualMachineScaleSets.get")
	ssNet := ssModel2.Properties.VirtualMachineProfile.NetworkProfile
	ssNet.NetworkInterfaceConfigurations[0].Properties.IPConfigurations[0].Properties.LoadBalancerBackendAddressPools = nil
	ssModelPoller, err = sets.BeginCreateOrUpdate(ctx, rg, "pool", armcompute.VirtualMachineScaleSet{Location: ssModel2.Location,
		Properties: &armcompute.VirtualMachineScaleSetProperties{VirtualMachineProfile: &armcompute.VirtualMachineScaleSetVMProfile{NetworkProfile: ssNet}}}, nil)
	must(err, "virtualMachineScaleSets.createOrUpdate (partial body, remove)")
	_, err = ssModelPoller.PollUntilDone(ctx, &runtimePoll)
	must(err, "virtualMachineScaleSets.createOrUpdate (partial body, remove) poll")
	ssModel3, err := sets.Get(ctx, rg, "pool", nil)
	must(err, "virtualMachineScaleSets.get")
	if ssModel3.SKU == nil || ssModel3.SKU.Capacity == nil || *ssModel3.SKU.Capacity != 3 || ssModel3.Properties.OrchestrationMode == nil ||
		ssModel3.Properties.VirtualMachineProfile.OSProfile == nil || str(ssModel3.Properties.VirtualMachineProfile.OSProfile.ComputerNamePrefix) != "pool" ||
		ssModel3.Properties.VirtualMachineProfile.NetworkProfile.NetworkInterfaceConfigurations[0].Properties.IPConfigurations[0].Properties.LoadBalancerBackendAddressPools != nil {
		fail("a scale set after a partial PUT: sku %+v, properties %+v", ssModel3.SKU, ssModel3.Properties)
	}
	ok("compute.virtual_machine_scale_sets.create_or_update (partial body): sku, orchestration mode, OS profile kept; pool out of the model")
	delPoller, err := lbs.BeginDelete(ctx, rg, cluster, nil)
	must(err, "loadBalancers.delete (every member left with partial bodies)")
	_, err = delPoller.PollUntilDone(ctx, &runtimePoll)
	must(err, "loadBalancers.delete poll")
	_, err = lbs.Get(ctx, rg, cluster, nil)
	armErr(err, 404, "ResourceNotFound", "network.load_balancers.delete (LRO), then get")
	pdel, err := pips.BeginDelete(ctx, rg, svcPip, nil)
	must(err, "publicIPAddresses.delete")
	_, err = pdel.PollUntilDone(ctx, &runtimePoll)
	must(err, "publicIPAddresses.delete poll")
	_, err = pips.Get(ctx, rg, svcPip, nil)
	armErr(err, 404, "ResourceNotFound", "network.public_ip_addresses.delete (LRO), then get")

	// Throttling: a 429 with Retry-After is retried by the SDK's retry policy.
	admin(base, `{"match":"network.route_tables.get","fault":{"kind":"throttle","retry_after_secs":1},"times":1}`)
	start := time.Now()
	_, err = rts.Get(ctx, rg, cluster+"-routetable", nil)
	must(err, "routeTables.get after one throttle")
	ok("network.route_tables.get: one 429 + Retry-After retried (%.1fs)", time.Since(start).Seconds())
	// A missing api-version is refused the ARM way.
	{
		req, _ := http.NewRequest("GET", base+"/subscriptions/"+sub+"/resourceGroups/"+rg+"/providers/Microsoft.Network/routeTables/x", nil)
		req.Header.Set("Authorization", "Bearer "+tok.Token)
		resp, err := httpClient.Do(req)
		must(err, "GET without api-version")
		var e struct{ Error struct{ Code string } }
		_ = json.NewDecoder(resp.Body).Decode(&e)
		resp.Body.Close()
		if resp.StatusCode != 400 || e.Error.Code != "MissingApiVersionParameter" {
			fail("no api-version: %d %q", resp.StatusCode, e.Error.Code)
		}
		ok("arm: no api-version -> 400 MissingApiVersionParameter")
	}

	// IMDS: instance, load balancer, managed-identity token (Metadata: true required).
	imds := func(path string, meta bool) (int, []byte) {
		req, _ := http.NewRequest("GET", base+path, nil)
		if meta {
			req.Header.Set("Metadata", "true")
		}
		resp, err := httpClient.Do(req)
		must(err, "IMDS "+path)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		return resp.StatusCode, b
	}
	if code, _ := imds("/metadata/instance?api-version=2021-10-01", false); code != 400 {
		fail("IMDS without Metadata header: %d", code)
	}
	ok("imds.instance without Metadata: true -> 400")
	code, body := imds("/metadata/instance?api-version=2021-10-01&format=json", true)
	var inst struct {
		Compute struct {
			Name, Location, VMSize, Zone, ResourceGroupName, SubscriptionID, VMScaleSetName, ResourceID string
			PlatformFaultDomain                                                                         string
		}
		Network struct {
			Interface []struct {
				IPv4 struct {
					IPAddress []struct{ PrivateIPAddress, PublicIPAddress string }
				}
				MacAddress string
			}
		}
	}
	if code != 200 || json.Unmarshal(body, &inst) != nil || inst.Compute.Name != "vm-0" || inst.Compute.Zone != "1" ||
		len(inst.Network.Interface) == 0 || inst.Network.Interface[0].IPv4.IPAddress[0].PrivateIPAddress != "10.240.0.4" ||
		inst.Network.Interface[0].IPv4.IPAddress[0].PublicIPAddress != "20.0.0.4" || inst.Compute.SubscriptionID != sub {
		fail("IMDS instance: %d %s", code, body)
	}
	ok("imds.instance: %s %s zone %s %s", inst.Compute.Name, inst.Compute.VMSize, inst.Compute.Zone, inst.Network.Interface[0].IPv4.IPAddress[0].PrivateIPAddress)
	code, body = imds("/metadata/loadbalancer?api-version=2020-10-01&format=json", true)
	var lbm struct {
		LoadBalancer struct{ PublicIPAddresses []json.RawMessage }
	}
	if code != 200 || json.Unmarshal(body, &lbm) != nil {
		fail("IMDS loadbalancer: %d %s", code, body)
	}
	ok("imds.loadbalancer: %d public addresses", len(lbm.LoadBalancer.PublicIPAddresses))
	code, body = imds("/metadata/identity/oauth2/token?api-version=2018-02-01&resource="+strings.ReplaceAll("https://management.azure.com/", ":", "%3A"), true)
	var mi struct {
		AccessToken string `json:"access_token"`
		ExpiresOn   string `json:"expires_on"`
		TokenType   string `json:"token_type"`
	}
	if code != 200 || json.Unmarshal(body, &mi) != nil || mi.AccessToken == "" || mi.TokenType != "Bearer" {
		fail("IMDS token: %d %s", code, body)
	}
	// The managed-identity token works on ARM.
	req, _ := http.NewRequest("GET", base+"/subscriptions/"+sub+"/resourceGroups/"+rg+"/providers/Microsoft.Network/networkSecurityGroups/"+nsgName+"?api-version=2024-05-01", nil)
	req.Header.Set("Authorization", "Bearer "+mi.AccessToken)
	resp, err := httpClient.Do(req)
	must(err, "ARM with a managed-identity token")
	resp.Body.Close()
	if resp.StatusCode != 200 {
		fail("ARM with a managed-identity token: %d", resp.StatusCode)
	}
	ok("imds.token: managed-identity token accepted by ARM")

	// ACR (acr-credential-provider): a managed-identity token for the registry scope, the
	// registry's challenge read as upstream reads it, and the refresh-token exchange. The
	// emulator serves every host on one port: the registry's name goes in the Host header.
	{
		registry := "myreg.azurecr.io"
		code, body := imds("/metadata/identity/oauth2/token?api-version=2018-02-01&resource="+url.QueryEscape("https://containerregistry.azure.net"), true)
		var acrTok struct {
			AccessToken string `json:"access_token"`
		}
		if code != 200 || json.Unmarshal(body, &acrTok) != nil || acrTok.AccessToken == "" {
			fail("IMDS token for ACR: %d %s", code, body)
		}
		req, _ := http.NewRequest("GET", base+"/v2/", nil)
		req.Host = registry
		resp, err := httpClient.Do(req)
		must(err, "acr.challenge")
		resp.Body.Close()
		chal := resp.Header.Values("Www-Authenticate")
		if resp.StatusCode != 401 || len(chal) != 1 || !strings.HasPrefix(chal[0], "Bearer ") {
			fail("acr.challenge: %d %q", resp.StatusCode, chal)
		}
		params := map[string]string{}
		for _, kv := range strings.Split(strings.TrimPrefix(chal[0], "Bearer "), ",") {
			if k, v, found := strings.Cut(strings.TrimSpace(kv), "="); found {
				params[k] = strings.Trim(v, `"`)
			}
		}
		realm, err := url.Parse(params["realm"])
		if err != nil || realm.Host != registry || params["service"] != registry {
			fail("acr.challenge: realm %q service %q", params["realm"], params["service"])
		}
		ok("acr.challenge: 401 Bearer realm=%s service=%s", params["realm"], params["service"])
		exchange := func(token string) (int, []byte) {
			form := url.Values{"grant_type": {"access_token_refresh_token"}, "service": {params["service"]},
				"tenant": {tenant}, "access_token": {token}, "refresh_token": {token}}
			req, _ := http.NewRequest("POST", base+"/oauth2/exchange", strings.NewReader(form.Encode()))
			req.Host = realm.Host
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
			resp, err := httpClient.Do(req)
			must(err, "acr.exchange")
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, b
		}
		if code, _ := exchange(mi.AccessToken); code != 401 {
			fail("acr.exchange accepted an ARM-audience token: %d", code)
		}
		code, body = exchange(acrTok.AccessToken)
		var rt struct {
			RefreshToken string `json:"refresh_token"`
		}
		if code != 200 || json.Unmarshal(body, &rt) != nil || rt.RefreshToken == "" {
			fail("acr.exchange: %d %s", code, body)
		}
		ok("acr.exchange: ACR refresh token for %s (an ARM token refused)", registry)
	}

	// Compute's deletes last: they change the world the checks above read.
	checkComputeDeletes(ctx, compute, network)
	checkBarePut(ctx, base, network)
	checkPrivateLinkServices(ctx, base, tok.Token, network)

	fmt.Printf("fidelity azure: %d checks passed\n", checks)
}

var runtimePoll = runtime_PollUntilDoneOptions()

func admin(base, rule string) {
	resp, err := httpClient.Post(base+"/__emulator/faults", "application/json", bytes.NewBufferString(rule))
	must(err, "admin fault")
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		fail("admin fault: %d", resp.StatusCode)
	}
}

// armEnvironment is what upstream cloud-provider-azure reads of ARM's /metadata/endpoints.
type armEnvironment struct {
	Name            string `json:"name"`
	ResourceManager string `json:"resourceManager"`
	Authentication  struct {
		Audiences     []string `json:"audiences"`
		LoginEndpoint string   `json:"loginEndpoint"`
	} `json:"authentication"`
	Suffixes struct {
		AcrLoginServer *string `json:"acrLoginServer"`
		Storage        *string `json:"storage"`
	} `json:"suffixes"`
}

// armEnvironments reads ARM's cloud environments (no token, as upstream reads them), by
// lower-case name.
func armEnvironments(base string) map[string]armEnvironment {
	resp, err := httpClient.Get(base + "/metadata/endpoints?api-version=2019-05-01")
	must(err, "arm.metadata_endpoints")
	defer resp.Body.Close()
	var list []armEnvironment
	if resp.StatusCode != 200 {
		fail("arm.metadata_endpoints: %d", resp.StatusCode)
	}
	must(json.NewDecoder(resp.Body).Decode(&list), "arm.metadata_endpoints: a JSON array of environments")
	out := map[string]armEnvironment{}
	for _, e := range list {
		out[strings.ToLower(e.Name)] = e
	}
	return out
}

// aadHostTransport sends requests for Microsoft's AAD host (msal-go's instance discovery) to
// the emulator, as a test network's DNS would; everything else goes where it was addressed.
type aadHostTransport struct {
	c        *http.Client
	emulator string
}

func (t aadHostTransport) Do(r *http.Request) (*http.Response, error) {
	if r.URL.Host == "login.microsoftonline.com" {
		u, err := url.Parse(t.emulator)
		if err != nil {
			return nil, err
		}
		r = r.Clone(r.Context())
		r.URL.Scheme, r.URL.Host, r.Host = u.Scheme, u.Host, ""
	}
	return t.c.Do(r)
}

// counter reads one operation's call count from the emulator's admin API.
func counter(base, op string) int {
	resp, err := httpClient.Get(base + "/__emulator/counters")
	must(err, "admin counters")
	defer resp.Body.Close()
	var c struct {
		Operations map[string]int `json:"operations"`
	}
	must(json.NewDecoder(resp.Body).Decode(&c), "admin counters")
	return c.Operations[op]
}

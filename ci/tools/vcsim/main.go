// ccm-vcsim: govmomi's vCenter simulator with a scriptable fixture channel, for the vSphere
// provider's tests.
//
// It serves the default VPX inventory (DC0, cluster DC0_C0 with hosts DC0_C0_H0..H2,
// standalone host DC0_H0, four powered-on VMs; -vms N makes N, for ccm-bench) with the vim25 SOAP API at /sdk and the
// vAPI REST tagging API at /rest, on the address given with -l (default 127.0.0.1:0).
//
// Protocol (one JSON object per line):
//   - on start it prints {"url": "...", "caFile": "<PEM of the CA of the serving cert>", "vms": [{"name","uuid","moref","host"}...]} on stdout;
//   - it reads commands on stdin and answers each with {"ok":true} or {"ok":false,"error":"..."};
//   - it exits when stdin closes, so a test that dies never leaves a simulator behind.
//
// Commands:
//
//	{"op":"guest","vm":"DC0_H0_VM0","hostName":"node-a","nics":[{"network":"VM Network","ips":["10.0.0.5"]}]}
//	{"op":"tag","category":"k8s-zone","tag":"zone-a","object":"DC0_C0"}   (cluster, host, datacenter or VM name)
//	{"op":"power","vm":"DC0_H0_VM0","state":"off"}                        ("on" or "off")
//	{"op":"destroy","vm":"DC0_H0_VM0"}
//	{"op":"drop-sessions"}     terminates every SOAP session and revokes every REST session
//	{"op":"pause"} / {"op":"resume"}   while paused, every connection is closed unanswered
//	{"op":"guest",...,"nics":[{"network":"cni0","ips":[...],"deviceConfigId":-1}]}   a non-vNIC interface (default id 4000+i)
//	{"op":"extra-config","vm":"DC0_H0_VM0","key":"guestinfo.metadata","value":"..."}   sets config.extraConfig
//	{"op":"tag",...,"object":"DC0_H0_VM0","of":"resourcePool"}   tags the VM's resource pool ("folder": its folder)
//	{"op":"datacenter","name":"DC1"}            creates an empty datacenter under the root folder
//	{"op":"destroy-datacenter","name":"DC1"}    destroys an (empty) datacenter
//	{"op":"move","vm":"DC0_H0_VM0","datacenter":"DC1"}   moves a VM into another datacenter's VM folder
//
// SearchIndex finds (FindByUuid, FindByIp, FindByDnsName, FindAllByDnsName) honour their
// datacenter argument as vCenter does (govmomi's simulator ignores it): only VMs in that
// datacenter are answered, and a datacenter that no longer exists is a
// ManagedObjectNotFound fault.
package main

import (
	"bufio"
	"context"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/json"
	"encoding/pem"
	"flag"
	"fmt"
	"math/big"
	"net"
	"net/http"
	"net/url"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/vmware/govmomi/find"
	"github.com/vmware/govmomi/object"
	"github.com/vmware/govmomi/session"
	"github.com/vmware/govmomi/simulator"
	"github.com/vmware/govmomi/vapi/rest"
	_ "github.com/vmware/govmomi/vapi/simulator"
	"github.com/vmware/govmomi/vapi/tags"
	"github.com/vmware/govmomi/vim25"
	"github.com/vmware/govmomi/vim25/methods"
	"github.com/vmware/govmomi/vim25/mo"
	"github.com/vmware/govmomi/vim25/soap"
	"github.com/vmware/govmomi/vim25/types"
)

// revoker wraps the server so REST sessions can be dropped on command.
type revoker struct {
	next    http.Handler
	mu      sync.Mutex
	seen    map[string]bool
	revoked map[string]bool
}

func (r *revoker) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if !strings.HasPrefix(req.URL.Path, "/rest") {
		r.next.ServeHTTP(w, req)
		return
	}
	id := req.Header.Get("vmware-api-session-id")
	if id == "" {
		if c, err := req.Cookie("vmware-api-session-id"); err == nil {
			id = c.Value
		}
	}
	if id != "" {
		r.mu.Lock()
		revoked := r.revoked[id]
		r.seen[id] = true
		r.mu.Unlock()
		if revoked {
			w.Header().Set("Content-Type", "application/json")
			w.WriteHeader(http.StatusUnauthorized)
			_, _ = w.Write([]byte(`{"type":"com.vmware.vapi.std.errors.unauthenticated","value":{"messages":[]}}`))
			return
		}
	}
	r.next.ServeHTTP(w, req)
}

func (r *revoker) revokeAll() {
	r.mu.Lock()
	defer r.mu.Unlock()
	for id := range r.seen {
		r.revoked[id] = true
	}
}

// pauser closes every connection unanswered while paused (an unreachable vCenter).
type pauser struct {
	next   http.Handler
	paused atomic.Bool
}

func (p *pauser) ServeHTTP(w http.ResponseWriter, req *http.Request) {
	if p.paused.Load() {
		if hj, ok := w.(http.Hijacker); ok {
			if conn, _, err := hj.Hijack(); err == nil {
				_ = conn.Close()
				return
			}
		}
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	p.next.ServeHTTP(w, req)
}

type nic struct {
	Network        string   `json:"network"`
	IPs            []string `json:"ips"`
	DeviceConfigID *int32   `json:"deviceConfigId"`
}

type command struct {
	Op         string `json:"op"`
	VM         string `json:"vm"`
	HostName   string `json:"hostName"`
	Nics       []nic  `json:"nics"`
	Category   string `json:"category"`
	Tag        string `json:"tag"`
	Object     string `json:"object"`
	State      string `json:"state"`
	Key        string `json:"key"`
	Value      string `json:"value"`
	Of         string `json:"of"`
	Name       string `json:"name"`
	Datacenter string `json:"datacenter"`
}

type vmInfo struct {
	Name  string `json:"name"`
	UUID  string `json:"uuid"`
	MoRef string `json:"moref"`
	Host  string `json:"host"`
}

type fixture struct {
	model   *simulator.Model
	vim     *vim25.Client
	rest    *rest.Client
	tags    *tags.Manager
	finder  *find.Finder
	revoker *revoker
	pauser  *pauser
}

func main() {
	listen := flag.String("l", "127.0.0.1:0", "listen address")
	user := flag.String("username", "", "accepted user name (default: any)")
	pass := flag.String("password", "", "accepted password (default: any)")
	vms := flag.Int("vms", 4, "VMs in the inventory, half on the standalone host, half in the cluster (ccm-bench: -vms 1000)")
	flag.Parse()
	if err := run(*listen, *user, *pass, *vms); err != nil {
		fmt.Fprintf(os.Stderr, "ccm-vcsim: %v\n", err)
		os.Exit(1)
	}
}

func run(listen, user, pass string, vmCount int) error {
	ctx := context.Background()
	model := simulator.VPX()
	// VMs per host and per cluster resource pool: the default 2 gives the four VMs above.
	if vmCount > 4 {
		model.Machine = (vmCount + 1) / 2
	}
	if err := model.Create(); err != nil {
		return fmt.Errorf("creating the model: %w", err)
	}
	model.Service.Listen = &url.URL{Host: listen}
	if user != "" {
		model.Service.Listen.User = url.UserPassword(user, pass)
	}
	model.Service.RegisterEndpoints = true
	f := &fixture{model: model}
	// Serve TLS like a real vCenter: a leaf certificate for 127.0.0.1 signed by a CA
	// written to caFile (clients use insecureFlag or that CA).
	leaf, caPEM, err := newCertificates()
	if err != nil {
		return fmt.Errorf("generating certificates: %w", err)
	}
	ca, err := os.CreateTemp("", "ccm-vcsim-ca-*.pem")
	if err != nil {
		return err
	}
	caFile := ca.Name()
	defer os.Remove(caFile)
	if _, err := ca.Write(caPEM); err != nil {
		return err
	}
	_ = ca.Close()
	model.Service.TLS = &tls.Config{Certificates: []tls.Certificate{leaf}}
	server := model.Service.NewServer()
	defer server.Close()
	// Wrap everything: REST session revocation inside, pausing outside.
	f.revoker = &revoker{next: server.Config.Handler, seen: map[string]bool{}, revoked: map[string]bool{}}
	f.pauser = &pauser{next: f.revoker}
	server.Config.Handler = f.pauser

	login := url.UserPassword("fixture", "fixture")
	if user != "" {
		login = url.UserPassword(user, pass)
	}
	u := *server.URL
	u.User = login
	soapClient := soap.NewClient(&u, true)
	vc, err := vim25.NewClient(ctx, soapClient)
	if err != nil {
		return fmt.Errorf("connecting the fixture client: %w", err)
	}
	if err := session.NewManager(vc).Login(ctx, login); err != nil {
		return fmt.Errorf("fixture login: %w", err)
	}
	f.vim = vc
	f.rest = rest.NewClient(vc)
	if err := f.rest.Login(ctx, login); err != nil {
		return fmt.Errorf("fixture REST login: %w", err)
	}
	f.tags = tags.NewManager(f.rest)
	f.finder = find.NewFinder(vc, true)
	model.Map().Handler = scopedSearch
	dc, err := f.finder.DefaultDatacenter(ctx)
	if err != nil {
		return err
	}
	f.finder.SetDatacenter(dc)

	vms, err := f.vmInfos(ctx)
	if err != nil {
		return err
	}
	printURL := *server.URL
	printURL.User = nil
	out := json.NewEncoder(os.Stdout)
	if err := out.Encode(map[string]any{"url": printURL.String(), "caFile": caFile, "vms": vms}); err != nil {
		return err
	}

	in := bufio.NewScanner(os.Stdin)
	for in.Scan() {
		var cmd command
		var err error
		if err = json.Unmarshal(in.Bytes(), &cmd); err == nil {
			err = f.apply(ctx, cmd)
		}
		if err != nil {
			_ = out.Encode(map[string]any{"ok": false, "error": err.Error()})
		} else {
			_ = out.Encode(map[string]any{"ok": true})
		}
	}
	// stdin closed: the test (or its process) is gone. Exit at once rather than wait
	// for open connections to drain.
	_ = os.Remove(caFile)
	os.Exit(0)
	return nil
}

func (f *fixture) vmInfos(ctx context.Context) ([]vmInfo, error) {
	list, err := f.finder.VirtualMachineList(ctx, "*")
	if err != nil {
		return nil, err
	}
	var infos []vmInfo
	for _, vm := range list {
		var m mo.VirtualMachine
		if err := vm.Properties(ctx, vm.Reference(), []string{"name", "config.uuid", "runtime.host"}, &m); err != nil {
			return nil, err
		}
		host := ""
		if m.Runtime.Host != nil {
			var h mo.HostSystem
			if err := object.NewHostSystem(f.vim, *m.Runtime.Host).Properties(ctx, *m.Runtime.Host, []string{"name"}, &h); err == nil {
				host = h.Name
			}
		}
		infos = append(infos, vmInfo{Name: m.Name, UUID: m.Config.Uuid, MoRef: vm.Reference().Value, Host: host})
	}
	return infos, nil
}

func (f *fixture) vm(ctx context.Context, name string) (*object.VirtualMachine, error) {
	return f.finder.VirtualMachine(ctx, name)
}

func (f *fixture) apply(ctx context.Context, cmd command) error {
	switch cmd.Op {
	case "guest":
		vm, err := f.vm(ctx, cmd.VM)
		if err != nil {
			return err
		}
		sctx := f.model.Service.Context
		obj, ok := sctx.Map.Get(vm.Reference()).(*simulator.VirtualMachine)
		if !ok {
			return fmt.Errorf("%s is not a simulated VM", cmd.VM)
		}
		sctx.WithLock(obj, func() {
			obj.Guest.HostName = cmd.HostName
			obj.Summary.Guest.HostName = cmd.HostName
			obj.Guest.Net = nil
			first := ""
			for i, n := range cmd.Nics {
				obj.Guest.Net = append(obj.Guest.Net, types.GuestNicInfo{
					Network:        n.Network,
					IpAddress:      n.IPs,
					MacAddress:     fmt.Sprintf("00:50:56:00:00:%02x", i),
					Connected:      true,
					DeviceConfigId: deviceConfigID(n, i),
				})
				if first == "" && len(n.IPs) > 0 {
					first = n.IPs[0]
				}
			}
			obj.Guest.IpAddress = first
			obj.Summary.Guest.IpAddress = first
			obj.Guest.ToolsRunningStatus = string(types.VirtualMachineToolsRunningStatusGuestToolsRunning)
		})
		return nil
	case "tag":
		ref, err := f.inventoryObject(ctx, cmd.Object)
		if err != nil {
			return err
		}
		if cmd.Of != "" {
			if ref, err = f.relatedObject(ctx, ref, cmd.Of); err != nil {
				return err
			}
		}
		catID, err := f.ensureCategory(ctx, cmd.Category)
		if err != nil {
			return err
		}
		tagID, err := f.ensureTag(ctx, catID, cmd.Tag)
		if err != nil {
			return err
		}
		return f.tags.AttachTag(ctx, tagID, ref)
	case "power":
		vm, err := f.vm(ctx, cmd.VM)
		if err != nil {
			return err
		}
		var task *object.Task
		if cmd.State == "off" {
			task, err = vm.PowerOff(ctx)
		} else {
			task, err = vm.PowerOn(ctx)
		}
		if err != nil {
			return err
		}
		return task.Wait(ctx)
	case "destroy":
		vm, err := f.vm(ctx, cmd.VM)
		if err != nil {
			return err
		}
		if task, err := vm.PowerOff(ctx); err == nil {
			_ = task.Wait(ctx)
		}
		task, err := vm.Destroy(ctx)
		if err != nil {
			return err
		}
		return task.Wait(ctx)
	case "drop-sessions":
		f.revoker.revokeAll()
		var sm mo.SessionManager
		pc := f.vim.ServiceContent.SessionManager
		if err := object.NewCommon(f.vim, *pc).Properties(ctx, *pc, []string{"sessionList", "currentSession"}, &sm); err != nil {
			return err
		}
		var ids []string
		for _, s := range sm.SessionList {
			if sm.CurrentSession == nil || s.Key != sm.CurrentSession.Key {
				ids = append(ids, s.Key)
			}
		}
		if len(ids) == 0 {
			return nil
		}
		_, err := methods.TerminateSession(ctx, f.vim, &types.TerminateSession{This: *pc, SessionId: ids})
		return err
	case "extra-config":
		vm, err := f.vm(ctx, cmd.VM)
		if err != nil {
			return err
		}
		task, err := vm.Reconfigure(ctx, types.VirtualMachineConfigSpec{
			ExtraConfig: []types.BaseOptionValue{&types.OptionValue{Key: cmd.Key, Value: cmd.Value}},
		})
		if err != nil {
			return err
		}
		return task.Wait(ctx)
	case "datacenter":
		_, err := object.NewRootFolder(f.vim).CreateDatacenter(ctx, cmd.Name)
		return err
	case "destroy-datacenter":
		dc, err := f.finder.Datacenter(ctx, cmd.Name)
		if err != nil {
			return err
		}
		task, err := dc.Destroy(ctx)
		if err != nil {
			return err
		}
		return task.Wait(ctx)
	case "move":
		vm, err := f.vm(ctx, cmd.VM)
		if err != nil {
			return err
		}
		dc, err := f.finder.Datacenter(ctx, cmd.Datacenter)
		if err != nil {
			return err
		}
		folders, err := dc.Folders(ctx)
		if err != nil {
			return err
		}
		task, err := folders.VmFolder.MoveInto(ctx, []types.ManagedObjectReference{vm.Reference()})
		if err != nil {
			return err
		}
		return task.Wait(ctx)
	case "pause":
		f.pauser.paused.Store(true)
		return nil
	case "resume":
		f.pauser.paused.Store(false)
		return nil
	default:
		return fmt.Errorf("unknown op %q", cmd.Op)
	}
}

func (f *fixture) inventoryObject(ctx context.Context, name string) (mo.Reference, error) {
	if dc, err := f.finder.Datacenter(ctx, name); err == nil {
		return dc, nil
	}
	if c, err := f.finder.ClusterComputeResource(ctx, name); err == nil {
		return c, nil
	}
	if h, err := f.finder.HostSystem(ctx, "*/"+name); err == nil {
		return h, nil
	}
	if h, err := f.finder.HostSystem(ctx, name); err == nil {
		return h, nil
	}
	if vm, err := f.finder.VirtualMachine(ctx, name); err == nil {
		return vm, nil
	}
	return nil, fmt.Errorf("no datacenter, cluster, host or VM named %q", name)
}

func (f *fixture) ensureCategory(ctx context.Context, name string) (string, error) {
	if c, err := f.tags.GetCategory(ctx, name); err == nil {
		return c.ID, nil
	}
	return f.tags.CreateCategory(ctx, &tags.Category{Name: name, Cardinality: "SINGLE"})
}

func (f *fixture) ensureTag(ctx context.Context, catID, name string) (string, error) {
	if t, err := f.tags.GetTagForCategory(ctx, name, catID); err == nil {
		return t.ID, nil
	}
	return f.tags.CreateTag(ctx, &tags.Tag{Name: name, CategoryID: catID})
}

// newCertificates returns a serving certificate for 127.0.0.1, ::1 and localhost and the
// PEM of the CA that signed it.
func newCertificates() (tls.Certificate, []byte, error) {
	caKey, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	now := time.Now()
	caTmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: "ccm-vcsim CA"},
		NotBefore:             now.Add(-time.Hour),
		NotAfter:              now.Add(24 * time.Hour),
		IsCA:                  true,
		BasicConstraintsValid: true,
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageDigitalSignature,
	}
	caDER, err := x509.CreateCertificate(rand.Reader, caTmpl, caTmpl, &caKey.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	caCert, err := x509.ParseCertificate(caDER)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(2),
		Subject:      pkix.Name{CommonName: "127.0.0.1"},
		NotBefore:    now.Add(-time.Hour),
		NotAfter:     now.Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1"), net.ParseIP("::1")},
		DNSNames:     []string{"localhost"},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, caCert, &key.PublicKey, caKey)
	if err != nil {
		return tls.Certificate{}, nil, err
	}
	caPEM := pem.EncodeToMemory(&pem.Block{Type: "CERTIFICATE", Bytes: caDER})
	return tls.Certificate{Certificate: [][]byte{der}, PrivateKey: key}, caPEM, nil
}

func deviceConfigID(n nic, i int) int32 {
	if n.DeviceConfigID != nil {
		return *n.DeviceConfigID
	}
	return int32(4000 + i)
}

// relatedObject is the VM's resource pool ("resourcePool") or parent folder ("folder").
func (f *fixture) relatedObject(ctx context.Context, ref mo.Reference, of string) (mo.Reference, error) {
	var m mo.VirtualMachine
	if err := object.NewCommon(f.vim, ref.Reference()).Properties(ctx, ref.Reference(), []string{"resourcePool", "parent"}, &m); err != nil {
		return nil, err
	}
	switch {
	case of == "resourcePool" && m.ResourcePool != nil:
		return *m.ResourcePool, nil
	case of == "folder" && m.Parent != nil:
		return *m.Parent, nil
	}
	return nil, fmt.Errorf("%s has no %s", ref.Reference(), of)
}

// scopedSearch routes SearchIndex finds to searchIndexInDatacenter.
func scopedSearch(ctx *simulator.Context, m *simulator.Method) (mo.Reference, types.BaseMethodFault) {
	if m.This.Type != "SearchIndex" {
		return nil, nil
	}
	switch m.Name {
	case "FindByUuid", "FindByIp", "FindByDnsName", "FindAllByDnsName":
		if s, ok := ctx.Map.Get(m.This).(*simulator.SearchIndex); ok {
			return &searchIndexInDatacenter{s}, nil
		}
	}
	return nil, nil
}

// searchIndexInDatacenter answers only VMs inside the datacenter argument.
type searchIndexInDatacenter struct {
	*simulator.SearchIndex
}

// inDatacenter: nil when no datacenter is given or ref lies inside it; otherwise false.
func inDatacenter(ctx *simulator.Context, ref types.ManagedObjectReference, dc *types.ManagedObjectReference) bool {
	if dc == nil {
		return true
	}
	for i := 0; i < 64; i++ {
		if ref == *dc {
			return true
		}
		e, ok := ctx.Map.Get(ref).(mo.Entity)
		if !ok || e.Entity().Parent == nil {
			return false
		}
		ref = *e.Entity().Parent
	}
	return false
}

func missingDatacenter(ctx *simulator.Context, dc *types.ManagedObjectReference) *soap.Fault {
	if dc == nil || ctx.Map.Get(*dc) != nil {
		return nil
	}
	return simulator.Fault("The object has already been deleted or has not been completely created",
		&types.ManagedObjectNotFound{Obj: *dc})
}

func (s *searchIndexInDatacenter) FindByUuid(ctx *simulator.Context, req *types.FindByUuid) soap.HasFault {
	if fault := missingDatacenter(ctx, req.Datacenter); fault != nil {
		return &methods.FindByUuidBody{Fault_: fault}
	}
	body := s.SearchIndex.FindByUuid(ctx, req)
	if b, ok := body.(*methods.FindByUuidBody); ok && b.Res != nil && b.Res.Returnval != nil &&
		!inDatacenter(ctx, *b.Res.Returnval, req.Datacenter) {
		b.Res.Returnval = nil
	}
	return body
}

func (s *searchIndexInDatacenter) FindByIp(ctx *simulator.Context, req *types.FindByIp) soap.HasFault {
	if fault := missingDatacenter(ctx, req.Datacenter); fault != nil {
		return &methods.FindByIpBody{Fault_: fault}
	}
	all := s.SearchIndex.FindAllByIp(ctx, &types.FindAllByIp{This: req.This, Datacenter: req.Datacenter, Ip: req.Ip, VmSearch: req.VmSearch})
	body := &methods.FindByIpBody{Res: new(types.FindByIpResponse)}
	if b, ok := all.(*methods.FindAllByIpBody); ok && b.Res != nil {
		for _, ref := range b.Res.Returnval {
			if inDatacenter(ctx, ref, req.Datacenter) {
				ref := ref
				body.Res.Returnval = &ref
				break
			}
		}
	}
	return body
}

func (s *searchIndexInDatacenter) FindAllByDnsName(ctx *simulator.Context, req *types.FindAllByDnsName) soap.HasFault {
	if fault := missingDatacenter(ctx, req.Datacenter); fault != nil {
		return &methods.FindAllByDnsNameBody{Fault_: fault}
	}
	body := s.SearchIndex.FindAllByDnsName(ctx, req)
	if b, ok := body.(*methods.FindAllByDnsNameBody); ok && b.Res != nil {
		var kept []types.ManagedObjectReference
		for _, ref := range b.Res.Returnval {
			if inDatacenter(ctx, ref, req.Datacenter) {
				kept = append(kept, ref)
			}
		}
		b.Res.Returnval = kept
	}
	return body
}

func (s *searchIndexInDatacenter) FindByDnsName(ctx *simulator.Context, req *types.FindByDnsName) soap.HasFault {
	all := s.FindAllByDnsName(ctx, &types.FindAllByDnsName{This: req.This, Datacenter: req.Datacenter, DnsName: req.DnsName, VmSearch: req.VmSearch})
	body := &methods.FindByDnsNameBody{Res: new(types.FindByDnsNameResponse)}
	if b, ok := all.(*methods.FindAllByDnsNameBody); ok {
		if b.Fault_ != nil {
			return &methods.FindByDnsNameBody{Fault_: b.Fault_}
		}
		if b.Res != nil && len(b.Res.Returnval) > 0 {
			body.Res.Returnval = &b.Res.Returnval[0]
		}
	}
	return body
}

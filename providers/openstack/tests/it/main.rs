//! Integration tests of the OpenStack provider against the in-process OpenStack emulator
//! (`ccm_emulators::openstack`: Keystone, Nova, Neutron and Octavia on one loopback server).
//!
//! | module | shows |
//! |---|---|
//! | `auth` | every Keystone method upstream accepts: password by user ID or by name in a domain given by ID, application credentials by ID and by name with the user, a pre-issued token, trusts (Magnum), a domain-scoped token (a domain without a project), renewal before expiry, `tls-insecure`, client-certificate files, a clouds.yaml entry by `OS_CLOUD` |
//! | `client` | Keystone sessions, OpenStack error bodies, expired tokens renewed, throttling and 5xx retried (creates sent once), a hung call ends at its deadline, paging, typed calls, `ca-file` |
//! | `instances` | metadata as upstream (providerID, floating and multi-NIC addresses, zone, flavor), one listing per batch (30 and 1000 nodes counted), existence with the deletion-safety rule, an outage deletes nothing |
//! | `lb_parity` | upstream's Warnings for a floating network not found (`LoadBalancerExternalNetworkSearchFailed`, `LoadBalancerForcedInternal`) and an IPv6 VIP (`LoadBalancerFloatingIPSkipped`) on a real API server's Service, a `~regex` `floating-subnet`, a managed security group without Neutron's default egress rules, a foreign group of its name refused |
//! | `load_balancer` | Octavia load balancer, listeners, pools, members, monitors, floating IP and security group as upstream; node changes (one batch member update per pool), listener annotations reconciled in place, X-Forwarded-For re-creating listeners, ports removed; internal, keep-floatingip, loadBalancerIP, classes, PROXY/Local/hostnames, sharing by ID, ERROR load balancers, pending ones waited out (409s sent again), deletion leaving nothing, operator tools |
//! | `mtls` | client certificates on the wire: an emulator requiring mutual TLS initialises a real API server's Node with `cert-file`/`key-file`; without them, or with another CA's certificate, Keystone's handshake is refused and the error names `cert-file` and the TLS alert; an encrypted or unreadable key is a config error naming `key-file` |
//! | `octavia_features` | Octavia API version discovery and the features gated on it (tags, timeouts, `allowed_cidrs`, HTTP monitors on UDP), serial member calls, `load-balancer-id`/`-address` written back on a real API server's Service, the rename on a cluster-name change, a load balancer in `ERROR` on create, a realistic (slow) Octavia |
//! | `tls` | TLS termination: `TERMINATED_HTTPS` listeners with the Barbican container of `default-tls-container-ref` (annotation or config), HTTP pools, the reference changed in place and removed, the container read from Barbican first (a missing one, 404, or one the user may not read, ACL 403, fails the sync before any Octavia call), `container-store = external` |
//! | `trunks` | trunk sub-port addresses: a kubelet-registered Node initialised by the cloud-node controller (its own control plane) with its sub-ports' InternalIPs; calls counted for one node and a batch; `internal-network-name` / `public-network-name` applied to them |
//! | `paging` | Nova's page limit (`[api] max_limit`, 3 in the tests): every server listing follows the `servers_links` pages to the last server (a full last page links to an empty one), an unknown `marker` is Nova's 400; Neutron pages only when asked |
//! | `pending` | nothing waits for Octavia's `PENDING_*` states (issue #35): with ONE service worker and an emulator holding every change pending, N Services' load balancers are all created while the first is pending and all get their addresses once Octavia finishes, each step sent once; a delete while pending is a retry that resumes until the load balancer is gone (finalizer kept till then) while the worker serves another Service; the 60th load balancer of a /24 gets its VIP |
//! | `routes` | extra routes and allowed address pairs for 200 nodes created and deleted (router updates counted, atomic and read-modify-write), blackholes, a missing router, a next hop off the router's subnets |
// Test helpers panic on failure by design.
#![allow(clippy::unwrap_used, clippy::expect_used)]

mod auth;
mod client;
mod fixture;
mod flags;
mod instances;
mod lb_parity;
mod load_balancer;
mod mtls;
mod octavia_features;
mod paging;
mod pending;
mod routes;
mod tls;
mod trunks;

//! A bitmap of the node-sized subnets of one cluster CIDR: which are taken, and the next
//! free one (searching circularly from the last allocation, as upstream's `CidrSet`).

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Why a CIDR set operation failed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub(crate) enum CidrSetError {
    /// The node mask does not fit the cluster CIDR.
    #[error(
        "invalid node CIDR mask size /{node_mask} for cluster CIDR {cluster}: mask size of cluster CIDR must be less than or equal to the node CIDR mask size"
    )]
    MaskTooSmall {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The node mask.
        node_mask: u8,
    },
    /// More than 2^16 IPv6 node subnets.
    #[error(
        "New CIDR set failed; the node CIDR size is too big (cluster CIDR {cluster}, node mask /{node_mask})"
    )]
    TooBig {
        /// The cluster CIDR.
        cluster: IpNet,
        /// The node mask.
        node_mask: u8,
    },
    /// Every subnet is taken.
    #[error(
        "CIDR allocation failed; there are no remaining CIDRs left to allocate in the accepted range"
    )]
    Full,
    /// The CIDR does not overlap this set's cluster CIDR.
    #[error("cidr {cidr} is out the range of cluster cidr {cluster}")]
    OutOfRange {
        /// The CIDR.
        cidr: IpNet,
        /// The cluster CIDR.
        cluster: IpNet,
    },
}

/// The set of node subnets of one cluster CIDR.
#[derive(Debug, Clone)]
pub(crate) struct CidrSet {
    cluster: IpNet,
    node_mask: u8,
    /// Bits of an address of this family (32 or 128).
    bits: u8,
    base: u128,
    max: usize,
    used: Vec<u64>,
    allocated: usize,
    next_candidate: usize,
}

fn addr_u128(ip: IpAddr) -> u128 {
    match ip {
        IpAddr::V4(a) => u128::from(u32::from(a)),
        IpAddr::V6(a) => u128::from(a),
    }
}

impl CidrSet {
    /// A set of `/node_mask` subnets of `cluster`. IPv6 sets may hold at most 2^16 subnets
    /// (upstream's limit); IPv4 sets at most 2^(32-8).
    pub(crate) fn new(cluster: IpNet, node_mask: u8) -> Result<Self, CidrSetError> {
        let cluster = cluster.trunc();
        let bits = match cluster {
            IpNet::V4(_) => 32,
            IpNet::V6(_) => 128,
        };
        if node_mask < cluster.prefix_len() || node_mask > bits {
            return Err(CidrSetError::MaskTooSmall { cluster, node_mask });
        }
        let diff = node_mask - cluster.prefix_len();
        if (bits == 128 && diff > 16) || diff > 24 {
            return Err(CidrSetError::TooBig { cluster, node_mask });
        }
        let max = 1usize << diff;
        Ok(CidrSet {
            cluster,
            node_mask,
            bits,
            base: addr_u128(cluster.network()),
            max,
            used: vec![0; max.div_ceil(64)],
            allocated: 0,
            next_candidate: 0,
        })
    }

    /// The cluster CIDR.
    pub(crate) fn cluster(&self) -> IpNet {
        self.cluster
    }

    /// Fraction of subnets in use.
    pub(crate) fn usage(&self) -> f64 {
        self.allocated as f64 / self.max as f64
    }

    fn is_set(&self, i: usize) -> bool {
        self.used[i / 64] & (1 << (i % 64)) != 0
    }

    fn set(&mut self, i: usize, on: bool) {
        if self.is_set(i) == on {
            return;
        }
        if on {
            self.used[i / 64] |= 1 << (i % 64);
            self.allocated += 1;
        } else {
            self.used[i / 64] &= !(1 << (i % 64));
            self.allocated -= 1;
        }
    }

    fn subnet(&self, i: usize) -> IpNet {
        let shift = u32::from(self.bits - self.node_mask);
        let addr = self.base + ((i as u128) << shift);
        match self.bits {
            32 => IpNet::V4(
                Ipv4Net::new(Ipv4Addr::from(addr as u32), self.node_mask).unwrap_or_default(),
            ),
            _ => IpNet::V6(Ipv6Net::new(Ipv6Addr::from(addr), self.node_mask).unwrap_or_default()),
        }
    }

    /// Takes the next free subnet; returns it with the number of indices probed.
    pub(crate) fn allocate_next(&mut self) -> Result<(IpNet, usize), CidrSetError> {
        for tries in 0..self.max {
            let i = (self.next_candidate + tries) % self.max;
            if !self.is_set(i) {
                self.set(i, true);
                self.next_candidate = (i + 1) % self.max;
                return Ok((self.subnet(i), tries + 1));
            }
        }
        Err(CidrSetError::Full)
    }

    /// The indices of the node subnets `cidr` overlaps.
    fn range(&self, cidr: &IpNet) -> Result<(usize, usize), CidrSetError> {
        let out = || CidrSetError::OutOfRange { cidr: *cidr, cluster: self.cluster };
        let same_family = matches!(
            (cidr, &self.cluster),
            (IpNet::V4(_), IpNet::V4(_)) | (IpNet::V6(_), IpNet::V6(_))
        );
        if !same_family {
            return Err(out());
        }
        let lo = addr_u128(cidr.network()).max(self.base);
        let hi = addr_u128(cidr.broadcast()).min(addr_u128(self.cluster.broadcast()));
        if lo > hi {
            return Err(out());
        }
        let shift = u32::from(self.bits - self.node_mask);
        Ok((((lo - self.base) >> shift) as usize, ((hi - self.base) >> shift) as usize))
    }

    /// Marks every subnet `cidr` overlaps as taken.
    pub(crate) fn occupy(&mut self, cidr: &IpNet) -> Result<(), CidrSetError> {
        let (a, b) = self.range(cidr)?;
        for i in a..=b {
            self.set(i, true);
        }
        Ok(())
    }

    /// Marks every subnet `cidr` overlaps as free.
    pub(crate) fn release(&mut self, cidr: &IpNet) -> Result<(), CidrSetError> {
        let (a, b) = self.range(cidr)?;
        for i in a..=b {
            self.set(i, false);
        }
        Ok(())
    }

    /// Whether `cidr` overlaps this set's cluster CIDR.
    pub(crate) fn overlaps(&self, cidr: &IpNet) -> bool {
        self.range(cidr).is_ok()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn allocates_every_subnet_once_then_reports_full() {
        let mut s = CidrSet::new(net("10.0.0.0/22"), 24).unwrap();
        let got: Vec<String> = (0..4).map(|_| s.allocate_next().unwrap().0.to_string()).collect();
        assert_eq!(got, ["10.0.0.0/24", "10.0.1.0/24", "10.0.2.0/24", "10.0.3.0/24"]);
        assert_eq!(s.allocate_next(), Err(CidrSetError::Full));
        assert!(s.allocate_next().unwrap_err().to_string().contains("no remaining CIDRs"));
        assert_eq!(s.usage(), 1.0);
    }

    #[test]
    fn search_is_circular_from_the_last_allocation() {
        let mut s = CidrSet::new(net("10.0.0.0/22"), 24).unwrap();
        let (a, _) = s.allocate_next().unwrap();
        s.allocate_next().unwrap();
        s.release(&a).unwrap();
        assert_eq!(s.allocate_next().unwrap().0.to_string(), "10.0.2.0/24");
        assert_eq!(s.allocate_next().unwrap().0.to_string(), "10.0.3.0/24");
        let (reused, tries) = s.allocate_next().unwrap();
        assert_eq!(reused.to_string(), "10.0.0.0/24");
        assert_eq!(tries, 1);
    }

    #[test]
    fn occupied_ranges_are_skipped_including_a_larger_service_cidr() {
        let mut s = CidrSet::new(net("10.0.0.0/16"), 24).unwrap();
        s.occupy(&net("10.0.0.0/23")).unwrap();
        s.occupy(&net("10.0.3.0/24")).unwrap();
        assert_eq!(s.allocate_next().unwrap().0.to_string(), "10.0.2.0/24");
        assert_eq!(s.allocate_next().unwrap().0.to_string(), "10.0.4.0/24");
        // A range larger than the cluster CIDR occupies its overlap only.
        let mut t = CidrSet::new(net("10.0.0.0/22"), 24).unwrap();
        t.occupy(&net("10.0.0.0/8")).unwrap();
        assert_eq!(t.allocate_next(), Err(CidrSetError::Full));
        assert!(matches!(s.occupy(&net("192.168.0.0/24")), Err(CidrSetError::OutOfRange { .. })));
        assert!(!s.overlaps(&net("fd00::/64")));
    }

    #[test]
    fn ipv6_sets_work_and_are_limited_to_2_pow_16() {
        let mut s = CidrSet::new(net("fd00:10::/56"), 64).unwrap();
        assert_eq!(s.allocate_next().unwrap().0.to_string(), "fd00:10::/64");
        assert_eq!(s.allocate_next().unwrap().0.to_string(), "fd00:10:0:1::/64");
        assert!(matches!(CidrSet::new(net("fd00::/40"), 64), Err(CidrSetError::TooBig { .. })));
        assert!(matches!(
            CidrSet::new(net("10.0.0.0/24"), 16),
            Err(CidrSetError::MaskTooSmall { .. })
        ));
    }
}

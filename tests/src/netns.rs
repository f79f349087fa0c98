//! Hosts of a test cluster in network namespaces of their own, and partitions between them.
//!
//! Layout: a hub namespace holds a bridge; each member's namespace is joined to it by a veth pair
//! (`10.77.0.{id}/24` on the member's side), and so is the test's own namespace (`10.77.0.254`), so
//! the clients reach every member whatever the members' partitions. The bridge sits in a namespace of
//! its own rather than the test's, so the host's firewall (a `FORWARD` policy of `DROP` applied to
//! bridged traffic, as Docker sets) never sees the cluster's packets.
//!
//! A partition cuts member traffic only: each side drops, on input, what comes from the other
//! (nftables in the member's namespace), so a sender sees silence, not an error, as across a real
//! network. Where nftables is missing, a blackhole route in each side's namespace does the cutting
//! (the sender then sees its sends refused). Everything made is removed on drop.

use std::collections::BTreeSet;
use std::net::{Ipv4Addr, SocketAddr};
use std::process::Command;

use crate::cluster::MemberAddrs;

/// Each member's HTTP port, in its own namespace.
pub const HTTP_PORT: u16 = 8080;
/// Each member's cluster (QUIC) port.
pub const CLUSTER_PORT: u16 = 7943;

/// How a partition is cut.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cutter {
    /// An nftables input rule on each side: silent loss.
    Nftables,
    /// A blackhole route on each side: the sender's sends fail.
    Blackhole,
}

/// The namespaces of a test cluster; removed when dropped.
#[derive(Debug)]
pub struct Netns {
    prefix: String,
    members: u64,
    cutter: Cutter,
    /// Pairs (a, b), a < b, whose traffic is cut now.
    cut: BTreeSet<(u64, u64)>,
}

fn run(args: &[&str]) -> Result<(), String> {
    let output = Command::new(args[0])
        .args(&args[1..])
        .output()
        .map_err(|error| format!("{}: {error}", args.join(" ")))?;
    if output.status.success() {
        Ok(())
    } else {
        Err(format!(
            "{}: {}",
            args.join(" "),
            String::from_utf8_lossy(&output.stderr).trim()
        ))
    }
}

/// Member `id`'s address.
pub fn member_ip(id: u64) -> Ipv4Addr {
    Ipv4Addr::new(10, 77, 0, u8::try_from(id).expect("fewer than 254 members"))
}

impl Netns {
    /// Makes the hub, `members` namespaces (members 1..=members) and the test's link, named with
    /// `prefix` (at most 8 characters: interface names are short). Fails with what could not be made;
    /// whatever was made is removed then.
    pub fn create(prefix: &str, members: u64) -> Result<Netns, String> {
        assert!(prefix.len() <= 8, "interface names are at most 15 bytes");
        let cutter = if run(&["nft", "--version"]).is_ok() {
            Cutter::Nftables
        } else {
            Cutter::Blackhole
        };
        let netns = Netns {
            prefix: prefix.to_string(),
            members,
            cutter,
            cut: BTreeSet::new(),
        };
        // A previous run killed midway may have left them.
        netns.remove();
        netns.build()?;
        Ok(netns)
    }

    fn hub(&self) -> String {
        format!("{}-hub", self.prefix)
    }

    /// Member `id`'s namespace: what [`crate::NETNS_ENV`] names for it.
    pub fn namespace(&self, id: u64) -> String {
        format!("{}-{id}", self.prefix)
    }

    /// How partitions are cut here.
    pub fn cutter(&self) -> Cutter {
        self.cutter
    }

    fn build(&self) -> Result<(), String> {
        let hub = self.hub();
        let up = format!("{}-up", self.prefix);
        let test_side = format!("{}-t", self.prefix);
        run(&["ip", "netns", "add", &hub])?;
        run(&["ip", "-n", &hub, "link", "add", "br0", "type", "bridge"])?;
        run(&["ip", "-n", &hub, "link", "set", "br0", "up"])?;
        run(&[
            "ip", "link", "add", &test_side, "type", "veth", "peer", "name", &up, "netns", &hub,
        ])?;
        run(&["ip", "-n", &hub, "link", "set", &up, "master", "br0", "up"])?;
        run(&["ip", "addr", "add", "10.77.0.254/24", "dev", &test_side])?;
        run(&["ip", "link", "set", &test_side, "up"])?;
        for id in 1..=self.members {
            let namespace = self.namespace(id);
            let port = format!("v{id}");
            let address = format!("{}/24", member_ip(id));
            run(&["ip", "netns", "add", &namespace])?;
            run(&[
                "ip", "-n", &hub, "link", "add", &port, "type", "veth", "peer", "name", "eth0",
                "netns", &namespace,
            ])?;
            run(&[
                "ip", "-n", &hub, "link", "set", &port, "master", "br0", "up",
            ])?;
            run(&[
                "ip", "-n", &namespace, "addr", "add", &address, "dev", "eth0",
            ])?;
            run(&["ip", "-n", &namespace, "link", "set", "eth0", "up"])?;
            run(&["ip", "-n", &namespace, "link", "set", "lo", "up"])?;
            if self.cutter == Cutter::Nftables {
                // nft joins its arguments into one command.
                let nft = |rule: &str| run(&["ip", "netns", "exec", &namespace, "nft", rule]);
                nft("add table inet chaos")?;
                nft("add chain inet chaos input { type filter hook input priority 0 ; }")?;
            }
        }
        Ok(())
    }

    /// The members' addresses: HTTP and cluster ports on each member's own address.
    pub fn addrs(&self) -> Vec<MemberAddrs> {
        (1..=self.members)
            .map(|id| MemberAddrs {
                id,
                http: SocketAddr::from((member_ip(id), HTTP_PORT)),
                cluster: SocketAddr::from((member_ip(id), CLUSTER_PORT)),
            })
            .collect()
    }

    /// The environment entry that starts member `id` in its namespace.
    pub fn env(&self, id: u64) -> Vec<(String, String)> {
        vec![(crate::NETNS_ENV.to_string(), self.namespace(id))]
    }

    fn set_cut(&self, from: u64, to: u64, cut: bool) -> Result<(), String> {
        // `from` stops hearing `to`.
        let namespace = self.namespace(from);
        let peer = member_ip(to).to_string();
        match self.cutter {
            Cutter::Nftables if cut => run(&[
                "ip", "netns", "exec", &namespace, "nft", "add", "rule", "inet", "chaos", "input",
                "ip", "saddr", &peer, "drop",
            ]),
            Cutter::Nftables => Ok(()), // The heal flushes the chain.
            Cutter::Blackhole => {
                let verb = if cut { "add" } else { "del" };
                run(&[
                    "ip",
                    "-n",
                    &namespace,
                    "route",
                    verb,
                    "blackhole",
                    &format!("{peer}/32"),
                ])
            }
        }
    }

    /// Cuts member `id` off from every other member, both ways; the clients still reach it.
    pub fn isolate(&mut self, id: u64) -> Result<(), String> {
        for other in (1..=self.members).filter(|&other| other != id) {
            self.cut_pair(id, other)?;
        }
        Ok(())
    }

    fn cut_pair(&mut self, a: u64, b: u64) -> Result<(), String> {
        let pair = (a.min(b), a.max(b));
        if self.cut.insert(pair) {
            self.set_cut(a, b, true)?;
            self.set_cut(b, a, true)?;
        }
        Ok(())
    }

    /// Restores every cut link.
    pub fn heal(&mut self) -> Result<(), String> {
        let cut = std::mem::take(&mut self.cut);
        match self.cutter {
            Cutter::Nftables => {
                for id in 1..=self.members {
                    run(&[
                        "ip",
                        "netns",
                        "exec",
                        &self.namespace(id),
                        "nft",
                        "flush",
                        "chain",
                        "inet",
                        "chaos",
                        "input",
                    ])?;
                }
            }
            Cutter::Blackhole => {
                for (a, b) in cut {
                    self.set_cut(a, b, false)?;
                    self.set_cut(b, a, false)?;
                }
            }
        }
        Ok(())
    }

    fn remove(&self) {
        let _ = run(&["ip", "link", "del", &format!("{}-t", self.prefix)]);
        for id in 1..=self.members {
            let _ = run(&["ip", "netns", "del", &self.namespace(id)]);
        }
        let _ = run(&["ip", "netns", "del", &self.hub()]);
    }
}

impl Drop for Netns {
    fn drop(&mut self) {
        self.remove();
    }
}

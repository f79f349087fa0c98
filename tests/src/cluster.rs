//! A cluster of real `narad` processes on loopback, for the black-box cluster tests.
//!
//! Each member is `narad serve` without `--dev` ([`Node::launch_member`]), configured by its
//! environment: `NARAD_NODE_ID`, `NARAD_HTTP_ADDR`, `NARAD_DATA_DIR`, `NARAD_CLUSTER_ADDR` (its UDP
//! address for node-to-node QUIC), `NARAD_CLUSTER_PEERS` (every member's cluster address, itself
//! included), `NARAD_CLUSTER_SECRET` and `NARAD_SECURITY_ENABLED=false`. Its ports are picked once
//! ([`free_ports`]) and kept, with its data dir, across restarts: a restarted member must come back at
//! the address its peers know it by, so the ports are fixed rather than `:0`.
//!
//! Members are numbered from 1 (their node id) and named by it: [`Cluster::node`]`(1)` is node 1.
//! Every wait is a bounded poll of what the members answer over HTTP (`/v1/cluster/members`,
//! `/v1/topics/{t}`, `/metrics`), at [`CLUSTER_POLL_INTERVAL`] since a probe asks several processes.
//! A member that is down ([`Cluster::kill`]) is never asked.
//!
//! Cluster tests run one at a time within a test binary: [`Cluster::start`] takes a process-wide lock
//! that the cluster holds until it is dropped. Failure detection is timing (a member is marked dead
//! about 5 s after its heartbeats stop), and several clusters of three sharing a small machine could
//! starve heartbeats into false deaths.

use std::collections::BTreeSet;
use std::net::{SocketAddr, TcpListener, UdpSocket};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};
use std::time::Duration;

use serde_json::Value;

use crate::observe::{self, metric_sum, poll_until};
use crate::{http, Mode, Node, Response};

/// Longest wait for a member's status to change. The raft leader marks a member dead about 5 s after
/// its heartbeats stop; the rest is margin for a loaded machine.
pub const MEMBER_TIMEOUT: Duration = Duration::from_secs(20);
/// Longest wait for the live members to agree on a live leader (an election after a leader's death
/// included).
pub const LEADER_TIMEOUT: Duration = Duration::from_secs(20);
/// Between two polls of the cluster (each asks every live member).
pub const CLUSTER_POLL_INTERVAL: Duration = Duration::from_millis(100);

/// What `/metrics` names the count of peers refused for a wrong or missing cluster secret proof.
pub const AUTH_FAILURES: &str = "narad_cluster_auth_failures_total";
/// What `/metrics` names the number of members the node sees alive.
pub const MEMBERS_ALIVE: &str = "narad_cluster_members_alive";

/// One cluster test at a time (see the module documentation).
static SERIAL: Mutex<()> = Mutex::new(());

/// A member's fixed addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MemberAddrs {
    /// Its node id (from 1).
    pub id: u64,
    /// Its HTTP address (`NARAD_HTTP_ADDR`).
    pub http: SocketAddr,
    /// Its UDP address for node-to-node traffic (`NARAD_CLUSTER_ADDR`).
    pub cluster: SocketAddr,
}

/// One entry of `GET /v1/cluster/members`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Member {
    /// Its node id.
    pub id: u64,
    /// Its cluster address, as listed in `NARAD_CLUSTER_PEERS`.
    pub addr: String,
    /// `alive` or `dead`.
    pub status: String,
    /// Whether it is the raft leader (as the answering node sees it).
    pub leader: bool,
    /// Partitions it owns, over every topic.
    pub owned_partitions: u64,
}

impl Member {
    /// Whether it is marked alive.
    pub fn is_alive(&self) -> bool {
        self.status == "alive"
    }

    /// The members of a `GET /v1/cluster/members` body: `{"members":[{...}, ...]}`.
    pub fn parse_list(body: &Value) -> Result<Vec<Member>, String> {
        let list = body["members"]
            .as_array()
            .ok_or_else(|| format!("no members array in {body}"))?;
        list.iter()
            .map(|entry| {
                let field = |name: &str| {
                    entry
                        .get(name)
                        .ok_or_else(|| format!("member without {name}: {entry}"))
                };
                Ok(Member {
                    id: as_id(field("id")?).ok_or_else(|| format!("bad id in {entry}"))?,
                    addr: field("addr")?
                        .as_str()
                        .ok_or_else(|| format!("bad addr in {entry}"))?
                        .to_string(),
                    status: field("status")?
                        .as_str()
                        .ok_or_else(|| format!("bad status in {entry}"))?
                        .to_string(),
                    leader: field("leader")?
                        .as_bool()
                        .ok_or_else(|| format!("bad leader in {entry}"))?,
                    owned_partitions: field("owned_partitions")?
                        .as_u64()
                        .ok_or_else(|| format!("bad owned_partitions in {entry}"))?,
                })
            })
            .collect()
    }
}

/// A node id as JSON: a number, or a string of digits (the single node's `owner_node` is `"1"`).
pub fn as_id(value: &Value) -> Option<u64> {
    value
        .as_u64()
        .or_else(|| value.as_str().and_then(|text| text.parse().ok()))
}

/// `NARAD_CLUSTER_PEERS` for these members: `1@127.0.0.1:p1,2@127.0.0.1:p2,...`.
pub fn peers_list(members: &[MemberAddrs]) -> String {
    let peers: Vec<String> = members
        .iter()
        .map(|member| format!("{}@{}", member.id, member.cluster))
        .collect();
    peers.join(",")
}

/// Picks `n` pairs of free loopback ports: a TCP one for HTTP and a UDP one for the cluster traffic,
/// each by binding port 0 and reading what the kernel chose. Every socket is held until all are
/// picked, so the pairs are distinct, then dropped, so the members can bind them.
///
/// The race: between the drop and the member's bind, another process may take a port. The kernel
/// hands out ephemeral ports in turn, so a reuse that soon is rare; a member that cannot bind exits
/// before its `http listening` line, and the test fails with its log saying so.
pub fn free_ports(n: usize) -> Vec<(SocketAddr, SocketAddr)> {
    let loopback = SocketAddr::from(([127, 0, 0, 1], 0));
    let held: Vec<(TcpListener, UdpSocket)> = (0..n)
        .map(|_| {
            let tcp = TcpListener::bind(loopback).expect("a free TCP port");
            let udp = UdpSocket::bind(loopback).expect("a free UDP port");
            (tcp, udp)
        })
        .collect();
    held.iter()
        .map(|(tcp, udp)| {
            (
                tcp.local_addr().expect("bound TCP address"),
                udp.local_addr().expect("bound UDP address"),
            )
        })
        .collect()
}

/// The environment of a member.
fn member_env(member: &MemberAddrs, peers: &str, secret: &str) -> Vec<(String, String)> {
    [
        ("NARAD_NODE_ID", member.id.to_string()),
        ("NARAD_HTTP_ADDR", member.http.to_string()),
        ("NARAD_CLUSTER_ADDR", member.cluster.to_string()),
        ("NARAD_CLUSTER_PEERS", peers.to_string()),
        ("NARAD_CLUSTER_SECRET", secret.to_string()),
        ("NARAD_SECURITY_ENABLED", "false".to_string()),
        ("NARAD_LOG_LEVEL", "info".to_string()),
    ]
    .into_iter()
    .map(|(name, value)| (name.to_string(), value))
    .collect()
}

/// Starts a member on a data dir of its own (which the node keeps across restarts and removes at the
/// end), without waiting for anything.
fn launch(binary: &Path, env: Vec<(String, String)>) -> Node {
    let temp = tempfile::tempdir().expect("temporary data dir");
    let data_dir = temp.path().to_path_buf();
    Node::launch(binary, Mode::Member, &data_dir, Some(temp), env)
}

/// A GET that may fail (the member may be down or restarting): the JSON body of a 200, or why not.
fn get_json(addr: SocketAddr, path: &str) -> Result<Value, String> {
    let response: Response =
        http(addr, "GET", path, &[], b"").map_err(|error| format!("GET {path}: {error}"))?;
    if response.status != 200 {
        return Err(format!(
            "GET {path}: {} {}",
            response.status,
            response.text()
        ));
    }
    serde_json::from_slice(&response.body)
        .map_err(|error| format!("GET {path}: {error}: {}", response.text()))
}

/// N `narad` processes forming one cluster on loopback.
pub struct Cluster {
    binary: PathBuf,
    addrs: Vec<MemberAddrs>,
    peers: String,
    /// Member `id` at index `id - 1`; each owns its data dir.
    nodes: Vec<Node>,
    /// Members killed and not restarted.
    down: BTreeSet<u64>,
    /// Released last (fields drop in order): the processes are gone before the next test starts.
    _serial: MutexGuard<'static, ()>,
}

impl Cluster {
    /// Starts `n` members sharing `secret`, and waits until every one logged `ready` and node 1 lists
    /// `n` members alive.
    pub fn start(binary: &Path, n: usize, secret: &str) -> Cluster {
        Cluster::start_with_env(binary, n, secret, |_| Vec::new())
    }

    /// [`Cluster::start`], with `extra(id)` added to member `id`'s environment (kept across
    /// restarts), e.g. a failpoint for one member.
    pub fn start_with_env(
        binary: &Path,
        n: usize,
        secret: &str,
        extra: impl Fn(u64) -> Vec<(String, String)>,
    ) -> Cluster {
        assert!(n >= 1, "a cluster has a member");
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        let addrs: Vec<MemberAddrs> = free_ports(n)
            .into_iter()
            .zip(1..)
            .map(|((http, cluster), id)| MemberAddrs { id, http, cluster })
            .collect();
        Cluster::start_serial(binary, addrs, secret, extra, serial)
    }

    /// [`Cluster::start_with_env`] on the given addresses (member `id` at index `id - 1`), e.g.
    /// members in network namespaces of their own ([`crate::netns::Netns`]).
    pub fn start_at(
        binary: &Path,
        addrs: Vec<MemberAddrs>,
        secret: &str,
        extra: impl Fn(u64) -> Vec<(String, String)>,
    ) -> Cluster {
        assert!(!addrs.is_empty(), "a cluster has a member");
        let serial = SERIAL.lock().unwrap_or_else(|p| p.into_inner());
        Cluster::start_serial(binary, addrs, secret, extra, serial)
    }

    fn start_serial(
        binary: &Path,
        addrs: Vec<MemberAddrs>,
        secret: &str,
        extra: impl Fn(u64) -> Vec<(String, String)>,
        serial: MutexGuard<'static, ()>,
    ) -> Cluster {
        let n = addrs.len();
        let peers = peers_list(&addrs);
        // Every process first, then the waits: a member may only get ready (or even listen) once a
        // quorum of its peers is up.
        let mut nodes: Vec<Node> = addrs
            .iter()
            .map(|member| {
                let mut env = member_env(member, &peers, secret);
                env.extend(extra(member.id));
                launch(binary, env)
            })
            .collect();
        for (node, member) in nodes.iter_mut().zip(&addrs) {
            node.wait_listening();
            assert_eq!(
                node.addr(),
                member.http,
                "member {} listens elsewhere than NARAD_HTTP_ADDR",
                member.id
            );
        }
        for node in &mut nodes {
            node.wait_ready();
        }
        let cluster = Cluster {
            binary: binary.to_path_buf(),
            addrs,
            peers,
            nodes,
            down: BTreeSet::new(),
            _serial: serial,
        };
        cluster.wait_members_alive(1, n);
        cluster
    }

    /// How many members it has.
    pub fn len(&self) -> usize {
        self.nodes.len()
    }

    /// Whether it has no member (never: [`Cluster::start`] refuses).
    pub fn is_empty(&self) -> bool {
        self.nodes.is_empty()
    }

    /// Every member's id, in order.
    pub fn ids(&self) -> Vec<u64> {
        self.addrs.iter().map(|member| member.id).collect()
    }

    /// The ids of the members that are up (not killed, or restarted since).
    pub fn live_ids(&self) -> Vec<u64> {
        self.ids()
            .into_iter()
            .filter(|id| !self.down.contains(id))
            .collect()
    }

    /// Whether member `id` is up.
    pub fn is_up(&self, id: u64) -> bool {
        self.index(id);
        !self.down.contains(&id)
    }

    fn index(&self, id: u64) -> usize {
        let index = id
            .checked_sub(1)
            .and_then(|index| usize::try_from(index).ok())
            .filter(|&index| index < self.nodes.len());
        index.unwrap_or_else(|| panic!("no member {id} in a cluster of {}", self.nodes.len()))
    }

    /// Member `id`'s process.
    pub fn node(&self, id: u64) -> &Node {
        &self.nodes[self.index(id)]
    }

    /// Member `id`'s fixed addresses.
    pub fn addrs(&self, id: u64) -> MemberAddrs {
        self.addrs[self.index(id)]
    }

    /// `NARAD_CLUSTER_PEERS` of the members.
    pub fn peers(&self) -> &str {
        &self.peers
    }

    /// SIGKILLs member `id`, as a crash.
    pub fn kill(&mut self, id: u64) {
        let index = self.index(id);
        self.nodes[index].kill();
        self.down.insert(id);
    }

    /// Starts member `id` again (killing it first if it is up) on its data dir, addresses and
    /// environment, and waits until it logged `ready`: it joined the cluster again and recovered.
    pub fn restart(&mut self, id: u64) {
        let index = self.index(id);
        self.nodes[index].restart();
        assert_eq!(
            self.nodes[index].addr(),
            self.addrs[index].http,
            "member {id} came back elsewhere"
        );
        self.down.remove(&id);
    }

    /// `GET /v1/cluster/members` on member `id`, parsed; `Err` when it cannot answer.
    pub fn try_members(&self, id: u64) -> Result<Vec<Member>, String> {
        let body = get_json(self.node(id).addr(), "/v1/cluster/members")?;
        Member::parse_list(&body)
    }

    /// `GET /v1/cluster/members` on member `id`, parsed; anything but a well-formed 200 fails the test.
    pub fn members(&self, id: u64) -> Vec<Member> {
        self.try_members(id)
            .unwrap_or_else(|error| panic!("members of node {id}: {error}"))
    }

    /// Waits until member `on` lists exactly `n` members, every one alive; returns them.
    pub fn wait_members_alive(&self, on: u64, n: usize) -> Vec<Member> {
        poll_until(
            &format!("node {on} to list {n} members alive"),
            MEMBER_TIMEOUT,
            CLUSTER_POLL_INTERVAL,
            || {
                let members = self.try_members(on).ok()?;
                (members.len() == n && members.iter().all(Member::is_alive)).then_some(members)
            },
        )
    }

    /// The raft leader's id, once every live member names the same live one ([`LEADER_TIMEOUT`]).
    pub fn leader(&self) -> u64 {
        self.leader_within(LEADER_TIMEOUT)
    }

    /// The raft leader's id, once every live member lists exactly one leader and they all name the
    /// same live member; waits at most `timeout`.
    pub fn leader_within(&self, timeout: Duration) -> u64 {
        poll_until(
            "the live members to agree on a live leader",
            timeout,
            CLUSTER_POLL_INTERVAL,
            || {
                let mut named = BTreeSet::new();
                for id in self.live_ids() {
                    let members = self.try_members(id).ok()?;
                    let leaders: Vec<u64> = members
                        .iter()
                        .filter(|member| member.leader)
                        .map(|member| member.id)
                        .collect();
                    if leaders.len() != 1 {
                        return None;
                    }
                    named.insert(leaders[0]);
                }
                let leader = *named.first()?;
                (named.len() == 1 && self.is_up(leader)).then_some(leader)
            },
        )
    }

    /// Waits ([`MEMBER_TIMEOUT`]) until every live member lists member `id` with `status` (`"dead"`
    /// or `"alive"`): the status goes through the replicated log, so every member agrees.
    pub fn wait_member_status(&self, id: u64, status: &str) {
        assert!(
            matches!(status, "alive" | "dead"),
            "a member is alive or dead, not {status:?}"
        );
        self.index(id);
        poll_until(
            &format!("node {id} to be listed {status} by every live member"),
            MEMBER_TIMEOUT,
            CLUSTER_POLL_INTERVAL,
            || {
                self.live_ids()
                    .into_iter()
                    .all(|on| {
                        self.try_members(on).is_ok_and(|members| {
                            members
                                .iter()
                                .any(|member| member.id == id && member.status == status)
                        })
                    })
                    .then_some(())
            },
        )
    }

    /// Starts one more process, id `id`, that lists itself after the members in its peers and proves
    /// `secret` (a wrong one, for a test that it is kept out). Returns once it logged `http
    /// listening`, without waiting for `ready`, which it is expected never to reach.
    pub fn start_extra(&self, id: u64, secret: &str) -> Node {
        assert!(!self.ids().contains(&id), "node {id} is already a member");
        let (http, cluster) = free_ports(1)[0];
        let extra = MemberAddrs { id, http, cluster };
        let peers = format!("{},{}@{}", self.peers, id, cluster);
        let mut node = launch(&self.binary, member_env(&extra, &peers, secret));
        node.wait_listening();
        node
    }

    /// Creates topic `name` on member `on`, retrying while it answers 503 (no metastore quorum yet,
    /// as during an election), at most [`LEADER_TIMEOUT`]; any other answer than 201 or 503 fails
    /// the test. Returns the created topic.
    pub fn create_topic_retrying(&self, on: u64, name: &str, partitions: u32) -> Value {
        let body = format!(r#"{{"name":"{name}","partitions":{partitions}}}"#);
        let addr = self.node(on).addr();
        poll_until(
            &format!("node {on} to create topic {name}"),
            LEADER_TIMEOUT,
            CLUSTER_POLL_INTERVAL,
            || {
                let response = http(addr, "POST", "/v1/topics", &[], body.as_bytes()).ok()?;
                match response.status {
                    201 => Some(response.json()),
                    503 => None,
                    status => panic!("create {name} on node {on}: {status} {}", response.text()),
                }
            },
        )
    }

    /// `GET /v1/topics/{name}` on member `id`: the topic JSON, or why not.
    pub fn try_topic(&self, id: u64, name: &str) -> Result<Value, String> {
        get_json(self.node(id).addr(), &format!("/v1/topics/{name}"))
    }

    /// The owner of every partition of `name` as member `id` sees it (`partition_stats[].owner_node`).
    pub fn try_owners(&self, id: u64, name: &str) -> Result<Vec<u64>, String> {
        let topic = self.try_topic(id, name)?;
        let stats = topic["partition_stats"]
            .as_array()
            .ok_or_else(|| format!("no partition_stats in {topic}"))?;
        stats
            .iter()
            .map(|stat| {
                as_id(&stat["owner_node"]).ok_or_else(|| format!("no owner_node in {stat}"))
            })
            .collect()
    }

    /// Waits until every live member answers `GET /v1/topics/{name}` with `partitions` partitions and
    /// they all name the same owners; returns the owner of each partition.
    pub fn wait_topic(&self, name: &str, partitions: u32) -> Vec<u64> {
        poll_until(
            &format!("every live member to agree on topic {name}"),
            MEMBER_TIMEOUT,
            CLUSTER_POLL_INTERVAL,
            || {
                let mut views = BTreeSet::new();
                for id in self.live_ids() {
                    let owners = self.try_owners(id, name).ok()?;
                    if owners.len() != partitions as usize {
                        return None;
                    }
                    views.insert(owners);
                }
                (views.len() == 1).then(|| views.pop_first().expect("one view"))
            },
        )
    }

    /// Waits until `narad_ingress_dispatch_backlog_records` reads 0 on every live member: each
    /// dispatched every record it accepted.
    pub fn wait_backlogs_drained(&self) {
        for id in self.live_ids() {
            observe::wait_backlog_drained(self.node(id));
        }
    }

    /// The sum over the live members of every series of metric `name` (0 where a member has none, or
    /// cannot answer).
    pub fn metric_sum(&self, name: &str) -> f64 {
        self.live_ids()
            .into_iter()
            .filter_map(|id| http(self.node(id).addr(), "GET", "/metrics", &[], b"").ok())
            .filter(|response| response.status == 200)
            .map(|response| metric_sum(&response.text(), name))
            .sum()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn peers_list_every_member_by_id_and_cluster_address() {
        let member = |id, port| MemberAddrs {
            id,
            http: SocketAddr::from(([127, 0, 0, 1], 1)),
            cluster: SocketAddr::from(([127, 0, 0, 1], port)),
        };
        assert_eq!(
            peers_list(&[member(1, 7961), member(2, 7962)]),
            "1@127.0.0.1:7961,2@127.0.0.1:7962"
        );
    }

    #[test]
    fn free_ports_are_distinct_loopback_ports() {
        let ports = free_ports(3);
        let tcp: BTreeSet<u16> = ports.iter().map(|(tcp, _)| tcp.port()).collect();
        let udp: BTreeSet<u16> = ports.iter().map(|(_, udp)| udp.port()).collect();
        assert_eq!((tcp.len(), udp.len()), (3, 3));
        assert!(ports
            .iter()
            .all(|(tcp, udp)| tcp.ip().is_loopback() && udp.ip().is_loopback()));
    }

    #[test]
    fn members_parse_and_a_malformed_entry_is_named() {
        let body = serde_json::json!({"members":[
            {"id":1,"addr":"127.0.0.1:7961","status":"alive","leader":true,"owned_partitions":2},
            {"id":2,"addr":"127.0.0.1:7962","status":"dead","leader":false,"owned_partitions":0}
        ]});
        let members = Member::parse_list(&body).unwrap();
        assert_eq!(members.len(), 2);
        assert!(members[0].leader && members[0].is_alive());
        assert_eq!((members[1].id, members[1].status.as_str()), (2, "dead"));
        let bad = serde_json::json!({"members":[{"id":1}]});
        assert!(Member::parse_list(&bad).unwrap_err().contains("addr"));
        assert!(Member::parse_list(&serde_json::json!({})).is_err());
    }

    #[test]
    fn owner_ids_are_numbers_or_digit_strings() {
        assert_eq!(as_id(&serde_json::json!(3)), Some(3));
        assert_eq!(as_id(&serde_json::json!("1")), Some(1));
        assert_eq!(as_id(&serde_json::json!("x")), None);
    }
}

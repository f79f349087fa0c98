//! Nodes with Basic auth on, and requests that log in.
//!
//! [`Node::start`] and [`crate::cluster::Cluster`] run with auth off (`--dev`, or
//! `NARAD_SECURITY_ENABLED=false`). Here a single node is started like a cluster member — `narad serve`
//! without `--dev`, configured by its environment, with no `NARAD_CLUSTER_PEERS` (a single node) and
//! no `NARAD_SECURITY_ENABLED` (auth is on by default outside `--dev`), seeding the root user from `NARAD_ADMIN_PASSWORD` when one is given
//! (a random password is logged otherwise). [`SecureCluster`] starts members the way
//! [`crate::cluster::Cluster`] does, but with auth on: its own start-up probe
//! (`GET /v1/cluster/members`, which needs the admin grant) logs in as root.
//!
//! A [`Login`] sends `Authorization: Basic base64(username:password)` with each request.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use base64::Engine as _;

use crate::cluster::{
    free_ports, peers_list, Member, MemberAddrs, CLUSTER_POLL_INTERVAL, LEADER_TIMEOUT,
    MEMBER_TIMEOUT,
};
use crate::observe::poll_until;
use crate::{http, Mode, Node, Response};

/// The root user's name.
pub const ROOT: &str = "admin";
/// The challenge of every 401.
pub const CHALLENGE: &str = "Basic realm=\"narad\"";

/// `Basic base64(username:password)`: an `Authorization` header value.
pub fn basic(username: &str, password: &str) -> String {
    let encoded =
        base64::engine::general_purpose::STANDARD.encode(format!("{username}:{password}"));
    format!("Basic {encoded}")
}

/// A username and password, sent with each request as Basic credentials.
#[derive(Clone, Debug)]
pub struct Login {
    /// The username.
    pub username: String,
    /// The password.
    pub password: String,
    authorization: String,
}

impl Login {
    /// Credentials of `username`.
    pub fn new(username: &str, password: &str) -> Login {
        Login {
            username: username.to_string(),
            password: password.to_string(),
            authorization: basic(username, password),
        }
    }

    /// The root user's credentials.
    pub fn root(password: &str) -> Login {
        Login::new(ROOT, password)
    }

    /// The `Authorization` header value.
    pub fn authorization(&self) -> &str {
        &self.authorization
    }

    /// One request to `node` with these credentials; a transport error fails the test.
    pub fn request(&self, node: &Node, method: &str, path: &str, body: &[u8]) -> Response {
        node.request(
            method,
            path,
            &[("Authorization", &self.authorization)],
            body,
        )
    }

    /// One request to `addr` with these credentials, or why it got no answer (the node may be down).
    pub fn try_request(
        &self,
        addr: SocketAddr,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Result<Response, String> {
        http(
            addr,
            method,
            path,
            &[("Authorization", &self.authorization)],
            body,
        )
        .map_err(|error| format!("{method} {path}: {error}"))
    }

    /// `GET path`.
    pub fn get(&self, node: &Node, path: &str) -> Response {
        self.request(node, "GET", path, b"")
    }

    /// `POST path` with a body.
    pub fn post(&self, node: &Node, path: &str, body: &[u8]) -> Response {
        self.request(node, "POST", path, body)
    }

    /// `PUT path` with a body.
    pub fn put(&self, node: &Node, path: &str, body: &[u8]) -> Response {
        self.request(node, "PUT", path, body)
    }

    /// `PATCH path` with a body.
    pub fn patch(&self, node: &Node, path: &str, body: &[u8]) -> Response {
        self.request(node, "PATCH", path, body)
    }

    /// `DELETE path`.
    pub fn delete(&self, node: &Node, path: &str) -> Response {
        self.request(node, "DELETE", path, b"")
    }
}

/// The environment of a single node with auth on.
fn single_env(admin_password: Option<&str>) -> Vec<(String, String)> {
    let mut env = vec![
        ("NARAD_NODE_ID".to_string(), "1".to_string()),
        ("NARAD_HTTP_ADDR".to_string(), "127.0.0.1:0".to_string()),
    ];
    if let Some(password) = admin_password {
        env.push(("NARAD_ADMIN_PASSWORD".to_string(), password.to_string()));
    }
    env
}

/// Starts a single node with auth on, on a fresh temporary data dir, and waits until it is ready (the
/// root user exists). `admin_password`: `NARAD_ADMIN_PASSWORD`, or none for a generated one (logged).
pub fn start(binary: &Path, admin_password: Option<&str>) -> Node {
    let temp = tempfile::tempdir().expect("temporary data dir");
    let data_dir = temp.path().to_path_buf();
    let mut node = Node::launch(
        binary,
        Mode::Member,
        &data_dir,
        Some(temp),
        single_env(admin_password),
    );
    node.wait_listening();
    node.wait_ready();
    node
}

/// [`start`] on `data_dir`, which the caller keeps (to start another node on it later, with another
/// environment).
pub fn start_in(binary: &Path, data_dir: &Path, admin_password: Option<&str>) -> Node {
    let mut node = Node::launch(
        binary,
        Mode::Member,
        data_dir,
        None,
        single_env(admin_password),
    );
    node.wait_listening();
    node.wait_ready();
    node
}

/// The password of a `seeded the root user with a generated password` log line (`password=...`).
pub fn generated_password(line: &str) -> Option<String> {
    let start = line.find(" password=")? + " password=".len();
    let rest = &line[start..];
    let end = rest.find(' ').unwrap_or(rest.len());
    let password = rest[..end].trim_matches('"');
    (!password.is_empty()).then(|| password.to_string())
}

/// N cluster members with auth on (`NARAD_SECURITY_ENABLED=true`), sharing a cluster secret and a
/// root password. Unlike [`crate::cluster::Cluster`] it takes no process-wide lock: run one at a time
/// per test binary.
pub struct SecureCluster {
    addrs: Vec<MemberAddrs>,
    /// Member `id` at index `id - 1`; each owns its data dir.
    nodes: Vec<Node>,
    root: Login,
}

impl SecureCluster {
    /// Starts `n` members and waits until every one logged `ready` (the root user exists) and node 1,
    /// asked as root, lists `n` members alive.
    pub fn start(binary: &Path, n: usize, secret: &str, admin_password: &str) -> SecureCluster {
        assert!(n >= 1, "a cluster has a member");
        let addrs: Vec<MemberAddrs> = free_ports(n)
            .into_iter()
            .zip(1..)
            .map(|((http, cluster), id)| MemberAddrs { id, http, cluster })
            .collect();
        let peers = peers_list(&addrs);
        // Every process first, then the waits: a member only gets ready once a quorum is up.
        let mut nodes: Vec<Node> = addrs
            .iter()
            .map(|member| {
                let env = [
                    ("NARAD_NODE_ID", member.id.to_string()),
                    ("NARAD_HTTP_ADDR", member.http.to_string()),
                    ("NARAD_CLUSTER_ADDR", member.cluster.to_string()),
                    ("NARAD_CLUSTER_PEERS", peers.clone()),
                    ("NARAD_CLUSTER_SECRET", secret.to_string()),
                    ("NARAD_SECURITY_ENABLED", "true".to_string()),
                    ("NARAD_ADMIN_PASSWORD", admin_password.to_string()),
                ]
                .into_iter()
                .map(|(name, value)| (name.to_string(), value))
                .collect();
                let temp = tempfile::tempdir().expect("temporary data dir");
                let data_dir: PathBuf = temp.path().to_path_buf();
                Node::launch(binary, Mode::Member, &data_dir, Some(temp), env)
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
        let cluster = SecureCluster {
            addrs,
            nodes,
            root: Login::root(admin_password),
        };
        poll_until(
            &format!("node 1 to list {n} members alive"),
            MEMBER_TIMEOUT,
            CLUSTER_POLL_INTERVAL,
            || {
                let members = cluster.try_members(1).ok()?;
                (members.len() == n && members.iter().all(Member::is_alive)).then_some(())
            },
        );
        cluster
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

    /// The root user's credentials.
    pub fn root(&self) -> &Login {
        &self.root
    }

    /// `GET /v1/cluster/members` on member `id` as root, parsed; `Err` when it cannot answer.
    pub fn try_members(&self, id: u64) -> Result<Vec<Member>, String> {
        let response =
            self.root
                .try_request(self.node(id).addr(), "GET", "/v1/cluster/members", b"")?;
        if response.status != 200 {
            return Err(format!("{} {}", response.status, response.text()));
        }
        let body: serde_json::Value = serde_json::from_slice(&response.body)
            .map_err(|error| format!("{error}: {}", response.text()))?;
        Member::parse_list(&body)
    }

    /// A request on member `on` as `login`, repeated while it answers 503 (no metastore quorum yet, as
    /// while the leader settles), at most [`LEADER_TIMEOUT`]; returns the first other answer.
    pub fn request_retrying(
        &self,
        on: u64,
        login: &Login,
        method: &str,
        path: &str,
        body: &[u8],
    ) -> Response {
        let addr = self.node(on).addr();
        poll_until(
            &format!("node {on} to answer {method} {path} with something but 503"),
            LEADER_TIMEOUT,
            CLUSTER_POLL_INTERVAL,
            || {
                let response = login.try_request(addr, method, path, body).ok()?;
                (response.status != 503).then_some(response)
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn basic_credentials_are_base64_of_user_colon_password() {
        assert_eq!(basic("alice", "s3cr3:t"), "Basic YWxpY2U6czNjcjM6dA==");
        assert_eq!(Login::root("pw").authorization(), "Basic YWRtaW46cHc=");
    }

    #[test]
    fn the_generated_password_is_read_from_its_log_line() {
        let line = "2026-01-01T00:00:00Z  WARN narad_node::node: seeded the root user with a \
                    generated password; it is shown this once: change it with PUT \
                    /v1/users/admin/password username=admin password=Ab3dEf";
        assert_eq!(generated_password(line).as_deref(), Some("Ab3dEf"));
        assert_eq!(generated_password("no password here"), None);
    }
}

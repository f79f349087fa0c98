//! Black-box test support: start a real `narad` process on a free loopback port and talk HTTP to it.
//!
//! Decision: the tests themselves live in `narad-node/tests/*.rs`, because only a package's own
//! integration tests get `env!("CARGO_BIN_EXE_narad")` — cargo then builds the binary before the tests,
//! for `cargo test --workspace` and `cargo test -p narad-node` alike. This crate is the reusable part
//! (process control, log capture, a blocking HTTP/1.1 client over `narad bench`'s codec, producers and
//! the ledger they fill, which is the simulator's) that those tests share; `narad-node` takes it as a
//! dev-dependency.
//!
//! A node is started with `--http-addr 127.0.0.1:0 --log-format text`; the harness reads its log lines
//! (stderr) on a thread, learns the bound address from the `http listening` line and readiness from the
//! `ready` line — no polling loops, no sleeps. Every wait is bounded ([`START_TIMEOUT`]). A node is
//! killed (SIGKILL) when dropped; its log is printed if the test panicked, to explain the failure.
//!
//! A cluster member ([`Node::spawn_member`], and [`cluster::Cluster`] for a whole cluster) is started
//! without `--dev` and without address flags: its environment (`NARAD_NODE_ID`, `NARAD_HTTP_ADDR`,
//! `NARAD_CLUSTER_*`, ...) configures it, and is kept for every restart, so a restarted member comes
//! back at the same addresses.

#![forbid(unsafe_code)]

pub mod cluster;
pub mod conn;
pub mod ledger;
pub mod load;
pub mod netns;
pub mod observe;
pub mod raw;
pub mod secure;

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// An entry of a node's environment that is not passed on: the network namespace
/// (`ip netns`) it is started in, at every restart too ([`netns::Netns`]).
pub const NETNS_ENV: &str = "narad-test-netns";

/// Longest wait for a node to bind, become ready, or exit.
pub const START_TIMEOUT: Duration = Duration::from_secs(30);
/// Longest wait for one HTTP exchange.
pub const HTTP_TIMEOUT: Duration = Duration::from_secs(30);
/// The line the node logs once it is ready, with its log target, so that no other `ready` matches.
const READY_LINE: &str = "narad_node::server: ready";

/// How a node is started, kept for its restarts.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Mode {
    /// `narad serve --dev --http-addr 127.0.0.1:0 --data-dir DIR`: a single node.
    Dev,
    /// `narad serve` without `--dev` or address flags: a cluster member, configured by its
    /// environment (which names its HTTP address and data dir).
    Member,
}

/// A running `narad serve` process: a single `--dev` node, or a cluster member.
pub struct Node {
    binary: PathBuf,
    mode: Mode,
    data_dir: PathBuf,
    /// Keeps the temporary data dir alive (and removes it at the end) when the harness made it.
    _temp: Option<tempfile::TempDir>,
    /// Extra environment variables, kept across restarts.
    env: Vec<(String, String)>,
    child: Option<Child>,
    addr: SocketAddr,
    lines: Option<Receiver<String>>,
    log: Arc<Mutex<Vec<String>>>,
}

/// An HTTP answer.
#[derive(Clone, Debug)]
pub struct Response {
    /// Status code.
    pub status: u16,
    /// Headers, names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    /// Body bytes.
    pub body: Vec<u8>,
}

impl Response {
    /// The body as text.
    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }

    /// The body as JSON (panics with the body when it is not JSON).
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|error| panic!("not JSON ({error}): {}", self.text()))
    }

    /// The first value of a header.
    pub fn header(&self, name: &str) -> Option<&str> {
        let name = name.to_ascii_lowercase();
        self.headers
            .iter()
            .find(|(key, _)| *key == name)
            .map(|(_, value)| value.as_str())
    }
}

impl Node {
    /// Starts a node on a fresh temporary data dir and waits until it is ready.
    pub fn start(binary: &Path) -> Node {
        let temp = tempfile::tempdir().expect("temporary data dir");
        let data_dir = temp.path().to_path_buf();
        let mut node = Node::spawn(binary, Mode::Dev, &data_dir, Some(temp), Vec::new());
        node.wait_ready();
        node
    }

    /// Starts a node on `data_dir` (kept after the test) and waits until it is ready.
    pub fn start_in(binary: &Path, data_dir: &Path) -> Node {
        let mut node = Node::spawn(binary, Mode::Dev, data_dir, None, Vec::new());
        node.wait_ready();
        node
    }

    /// Starts a node on a fresh temporary data dir with extra environment variables (kept for every
    /// restart) and waits until it is ready.
    pub fn start_with_env(binary: &Path, env: &[(&str, &str)]) -> Node {
        let temp = tempfile::tempdir().expect("temporary data dir");
        let data_dir = temp.path().to_path_buf();
        let env = env
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        let mut node = Node::spawn(binary, Mode::Dev, &data_dir, Some(temp), env);
        node.wait_ready();
        node
    }

    /// Starts a node on `data_dir` (kept after the test) with extra environment variables (kept for
    /// every restart) and waits until it is ready.
    pub fn start_in_with_env(binary: &Path, data_dir: &Path, env: &[(&str, &str)]) -> Node {
        let env = env
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        let mut node = Node::spawn(binary, Mode::Dev, data_dir, None, env);
        node.wait_ready();
        node
    }

    /// Starts a cluster member: `narad serve --log-format text` without `--dev` or address flags, on
    /// `data_dir` (which the caller keeps; it is passed as `NARAD_DATA_DIR`), configured by `env`
    /// (kept for every restart). Returns once it logged `http listening`, without waiting for `ready`:
    /// a member is ready only once it joined its cluster ([`Node::wait_ready`]).
    pub fn spawn_member(binary: &Path, data_dir: &Path, env: &[(&str, &str)]) -> Node {
        let mut node = Node::launch_member(binary, data_dir, env);
        node.wait_listening();
        node
    }

    /// Starts a cluster member like [`Node::spawn_member`] but returns at once, before it listens:
    /// members that can only listen once a quorum is up are all launched first, then waited for
    /// ([`Node::wait_listening`]). Its [`Node::addr`] is unknown until then.
    pub fn launch_member(binary: &Path, data_dir: &Path, env: &[(&str, &str)]) -> Node {
        let env = env
            .iter()
            .map(|(name, value)| (name.to_string(), value.to_string()))
            .collect();
        Node::launch(binary, Mode::Member, data_dir, None, env)
    }

    fn spawn(
        binary: &Path,
        mode: Mode,
        data_dir: &Path,
        temp: Option<tempfile::TempDir>,
        env: Vec<(String, String)>,
    ) -> Node {
        let mut node = Node::launch(binary, mode, data_dir, temp, env);
        node.wait_listening();
        node
    }

    /// Starts the process and the thread that reads its log; does not wait for anything.
    fn launch(
        binary: &Path,
        mode: Mode,
        data_dir: &Path,
        temp: Option<tempfile::TempDir>,
        env: Vec<(String, String)>,
    ) -> Node {
        // Started inside a network namespace: `ip netns exec` enters it and execs the node in
        // place, so the child's pid is the node's and a SIGKILL reaches it.
        let netns = env
            .iter()
            .find(|(name, _)| name == NETNS_ENV)
            .map(|(_, value)| value.clone());
        let mut command = match &netns {
            Some(namespace) => {
                let mut command = Command::new("ip");
                command.args(["netns", "exec", namespace]).arg(binary);
                command
            }
            None => Command::new(binary),
        };
        // The node refuses `NARAD_*` variables it does not read: the test's own (seeds, rounds) stay
        // with the test.
        for (name, _) in std::env::vars_os() {
            if name.to_string_lossy().starts_with("NARAD_") {
                command.env_remove(name);
            }
        }
        match mode {
            Mode::Dev => {
                command
                    .args([
                        "serve",
                        "--dev",
                        "--http-addr",
                        "127.0.0.1:0",
                        "--log-format",
                        "text",
                    ])
                    .arg("--data-dir")
                    .arg(data_dir);
            }
            Mode::Member => {
                // No address flags: flags override the environment, and a member's fixed addresses
                // come from it (so that a restart keeps them).
                command
                    .args(["serve", "--log-format", "text"])
                    .env("NARAD_DATA_DIR", data_dir);
            }
        }
        command.env("NARAD_LOG_LEVEL", "info");
        let mut child = command
            .envs(
                env.iter()
                    .filter(|(name, _)| name != NETNS_ENV)
                    .map(|(name, value)| (name, value)),
            )
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap_or_else(|error| panic!("cannot start {}: {error}", binary.display()));
        let stderr = child.stderr.take().expect("piped stderr");
        let log = Arc::new(Mutex::new(Vec::new()));
        let (sender, lines) = mpsc::channel();
        let sink = log.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let Ok(line) = line else { break };
                sink.lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .push(line.clone());
                if sender.send(line).is_err() {
                    // Nobody waits for lines any more; keep draining so the node never blocks.
                }
            }
        });
        Node {
            binary: binary.to_path_buf(),
            mode,
            data_dir: data_dir.to_path_buf(),
            _temp: temp,
            env,
            child: Some(child),
            addr: SocketAddr::from(([127, 0, 0, 1], 0)),
            lines: Some(lines),
            log,
        }
    }

    /// Waits (at most [`START_TIMEOUT`]) for the `http listening` line and learns the address from it.
    pub fn wait_listening(&mut self) {
        let listening = self.wait_for_line(|line| line.contains("http listening"));
        self.addr = parse_addr(&listening)
            .unwrap_or_else(|| self.fail(&format!("no address in {listening:?}")));
    }

    /// Waits (at most [`START_TIMEOUT`]) for the `ready` line: recovery done (and, for a cluster
    /// member, the cluster joined).
    pub fn wait_ready(&mut self) {
        self.wait_for_line(|line| line.contains(READY_LINE));
    }

    /// Whether the node logged its `ready` line so far (without waiting).
    pub fn logged_ready(&self) -> bool {
        self.log().iter().any(|line| line.contains(READY_LINE))
    }

    /// Waits (at most [`START_TIMEOUT`]) for a log line matching `wanted`, and returns it.
    #[allow(clippy::disallowed_methods)] // Bounding a wait on a real process needs the real clock.
    pub fn wait_for_line(&mut self, wanted: impl Fn(&str) -> bool) -> String {
        let lines = self.lines.as_ref().expect("log lines are read");
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        loop {
            let left = deadline.saturating_duration_since(std::time::Instant::now());
            match lines.recv_timeout(left) {
                Ok(line) if wanted(&line) => return line,
                Ok(_) => {}
                Err(_) => self.fail("the expected log line never came"),
            }
        }
    }

    fn fail(&self, why: &str) -> ! {
        panic!("{why}; node log:\n{}", self.log().join("\n"));
    }

    /// The node's log lines so far.
    pub fn log(&self) -> Vec<String> {
        self.log.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }

    /// The HTTP address it listens on.
    pub fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// Its data directory.
    pub fn data_dir(&self) -> &Path {
        &self.data_dir
    }

    /// SIGKILL, as a crash: nothing is flushed.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            let _ = child.kill();
            let _ = child.wait();
        }
    }

    /// The running process's id.
    pub fn pid(&self) -> u32 {
        self.child.as_ref().expect("the node is running").id()
    }

    /// Sends `signal` (a name, `STOP`, `CONT`, ...) to the running process.
    pub fn signal(&self, signal: &str) {
        let child = self.child.as_ref().expect("the node is running");
        let status = Command::new("kill")
            .args([&format!("-{signal}"), &child.id().to_string()])
            .status()
            .expect("kill(1) runs");
        assert!(status.success(), "kill -{signal} failed");
    }

    /// SIGTERM, then waits (bounded) for the exit status.
    #[allow(clippy::disallowed_methods)] // Bounding a wait on a real process needs the real clock.
    pub fn terminate(&mut self) -> ExitStatus {
        let mut child = self.child.take().expect("the node is running");
        let status = Command::new("kill")
            .args(["-TERM", &child.id().to_string()])
            .status()
            .expect("kill(1) runs");
        assert!(status.success(), "kill -TERM failed");
        let deadline = std::time::Instant::now() + START_TIMEOUT;
        loop {
            if let Some(status) = child.try_wait().expect("wait for the node") {
                // The log reader may not have read the last lines yet: wait (bounded) for the end of
                // the node's stderr, so `log()` holds everything the node wrote.
                if let Some(lines) = &self.lines {
                    while let Ok(_) | Err(mpsc::RecvTimeoutError::Timeout) = lines
                        .recv_timeout(deadline.saturating_duration_since(std::time::Instant::now()))
                    {
                        if std::time::Instant::now() > deadline {
                            break;
                        }
                    }
                }
                return status;
            }
            if std::time::Instant::now() > deadline {
                let _ = child.kill();
                self.fail("the node did not exit after SIGTERM");
            }
            // Wait for the next log line (or its end) instead of sleeping.
            if let Some(lines) = &self.lines {
                let _ = lines.recv_timeout(Duration::from_millis(50));
            }
        }
    }

    /// Kills the node (SIGKILL) and starts it again on the same data dir.
    pub fn restart(&mut self) {
        self.restart_unready();
        self.wait_ready();
    }

    /// Kills the node (SIGKILL) and starts it again on the same data dir, returning once it listens,
    /// while it may still be recovering (to crash it again mid-recovery).
    pub fn restart_unready(&mut self) {
        self.kill();
        let temp = self._temp.take();
        let env = std::mem::take(&mut self.env);
        let mut next = Node::spawn(&self.binary, self.mode, &self.data_dir, temp, env);
        std::mem::swap(self, &mut next);
        // `next` is now the dead node: nothing left to kill, and its temp dir moved over.
    }

    /// One HTTP exchange: `Connection: close`, body sent with its length.
    pub fn request(
        &self,
        method: &str,
        path: &str,
        headers: &[(&str, &str)],
        body: &[u8],
    ) -> Response {
        http(self.addr, method, path, headers, body)
            .unwrap_or_else(|error| self.fail(&format!("{method} {path}: {error}")))
    }

    /// `GET path`.
    pub fn get(&self, path: &str) -> Response {
        self.request("GET", path, &[], b"")
    }

    /// `POST path` with a body.
    pub fn post(&self, path: &str, body: &[u8]) -> Response {
        self.request("POST", path, &[], body)
    }

    /// `PATCH path` with a body.
    pub fn patch(&self, path: &str, body: &[u8]) -> Response {
        self.request("PATCH", path, &[], body)
    }

    /// `DELETE path`.
    pub fn delete(&self, path: &str) -> Response {
        self.request("DELETE", path, &[], b"")
    }

    /// Creates topic `name` with `partitions` partitions; anything but a 201 fails the test.
    pub fn create_topic(&self, name: &str, partitions: u32) {
        let body = format!(r#"{{"name":"{name}","partitions":{partitions}}}"#);
        let created = self.post("/v1/topics", body.as_bytes());
        assert_eq!(created.status, 201, "{}", created.text());
    }
}

impl Drop for Node {
    fn drop(&mut self) {
        self.kill();
        if std::thread::panicking() {
            eprintln!(
                "--- narad log ({}) ---\n{}",
                self.addr,
                self.log().join("\n")
            );
        }
    }
}

/// Reads `addr=IP:PORT` from a text log line.
fn parse_addr(line: &str) -> Option<SocketAddr> {
    let start = line.find("addr=")? + "addr=".len();
    let rest = &line[start..];
    let end = rest.find(' ').unwrap_or(rest.len());
    rest[..end].parse().ok()
}

/// One request on a connection of its own (`Connection: close`).
pub fn http(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> Result<Response, conn::ConnError> {
    let mut all = Vec::with_capacity(headers.len() + 1);
    all.push(("Connection", "close"));
    all.extend_from_slice(headers);
    conn::Conn::new(addr).request(method, path, &all, body)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn addresses_are_read_from_the_listening_line() {
        let line = "2026-01-01T00:00:00Z  INFO narad_node::server: http listening addr=127.0.0.1:4567 data_dir=/x dev=true";
        assert_eq!(
            parse_addr(line),
            Some(SocketAddr::from(([127, 0, 0, 1], 4567)))
        );
        assert_eq!(parse_addr("nothing"), None);
    }
}

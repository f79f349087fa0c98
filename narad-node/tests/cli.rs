//! Black-box tests of `narad`'s client subcommands (`topic`, `pub`, `sub`, `replay`, `cluster`): a
//! real `narad serve --dev` on a free loopback port, driven by the real binary as a person would,
//! checking what it prints and how it exits.
//!
//! Every CLI run is bounded ([`RUN_TIMEOUT`]) and killed past it, so a client that polls forever
//! fails its test instead of hanging it.

#![allow(clippy::too_many_lines)] // A session of the binary reads best as one script.

use std::io::{Read as _, Write as _};
use std::path::Path;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::thread::JoinHandle;
use std::time::Duration;

use narad_tests::observe::{high_watermarks, poll_until, wait_until};
use narad_tests::Node;
use serde_json::Value;

/// Longest one CLI run may take.
const RUN_TIMEOUT: Duration = Duration::from_secs(60);

fn binary() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_narad"))
}

/// A finished CLI run.
struct Run {
    status: ExitStatus,
    stdout: Vec<u8>,
    stderr: String,
}

impl Run {
    fn stdout(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    fn lines(&self) -> Vec<String> {
        self.stdout().lines().map(str::to_string).collect()
    }

    fn json_lines(&self) -> Vec<Value> {
        self.lines()
            .iter()
            .map(|line| serde_json::from_str(line).unwrap_or_else(|e| panic!("{line:?}: {e}")))
            .collect()
    }
}

/// A CLI process still running; killed if dropped.
struct Running {
    child: Child,
    stdout: Option<JoinHandle<Vec<u8>>>,
    stderr: Option<JoinHandle<Vec<u8>>>,
    what: String,
}

impl Running {
    /// Its exit status once it ended, waiting at most `timeout`; `None` if it still runs.
    #[allow(clippy::disallowed_methods)] // Waiting on a real process needs the real clock.
    fn try_wait_for(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = std::time::Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if std::time::Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    /// Waits (at most [`RUN_TIMEOUT`]) for it to end.
    fn finish(mut self) -> Run {
        let status = poll_until(
            &format!("`{}` to end", self.what),
            RUN_TIMEOUT,
            Duration::from_millis(10),
            || self.child.try_wait().expect("try_wait"),
        );
        let stdout = self.stdout.take().expect("stdout").join().expect("stdout");
        let stderr = self.stderr.take().expect("stderr").join().expect("stderr");
        Run {
            status,
            stdout,
            stderr: String::from_utf8_lossy(&stderr).into_owned(),
        }
    }
}

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// The CLI pointed at one node.
struct Cli {
    url: String,
}

impl Cli {
    fn new(node: &Node) -> Cli {
        Cli {
            url: format!("http://{}", node.addr()),
        }
    }

    /// `narad ARGS -s URL` with `stdin` (nothing when `None`), started.
    fn spawn_with(&self, args: &[&str], stdin: Option<&[u8]>, env: &[(&str, &str)]) -> Running {
        let mut command = Command::new(binary());
        command.args(args);
        if env.iter().all(|(name, _)| *name != "NARAD_ADDR") {
            command.args(["-s", &self.url]);
        }
        for name in ["NARAD_ADDR", "NARAD_USER", "NARAD_PASS"] {
            command.env_remove(name);
        }
        let mut child = command
            .envs(env.iter().copied())
            .stdin(if stdin.is_some() {
                Stdio::piped()
            } else {
                Stdio::null()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start narad");
        if let Some(bytes) = stdin {
            let mut pipe = child.stdin.take().expect("piped stdin");
            pipe.write_all(bytes).expect("write stdin");
            // Dropping the pipe closes it: the end of the message.
        }
        let mut out = child.stdout.take().expect("piped stdout");
        let mut err = child.stderr.take().expect("piped stderr");
        Running {
            child,
            stdout: Some(std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = out.read_to_end(&mut bytes);
                bytes
            })),
            stderr: Some(std::thread::spawn(move || {
                let mut bytes = Vec::new();
                let _ = err.read_to_end(&mut bytes);
                bytes
            })),
            what: format!("narad {}", args.join(" ")),
        }
    }

    fn run(&self, args: &[&str]) -> Run {
        self.spawn_with(args, None, &[]).finish()
    }

    /// Runs `args`, asserting success; its stdout.
    fn ok(&self, args: &[&str]) -> Run {
        let run = self.run(args);
        assert!(
            run.status.success(),
            "narad {args:?}: {} {}",
            run.status,
            run.stderr
        );
        run
    }

    /// Runs `args`, asserting it fails with exit code 1 and `message` on stderr.
    fn fails(&self, args: &[&str], message: &str) -> Run {
        let run = self.run(args);
        assert_eq!(run.status.code(), Some(1), "narad {args:?}: {}", run.stderr);
        assert!(
            run.stderr.contains(message),
            "narad {args:?}: stderr {:?} lacks {message:?}",
            run.stderr
        );
        run
    }
}

/// Waits until `topic`'s watermarks are `marks`.
fn wait_watermarks(node: &Node, topic: &str, marks: &[u64]) {
    wait_until(&format!("{topic} at {marks:?}"), || {
        (high_watermarks(node, topic) == marks).then_some(())
    });
}

#[test]
fn topics_are_created_listed_shown_altered_and_deleted() {
    let node = Node::start(binary());
    let cli = Cli::new(&node);

    let added = cli.ok(&[
        "topic",
        "add",
        "orders",
        "--partitions",
        "4",
        "--retention",
        "2h",
    ]);
    let lines = added.lines();
    assert_eq!(lines.len(), 2, "{lines:?}");
    assert_eq!(
        lines[0].split_whitespace().collect::<Vec<_>>(),
        [
            "NAME",
            "PARTITIONS",
            "RETENTION",
            "RETENTION_BYTES",
            "VISIBILITY",
            "MAX_IN_FLIGHT",
            "MAX_ACKED_AHEAD",
            "CREATED"
        ]
    );
    let row: Vec<&str> = lines[1].split_whitespace().collect();
    assert_eq!(row[..7], ["orders", "4", "2h", "-", "30s", "1024", "1024"]);
    assert!(
        row[7].ends_with('Z') && row[7].len() == 20,
        "created {}",
        row[7]
    );

    let audit = cli.ok(&[
        "topic",
        "add",
        "audit",
        "--json",
        "--visibility",
        "45s",
        "--max-in-flight",
        "8",
    ]);
    let audit = audit.json_lines();
    assert_eq!(audit.len(), 1);
    assert_eq!(
        (
            &audit[0]["name"],
            &audit[0]["partitions"],
            &audit[0]["visibility_timeout_ms"],
            &audit[0]["max_in_flight_per_partition"],
            &audit[0]["retention_ms"]
        ),
        (
            &Value::from("audit"),
            &Value::from(3),
            &Value::from(45_000),
            &Value::from(8),
            &Value::from(604_800_000)
        )
    );
    cli.fails(
        &["topic", "add", "orders"],
        "narad: topic already exists (HTTP 409)",
    );

    let listed = cli.ok(&["topic", "ls"]).lines();
    assert_eq!(listed.len(), 3, "{listed:?}");
    assert!(listed[0].starts_with("NAME "));
    assert!(listed[1].starts_with("audit "), "{listed:?}");
    assert!(listed[2].starts_with("orders "), "{listed:?}");
    // One topic per page: the listing follows next_page_token to the end.
    let paged = cli
        .ok(&["topic", "ls", "--json", "--limit", "1"])
        .json_lines();
    let names: Vec<&str> = paged.iter().map(|t| t["name"].as_str().unwrap()).collect();
    assert_eq!(names, ["audit", "orders"]);
    // The address from the environment, as NARAD_ADDR.
    let from_env = cli
        .spawn_with(
            &["topic", "ls", "--json"],
            None,
            &[("NARAD_ADDR", &cli.url)],
        )
        .finish();
    assert!(from_env.status.success(), "{}", from_env.stderr);
    assert_eq!(from_env.json_lines(), paged);

    let info = cli.ok(&["topic", "info", "orders"]).lines();
    assert_eq!(info.len(), 2 + 1 + 1 + 4, "{info:?}");
    assert!(info[1].starts_with("orders "));
    assert_eq!(info[2], "");
    assert_eq!(
        info[3].split_whitespace().collect::<Vec<_>>(),
        [
            "PARTITION",
            "OLDEST",
            "NEXT",
            "HIGH_WATERMARK",
            "SEGMENTS",
            "SIZE_BYTES",
            "OWNER"
        ]
    );
    assert_eq!(
        info[7].split_whitespace().collect::<Vec<_>>(),
        ["3", "0", "0", "0", "0", "0", "1"]
    );
    let info = cli.ok(&["topic", "info", "orders", "--json"]).json_lines();
    assert_eq!(info.len(), 1);
    assert_eq!(info[0]["partition_stats"].as_array().unwrap().len(), 4);
    assert_eq!(info[0]["retention_ms"], 7_200_000);

    let edited = cli
        .ok(&[
            "topic",
            "edit",
            "orders",
            "--partitions",
            "6",
            "--retention",
            "3h",
            "--json",
        ])
        .json_lines();
    assert_eq!(
        (&edited[0]["partitions"], &edited[0]["retention_ms"]),
        (&Value::from(6), &Value::from(10_800_000))
    );
    assert_eq!(high_watermarks(&node, "orders").len(), 6);
    let edited = cli.ok(&["topic", "edit", "orders", "--max-acked-ahead", "16"]);
    assert_eq!(
        edited.lines()[1].split_whitespace().collect::<Vec<_>>()[..7],
        ["orders", "6", "3h", "-", "30s", "1024", "16"]
    );
    let edited = cli.ok(&["topic", "edit", "orders", "--retention-bytes", "10GiB"]);
    assert_eq!(
        edited.lines()[1].split_whitespace().collect::<Vec<_>>()[..4],
        ["orders", "6", "3h", "10GiB"]
    );
    let edited = cli
        .ok(&[
            "topic",
            "edit",
            "orders",
            "--retention-bytes",
            "2MB",
            "--json",
        ])
        .json_lines();
    assert_eq!(edited[0]["retention_bytes"], 2_000_000);
    // A bad size is the flag parser's usage error (exit 2), before any request.
    let bad = cli.run(&["topic", "edit", "orders", "--retention-bytes", "1.5GiB"]);
    assert_eq!(bad.status.code(), Some(2), "{}", bad.stderr);
    assert!(
        bad.stderr
            .contains("\"1.5GiB\" is not a size such as 10GiB"),
        "{}",
        bad.stderr
    );
    cli.fails(
        &["topic", "edit", "orders", "--retention-bytes", "1KiB"],
        "retention_bytes must be 0 (no bound) or at least 1048576 (HTTP 400)",
    );
    cli.fails(&["topic", "edit", "orders"], "nothing to change");
    cli.fails(
        &["topic", "edit", "orders", "--partitions", "3"],
        "(HTTP 400)",
    );

    assert_eq!(
        cli.ok(&["topic", "rm", "orders"]).stdout(),
        "deleted topic orders\n"
    );
    cli.fails(
        &["topic", "info", "orders"],
        "narad: topic not found (HTTP 404)",
    );
    cli.fails(&["topic", "rm", "orders"], "topic not found (HTTP 404)");
    assert_eq!(
        cli.ok(&["topic", "rm", "audit", "--json"]).json_lines(),
        [serde_json::json!({"deleted": "audit"})]
    );
    assert_eq!(cli.ok(&["topic", "ls", "--json"]).stdout(), "");
}

#[test]
fn published_messages_replay_and_peek_as_the_exact_payloads() {
    let node = Node::start(binary());
    let cli = Cli::new(&node);
    cli.ok(&["topic", "add", "cli"]);

    assert_eq!(
        cli.ok(&["pub", "cli", "first", "--partition", "0"])
            .stdout(),
        "1 accepted\n"
    );
    cli.ok(&["pub", "cli", r#"{"n": 1}"#, "--partition", "0"]);
    let from_stdin = cli
        .spawn_with(
            &["pub", "cli", "-", "--partition", "0"],
            Some(b"from stdin\n"),
            &[],
        )
        .finish();
    assert!(from_stdin.status.success(), "{}", from_stdin.stderr);
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("binary");
    let binary_payload = [0x00, 0x01, 0xff, b'\n'];
    std::fs::write(&file, binary_payload).expect("write the file");
    cli.ok(&[
        "pub",
        "cli",
        "--file",
        file.to_str().unwrap(),
        "--partition",
        "0",
    ]);
    let many = cli.ok(&["pub", "cli", "again", "--partition", "0", "--count", "20"]);
    assert!(
        many.stdout().starts_with("20 accepted, 0 failed in "),
        "{}",
        many.stdout()
    );
    let paced = cli.ok(&[
        "pub",
        "cli",
        "paced",
        "--partition",
        "0",
        "--count",
        "3",
        "--rate",
        "50",
        "--json",
    ]);
    let paced = paced.json_lines();
    assert_eq!(
        (&paced[0]["accepted"], &paced[0]["failed"]),
        (&Value::from(3), &Value::from(0))
    );
    // Three sends at 50/s: the third is due 40 ms after the first.
    assert!(paced[0]["elapsed_ms"].as_u64().unwrap() >= 40, "{paced:?}");
    wait_watermarks(&node, "cli", &[27, 0, 0]);

    let mut expected: Vec<u8> = b"first\n{\"n\": 1}\nfrom stdin\n\n".to_vec();
    expected.extend_from_slice(&binary_payload);
    expected.push(b'\n');
    expected.extend(b"again\n".repeat(20));
    expected.extend(b"paced\n".repeat(3));
    let replayed = cli.ok(&["replay", "cli", "--partition", "0", "--raw"]);
    assert_eq!(
        String::from_utf8_lossy(&replayed.stdout),
        String::from_utf8_lossy(&expected)
    );
    assert_eq!(replayed.stdout, expected);

    let human = cli.ok(&[
        "replay",
        "cli",
        "--partition",
        "0",
        "--from",
        "1",
        "--to",
        "4",
    ]);
    assert_eq!(
        human.stdout(),
        "0/1 - {\"n\": 1}\n0/2 - from stdin\n\n0/3 - base64:AAH/Cg==\n"
    );
    let json = cli
        .ok(&[
            "replay",
            "cli",
            "--partition",
            "0",
            "--from",
            "3",
            "--to",
            "4",
            "--json",
        ])
        .json_lines();
    assert_eq!(json.len(), 1);
    assert_eq!(
        (
            &json[0]["topic"],
            &json[0]["partition"],
            &json[0]["offset"],
            &json[0]["payload"],
            &json[0]["payload_encoding"]
        ),
        (
            &Value::from("cli"),
            &Value::from(0),
            &Value::from(3),
            &Value::from("AAH/Cg=="),
            &Value::from("base64")
        )
    );
    // Past the high watermark: nothing, and no error.
    assert_eq!(
        cli.ok(&[
            "replay",
            "cli",
            "--partition",
            "0",
            "--from",
            "27",
            "--to",
            "40"
        ])
        .stdout(),
        ""
    );

    let peeked = cli.ok(&[
        "sub",
        "cli",
        "--peek",
        "--partition",
        "0",
        "--from",
        "0",
        "--count",
        "27",
        "--raw",
    ]);
    assert_eq!(peeked.stdout, expected);

    // A key picks its partition: FNV-1a("customer-42") mod 3 = 1.
    cli.ok(&["pub", "cli", "keyed", "-k", "customer-42"]);
    wait_watermarks(&node, "cli", &[27, 1, 0]);
    assert_eq!(
        cli.ok(&["replay", "cli", "--partition", "1"]).stdout(),
        "1/0 customer-42 keyed\n"
    );

    // Peek from the high watermark on: only what is produced after it started.
    cli.ok(&["pub", "cli", "early", "--partition", "2"]);
    wait_watermarks(&node, "cli", &[27, 1, 1]);
    let mut late = cli.spawn_with(
        &["sub", "cli", "--peek", "--count", "1", "--raw"],
        None,
        &[],
    );
    let mut ended = None;
    for _ in 0..50 {
        cli.ok(&["pub", "cli", "late", "--partition", "2"]);
        ended = late.try_wait_for(Duration::from_millis(500));
        if ended.is_some() {
            break;
        }
    }
    assert!(ended.is_some(), "sub --peek never printed a late message");
    let late = late.finish();
    assert!(late.status.success(), "{}", late.stderr);
    assert_eq!(late.stdout(), "late\n");
}

#[test]
fn failures_exit_non_zero_with_the_servers_message() {
    let node = Node::start(binary());
    let cli = Cli::new(&node);

    let missing = cli.fails(
        &["pub", "missing", "hello"],
        "narad: topic not found (HTTP 404)",
    );
    assert_eq!(missing.stdout(), "");
    // A refused message is refused again: the run stops at the first one.
    let run = cli.fails(
        &["pub", "missing", "hello", "--count", "5"],
        "narad: topic not found (HTTP 404)",
    );
    let summary = run.stdout();
    assert!(
        summary.starts_with("0 accepted, 1 failed in ")
            && summary.ends_with("; stopped with 4 not sent\n"),
        "{summary}"
    );

    cli.ok(&["topic", "add", "three"]);
    cli.fails(
        &["pub", "three", "x", "--partition", "9"],
        "invalid argument: partition out of range (HTTP 400)",
    );
    cli.fails(&["pub", "three"], "no message");
    cli.fails(
        &["replay", "missing", "--partition", "0"],
        "topic not found (HTTP 404)",
    );
    cli.fails(
        &["sub", "missing", "--peek", "--count", "1"],
        "topic not found (HTTP 404)",
    );
    cli.fails(
        &["pub", "three", "--file", "/nonexistent/narad-cli-test"],
        "cannot read /nonexistent/narad-cli-test",
    );

    // Flags clap refuses: exit code 2.
    let bad = cli.run(&["sub", "three", "--from", "0"]);
    assert_eq!(bad.status.code(), Some(2), "{}", bad.stderr);
    let bad = cli.run(&["pub", "three", "x", "--count", "0"]);
    assert_eq!(bad.status.code(), Some(2), "{}", bad.stderr);

    // No node there: port 1 on loopback refuses connections.
    let nobody = Command::new(binary())
        .args(["topic", "ls", "-s", "http://127.0.0.1:1"])
        .env_remove("NARAD_ADDR")
        .output()
        .expect("run narad");
    assert_eq!(nobody.status.code(), Some(1));
    assert!(
        String::from_utf8_lossy(&nobody.stderr)
            .contains("narad: cannot reach the node at http://127.0.0.1:1"),
        "{}",
        String::from_utf8_lossy(&nobody.stderr)
    );
    let tls = Command::new(binary())
        .args(["topic", "ls", "-s", "https://127.0.0.1:1"])
        .output()
        .expect("run narad");
    assert_eq!(tls.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&tls.stderr).contains("plain http only"));
}

#[test]
fn cluster_members_lists_the_dev_node() {
    let node = Node::start(binary());
    let cli = Cli::new(&node);
    let table = cli.ok(&["cluster", "members"]).lines();
    assert_eq!(table.len(), 2, "{table:?}");
    let header: Vec<&str> = table[0].split_whitespace().collect();
    assert_eq!(header[..3], ["ID", "ADDR", "STATUS"]);
    let row: Vec<&str> = table[1].split_whitespace().collect();
    assert_eq!((row[0], row[2]), ("1", "alive"), "{row:?}");
    let json = cli.ok(&["cluster", "members", "--json"]).json_lines();
    assert_eq!(json.len(), 1);
    let members = json[0]["members"].as_array().expect("members");
    assert_eq!(members.len(), 1);
    assert_eq!(
        (&members[0]["id"], &members[0]["status"]),
        (&Value::from(1), &Value::from("alive"))
    );
}

#[test]
fn a_single_node_has_no_moves_and_refuses_to_rebalance() {
    let node = Node::start(binary());
    let cli = Cli::new(&node);
    assert_eq!(
        cli.ok(&["cluster", "moves"]).lines(),
        ["TOPIC  PARTITION  FROM  TO  STATE  COPIED_BYTES"]
    );
    assert_eq!(
        cli.ok(&["cluster", "moves", "--json"]).json_lines(),
        [serde_json::json!({"moves": []})]
    );
    // A node without peers is no cluster: there is nowhere to move a partition to.
    let refused = cli.fails(
        &["cluster", "rebalance"],
        "narad: partition moves need a cluster: this node runs alone (cluster.peers is empty) (HTTP 409)",
    );
    assert_eq!(refused.stdout(), "");
    // Its only member is a metastore voter, which never leaves; once it owns partitions, nobody
    // could take them either.
    cli.fails(
        &["cluster", "decommission", "1"],
        "narad: member 1 cannot be decommissioned: below_min_voters (HTTP 409)",
    );
    cli.ok(&["topic", "add", "orders"]);
    cli.fails(
        &["cluster", "move", "orders", "0", "--to", "2"],
        "partition moves need a cluster",
    );
    cli.fails(
        &["cluster", "decommission", "1"],
        "member 1 cannot be decommissioned: no_receivers, below_min_voters (HTTP 409)",
    );
    cli.fails(
        &["cluster", "decommission", "9"],
        "narad: member not found (HTTP 404)",
    );
    // Cancelling a decommission that never began changes nothing, and says so as JSON too.
    assert_eq!(
        cli.ok(&["cluster", "decommission", "1", "--cancel", "--json"])
            .json_lines(),
        [serde_json::json!({"id": 1, "draining": false})]
    );
    let members = cli.ok(&["cluster", "members", "--json"]).json_lines();
    assert_eq!(
        (
            &members[0]["members"][0]["draining"],
            &members[0]["members"][0]["outbound_moves"]
        ),
        (&Value::from(false), &Value::from(0))
    );
}

#[test]
fn queue_mode_sub_receives_and_acks_every_message() {
    let node = Node::start(binary());
    let cli = Cli::new(&node);
    cli.ok(&["topic", "add", "jobs"]);
    let payloads: Vec<String> = (0..12).map(|n| format!("job-{n}")).collect();
    for payload in &payloads {
        cli.ok(&["pub", "jobs", payload]);
    }
    wait_until("12 visible jobs", || {
        (high_watermarks(&node, "jobs").iter().sum::<u64>() == 12).then_some(())
    });

    let received = cli.ok(&["sub", "jobs", "--count", "12", "--raw"]);
    let mut got = received.lines();
    got.sort();
    let mut want = payloads.clone();
    want.sort();
    assert_eq!(got, want, "stderr: {}", received.stderr);

    // Every one was acked: nothing is left to lease, now or once the leases would have run out.
    let empty = node.get("/v1/topics/jobs/consume?wait=0s");
    assert_eq!(empty.status, 204, "{}", empty.text());

    // Unacked (`--no-ack`), a message stays leased: JSON output carries its receipt handle.
    cli.ok(&["pub", "jobs", "once", "--partition", "1"]);
    let leased = cli
        .ok(&[
            "sub",
            "jobs",
            "--partition",
            "1",
            "--count",
            "1",
            "--no-ack",
            "--json",
        ])
        .json_lines();
    assert_eq!(leased[0]["payload"], "once");
    let handle = leased[0]["receipt_handle"]
        .as_str()
        .expect("receipt_handle");
    let parts: Vec<&str> = handle.split(':').collect();
    assert_eq!((parts.len(), parts[0]), (3, "1"), "{handle}");
    let acked = node.post(&format!("/v1/topics/jobs/ack?receipt_handle={handle}"), b"");
    assert_eq!(acked.status, 204, "{}", acked.text());
}

//! The root user, grant and password changes, users across restarts and a cluster, the users
//! API, and hashes imported from the Go release.

use super::*;

/// The root user can't be deleted (by itself or another admin), nor its grants or password changed by
/// another admin; only root grants admin; a second admin still manages ordinary users; root changes
/// its own password only with the right `current_password`.
#[test]
fn the_root_user_is_protected_and_alone_grants_admin() {
    let (node, root) = start();
    assert_forbidden(&root.delete(&node, "/v1/users/admin"), "yourself");

    let ops = create_user(
        &node,
        &root,
        "ops",
        "ops-password",
        json!([{"action": "admin"}]),
    );
    assert_eq!(
        ok_json(&root.get(&node, "/v1/users/ops"))["grants"],
        json!([{"action": "admin", "patterns": []}])
    );
    let root_user = ok_json(&ops.get(&node, "/v1/users/admin"));
    assert_eq!(
        (&root_user["username"], &root_user["root"]),
        (&json!(ROOT), &json!(true))
    );

    assert_error(
        &ops.delete(&node, "/v1/users/admin"),
        403,
        "forbidden: the root user cannot be deleted",
    );
    assert_error(
        &set_grants(
            &node,
            &ops,
            ROOT,
            json!([{"action": "produce", "patterns": ["x"]}]),
        ),
        403,
        "forbidden: the root user's grants cannot change",
    );
    assert_eq!(
        ok_json(&root.get(&node, "/v1/users/admin")).get("grants"),
        None
    );
    assert_forbidden(
        &set_password(
            &node,
            &ops,
            ROOT,
            json!({"new_password": "taken-over-root"}),
        ),
        "root",
    );
    assert_forbidden(
        &set_password(
            &node,
            &ops,
            ROOT,
            json!({"current_password": ROOT_PASSWORD, "new_password": "taken-over-root"}),
        ),
        "root",
    );
    assert_unauthenticated(&Login::root("taken-over-root").get(&node, "/v1/topics"));
    // Only root grants admin: neither at creation nor by changing grants.
    let body =
        json!({"username": "ops2", "password": "ops2-password", "grants": [{"action": "admin"}]});
    assert_forbidden(
        &ops.post(&node, "/v1/users", body.to_string().as_bytes()),
        "admin",
    );
    assert_error(&root.get(&node, "/v1/users/ops2"), 404, "user not found");
    let writer = create_user(
        &node,
        &ops,
        "writer",
        "writer-password",
        json!([{"action": "produce", "patterns": ["logs"]}]),
    );
    assert_forbidden(
        &set_grants(&node, &ops, "writer", json!([{"action": "admin"}])),
        "admin",
    );
    assert_eq!(
        ok_json(&root.get(&node, "/v1/users/writer"))["grants"],
        json!([{"action": "produce", "patterns": ["logs"]}])
    );
    assert_eq!(writer.get(&node, "/v1/topics").status, 200);
    // The second admin can't delete itself either, but may delete an ordinary user.
    assert_forbidden(&ops.delete(&node, "/v1/users/ops"), "yourself");

    // Root's own password: the right current password is required.
    assert_forbidden(
        &set_password(
            &node,
            &root,
            ROOT,
            json!({"current_password": "not-the-root-pw", "new_password": "root-password-2"}),
        ),
        "current_password",
    );
    assert_eq!(root.get(&node, "/v1/topics").status, 200);
    let changed = set_password(
        &node,
        &root,
        ROOT,
        json!({"current_password": ROOT_PASSWORD, "new_password": "root-password-2"}),
    );
    assert_eq!(
        (changed.status, changed.body.len()),
        (204, 0),
        "{}",
        changed.text()
    );
    assert_unauthenticated(&root.get(&node, "/v1/topics"));
    assert_eq!(
        Login::root("root-password-2")
            .get(&node, "/v1/topics")
            .status,
        200
    );
}

/// A change of grants is seen by the holder's next request, and a deleted user's next request is a 401.
#[test]
fn grant_changes_and_deletions_take_effect_at_the_next_request() {
    let (node, root) = start();
    create_topic(&node, &root, "t1");
    let user = create_user(
        &node,
        &root,
        "flipper",
        "flipper-password",
        json!([{"action": "produce", "patterns": ["t*"]}]),
    );
    assert_accepted(&produce(&node, &user, "t1", "?partition=1"));

    let changed = ok_json(&set_grants(
        &node,
        &root,
        "flipper",
        json!([{"action": "consume", "patterns": ["t*"]}]),
    ));
    assert_eq!(
        changed["grants"],
        json!([{"action": "consume", "patterns": ["t*"]}])
    );
    assert_forbidden(&produce(&node, &user, "t1", "?partition=1"), "produce");
    // The consume grant holds: nothing was produced to partition 0, so the replay is empty.
    let replay = user.get(&node, "/v1/topics/t1/consume?partition=0&offset=0");
    assert_eq!(
        (replay.status, replay.body.len()),
        (204, 0),
        "{}",
        replay.text()
    );

    let restored = ok_json(&set_grants(
        &node,
        &root,
        "flipper",
        json!([{"action": "produce", "patterns": ["t*"]}]),
    ));
    assert_eq!(
        restored["grants"],
        json!([{"action": "produce", "patterns": ["t*"]}])
    );
    assert_accepted(&produce(&node, &user, "t1", "?partition=1"));

    let deleted = root.delete(&node, "/v1/users/flipper");
    assert_eq!((deleted.status, deleted.body.len()), (204, 0));
    assert_unauthenticated(&produce(&node, &user, "t1", "?partition=1"));
    assert_error(&root.get(&node, "/v1/users/flipper"), 404, "user not found");
    assert_error(
        &root.delete(&node, "/v1/users/flipper"),
        404,
        "user not found",
    );
}

/// A user changes its own password with `current_password` (missing: 400, wrong: 403); the old one
/// is refused at once and the new one accepted. A non-admin can't change another's password; an
/// admin can, without `current_password`.
#[test]
fn a_password_change_takes_effect_at_once() {
    let (node, root) = start();
    let carol = create_user(&node, &root, "carol", "carol-password", json!([]));
    let dave = create_user(&node, &root, "dave", "dave-password", json!([]));
    assert_eq!(carol.get(&node, "/v1/topics").status, 200);

    let missing = set_password(
        &node,
        &carol,
        "carol",
        json!({"new_password": "carol-password-2"}),
    );
    assert_eq!(missing.status, 400, "{}", missing.text());
    assert!(
        error_of(&missing).contains("current_password"),
        "{}",
        missing.text()
    );
    assert_forbidden(
        &set_password(
            &node,
            &carol,
            "carol",
            json!({"current_password": "wrong-password", "new_password": "carol-password-2"}),
        ),
        "current_password",
    );
    assert_forbidden(
        &set_password(
            &node,
            &carol,
            "dave",
            json!({"new_password": "dave-password-2"}),
        ),
        "own password",
    );
    assert_eq!(dave.get(&node, "/v1/topics").status, 200);

    let changed = set_password(
        &node,
        &carol,
        "carol",
        json!({"current_password": "carol-password", "new_password": "carol-password-2"}),
    );
    assert_eq!(
        (changed.status, changed.body.len()),
        (204, 0),
        "{}",
        changed.text()
    );
    assert_unauthenticated(&carol.get(&node, "/v1/topics"));
    let carol = Login::new("carol", "carol-password-2");
    assert_eq!(
        ok_json(&carol.get(&node, "/v1/topics")),
        json!({"topics": [], "next_page_token": ""})
    );

    // An admin resets another user's password without the current one.
    let reset = set_password(
        &node,
        &root,
        "dave",
        json!({"new_password": "dave-password-3"}),
    );
    assert_eq!(
        (reset.status, reset.body.len()),
        (204, 0),
        "{}",
        reset.text()
    );
    assert_unauthenticated(&dave.get(&node, "/v1/topics"));
    assert_eq!(
        Login::new("dave", "dave-password-3")
            .get(&node, "/v1/topics")
            .status,
        200
    );
}

/// Users and grants survive a restart on the same data dir, and the root seeded from
/// `NARAD_ADMIN_PASSWORD` is not seeded again: after a restart with another `NARAD_ADMIN_PASSWORD` the
/// first password still logs in and the new one does not.
#[test]
fn users_survive_a_restart_and_the_root_is_seeded_once() {
    let data = tempfile::tempdir().expect("data dir");
    let mut node = secure::start_in(binary(), data.path(), Some(ROOT_PASSWORD));
    let root = Login::root(ROOT_PASSWORD);
    let seeded = |node: &Node| {
        node.log()
            .iter()
            .any(|line| line.contains("seeded the root user from NARAD_ADMIN_PASSWORD"))
    };
    assert!(seeded(&node), "{}", node.log().join("\n"));
    create_topic(&node, &root, "keep");
    let keeper = create_user(
        &node,
        &root,
        "keeper",
        "keeper-password",
        json!([{"action": "produce", "patterns": ["keep"]}]),
    );
    assert_accepted(&produce(&node, &keeper, "keep", ""));

    node.restart();
    assert!(!seeded(&node), "seeded again:\n{}", node.log().join("\n"));
    assert_accepted(&produce(&node, &keeper, "keep", ""));
    assert_forbidden(&produce(&node, &keeper, "other", ""), "produce");
    let listed = ok_json(&root.get(&node, "/v1/users"));
    let users = listed["users"].as_array().expect("users");
    let names: Vec<&str> = users
        .iter()
        .map(|user| user["username"].as_str().expect("username"))
        .collect();
    assert_eq!(names, [ROOT, "keeper"]);
    assert_eq!(
        users[1]["grants"],
        json!([{"action": "produce", "patterns": ["keep"]}])
    );

    node.kill();
    drop(node);
    let node = secure::start_in(binary(), data.path(), Some("another-root-password"));
    assert_eq!(root.get(&node, "/v1/users/keeper").status, 200);
    assert_unauthenticated(&Login::root("another-root-password").get(&node, "/v1/topics"));
    assert!(
        !seeded(&node),
        "the root was seeded again:\n{}",
        node.log().join("\n")
    );
}

/// Without `NARAD_ADMIN_PASSWORD` the root gets a random password, logged once at WARN; it logs in.
#[test]
fn a_generated_root_password_is_logged_and_logs_in() {
    let node = secure::start(binary(), None);
    let log = node.log();
    let seeded: Vec<&String> = log
        .iter()
        .filter(|line| line.contains("seeded the root user with a generated password"))
        .collect();
    assert_eq!(seeded.len(), 1, "{}", log.join("\n"));
    assert!(seeded[0].contains("WARN"), "{}", seeded[0]);
    let password = secure::generated_password(seeded[0])
        .unwrap_or_else(|| panic!("no password= in {}", seeded[0]));
    assert!(password.len() >= 16, "a short password: {password:?}");

    let root = Login::root(&password);
    let me = ok_json(&root.get(&node, "/v1/users/admin"));
    assert_eq!((&me["username"], &me["root"]), (&json!(ROOT), &json!(true)));
    assert_unauthenticated(&Login::root(ROOT_PASSWORD).get(&node, "/v1/topics"));
}

/// The users API checks what it stores: names, password lengths, grant actions and patterns; grants
/// are normalized; names are unique; users are listed in name order; non-admins are refused.
#[test]
fn the_users_api_validates_and_normalizes() {
    let (node, root) = start();
    let post = |body: Value| root.post(&node, "/v1/users", body.to_string().as_bytes());

    let created = post(json!({
        "username": "norm.user_1-x",
        "password": "12345678",
        "grants": [
            {"action": "create", "patterns": ["b", "a"]},
            {"action": "produce", "patterns": ["z", "a", "z"]},
            {"action": "produce", "patterns": ["m*"]},
        ],
    }));
    assert_eq!(created.status, 201, "{}", created.text());
    let user = created.json();
    assert_eq!(
        user["grants"],
        json!([
            {"action": "produce", "patterns": ["a", "m*", "z"]},
            {"action": "create", "patterns": ["a", "b"]},
        ])
    );
    assert_eq!(user["created_at_ms"], user["updated_at_ms"]);
    let keys: Vec<&String> = user.as_object().expect("object").keys().collect();
    assert_eq!(
        keys,
        ["created_at_ms", "grants", "updated_at_ms", "username"]
    );
    // No grants: the field is left out.
    let bare = post(json!({"username": "bare", "password": "bare-password"}));
    assert_eq!(bare.status, 201, "{}", bare.text());
    let keys: Vec<String> = bare
        .json()
        .as_object()
        .expect("object")
        .keys()
        .cloned()
        .collect();
    assert_eq!(keys, ["created_at_ms", "updated_at_ms", "username"]);

    for (body, status) in [
        (
            json!({"username": "norm.user_1-x", "password": "12345678"}),
            409,
        ),
        (json!({"username": "bad name", "password": "12345678"}), 400),
        (json!({"username": "", "password": "12345678"}), 400),
        (
            json!({"username": "x".repeat(65), "password": "12345678"}),
            400,
        ),
        (json!({"username": "short", "password": "1234567"}), 400),
        (
            json!({"username": "long", "password": "p".repeat(1025)}),
            400,
        ),
        (
            json!({"username": "act", "password": "12345678", "grants": [{"action": "delete", "patterns": ["x"]}]}),
            400,
        ),
        (
            json!({"username": "adm", "password": "12345678", "grants": [{"action": "admin", "patterns": ["x"]}]}),
            400,
        ),
        (
            json!({"username": "nopat", "password": "12345678", "grants": [{"action": "produce"}]}),
            400,
        ),
    ] {
        let response = post(body.clone());
        assert_eq!(response.status, status, "{body}: {}", response.text());
        assert!(!error_of(&response).is_empty());
    }
    // The longest name and password are accepted.
    let longest = json!({"username": "y".repeat(64), "password": "p".repeat(1024)});
    assert_eq!(post(longest).status, 201);

    let listed = ok_json(&root.get(&node, "/v1/users"));
    let names: Vec<&str> = listed["users"]
        .as_array()
        .expect("users")
        .iter()
        .map(|user| user["username"].as_str().expect("username"))
        .collect();
    let y64 = "y".repeat(64);
    assert_eq!(names, [ROOT, "bare", "norm.user_1-x", y64.as_str()]);
    assert_error(&root.get(&node, "/v1/users/ghost"), 404, "user not found");

    // A user without the admin grant is refused every users route but its own password.
    let plain = Login::new("bare", "bare-password");
    assert_forbidden(&plain.get(&node, "/v1/users"), "admin");
    assert_forbidden(&plain.get(&node, "/v1/users/bare"), "admin");
    assert_forbidden(
        &plain.post(
            &node,
            "/v1/users",
            br#"{"username":"sneaky","password":"12345678"}"#,
        ),
        "admin",
    );
    assert_forbidden(&plain.delete(&node, "/v1/users/norm.user_1-x"), "admin");
    assert_forbidden(
        &set_grants(
            &node,
            &plain,
            "bare",
            json!([{"action": "produce", "patterns": ["*"]}]),
        ),
        "admin",
    );
    assert!(ok_json(&root.get(&node, "/v1/users/bare"))
        .get("grants")
        .is_none());
}

/// In a cluster of three with auth on, a user created through node 1 logs in on nodes 2 and 3 and
/// produces there per its grant; grants changed through node 3 hold on node 2.
#[test]
fn users_are_shared_by_every_cluster_member() {
    let cluster = SecureCluster::start(binary(), 3, "security-cluster-secret", ROOT_PASSWORD);
    let root = cluster.root().clone();

    let topic = json!({"name": "shared", "partitions": 3}).to_string();
    let created = cluster.request_retrying(1, &root, "POST", "/v1/topics", topic.as_bytes());
    assert_eq!(created.status, 201, "{}", created.text());
    assert_eq!(created.json()["owner"], ROOT);
    let user = json!({
        "username": "roamer",
        "password": "roamer-password",
        "grants": [{"action": "produce", "patterns": ["shared"]}],
    })
    .to_string();
    let created = cluster.request_retrying(1, &root, "POST", "/v1/users", user.as_bytes());
    assert_eq!(created.status, 201, "{}", created.text());
    let roamer = Login::new("roamer", "roamer-password");

    for id in [2, 3] {
        let node = cluster.node(id);
        // Asked as root (so that no failed login of roamer's is spent while it replicates).
        let seen = wait_until(&format!("node {id} to see roamer and topic shared"), || {
            let user = root.get(node, "/v1/users/roamer");
            let topic = root.get(node, "/v1/topics/shared");
            (user.status == 200 && topic.status == 200).then(|| user.json())
        });
        assert_eq!(
            seen["grants"],
            json!([{"action": "produce", "patterns": ["shared"]}])
        );
        for partition in 0..3 {
            // Every partition: some are owned by another member, so the produce is dispatched there.
            assert_accepted(&produce(
                node,
                &roamer,
                "shared",
                &format!("?partition={partition}"),
            ));
        }
        assert_forbidden(
            &roamer.get(node, "/v1/topics/shared/consume?partition=0&offset=0"),
            "consume",
        );
        assert_unauthenticated(&Login::new("roamer", "not-roamer-pw").get(node, "/v1/topics"));
    }

    let regranted = cluster.request_retrying(
        3,
        &root,
        "PUT",
        "/v1/users/roamer/grants",
        json!({"grants": [{"action": "consume", "patterns": ["shared"]}]})
            .to_string()
            .as_bytes(),
    );
    assert_eq!(
        ok_json(&regranted)["grants"],
        json!([{"action": "consume", "patterns": ["shared"]}])
    );
    let node2 = cluster.node(2);
    poll_until(
        "node 2 to see roamer's new grants",
        narad_tests::cluster::MEMBER_TIMEOUT,
        narad_tests::cluster::CLUSTER_POLL_INTERVAL,
        || {
            let user = root.get(node2, "/v1/users/roamer");
            (user.status == 200
                && user.json()["grants"] == json!([{"action": "consume", "patterns": ["shared"]}]))
            .then_some(())
        },
    );
    assert_forbidden(&produce(node2, &roamer, "shared", ""), "produce");
    // The consume grant now holds on node 2: the records produced to partition 0 replay.
    let replayed = wait_until("roamer to replay partition 0 through node 2", || {
        let response = roamer.get(node2, "/v1/topics/shared/consume?partition=0&offset=0");
        match response.status {
            200 => Some(response.json()),
            204 => None,
            status => panic!("replay: {status} {}", response.text()),
        }
    });
    assert_eq!(
        (
            &replayed["topic"],
            &replayed["offset"],
            &replayed["payload"]
        ),
        (&json!("shared"), &json!(0), &json!({"n": 1}))
    );
}

/// A user carried over from the Go release with its bcrypt hash (`password_hash` instead of
/// `password`) logs in with its old password, and after a password change with the new one only; a
/// hash that is not bcrypt, or given beside a password, is refused.
#[test]
fn a_bcrypt_hash_from_the_go_release_is_imported_and_logs_in() {
    let (node, admin) = start();
    let hash = bcrypt::hash("go-era-password", 4).unwrap();
    let body = json!({
        "username": "legacy",
        "password_hash": hash,
        "grants": [{"action": "produce", "patterns": ["*"]}],
    });
    let created = admin.post(&node, "/v1/users", body.to_string().as_bytes());
    assert_eq!(created.status, 201, "{}", created.text());
    assert!(created.json().get("password_hash").is_none());
    create_topic(&node, &admin, "legacy-topic");
    let legacy = Login::new("legacy", "go-era-password");
    assert_accepted(&produce(&node, &legacy, "legacy-topic", ""));
    assert_unauthenticated(&produce(
        &node,
        &Login::new("legacy", "go-era-passwore"),
        "legacy-topic",
        "",
    ));
    let changed = set_password(
        &node,
        &legacy,
        "legacy",
        json!({"current_password": "go-era-password", "new_password": "rust-era-password"}),
    );
    assert_eq!(changed.status, 204, "{}", changed.text());
    assert_unauthenticated(&produce(&node, &legacy, "legacy-topic", ""));
    assert_accepted(&produce(
        &node,
        &Login::new("legacy", "rust-era-password"),
        "legacy-topic",
        "",
    ));
    for bad in [
        json!({"username": "x1", "password_hash": "$argon2id$v=19$m=1,t=1,p=1$c2FsdA$aGFzaA"}),
        json!({"username": "x2", "password_hash": "$2b$04$short"}),
        json!({"username": "x3", "password": "long-enough", "password_hash": hash}),
        json!({"username": "x4"}),
    ] {
        let refused = admin.post(&node, "/v1/users", bad.to_string().as_bytes());
        assert_eq!(refused.status, 400, "{bad}: {}", refused.text());
    }
}

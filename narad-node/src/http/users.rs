//! Users routes (the surface's Users API): create, list, get, delete, replace grants, change password.
//!
//! Every route but the password change needs an admin caller. Who may propose what is checked here,
//! against the caller as the local replica holds it; what a command may do to the stored users (root
//! can't be deleted, its grants are fixed, one root) is the replicated state's rule, so it holds
//! whichever replica proposes.
//!
//! Replies: `username, grants?, root?, created_at_ms, updated_at_ms` (`grants` omitted when empty,
//! `root` when false), never the hash.

use narad_core::metastore::users::{Action, Grant, User};
use narad_core::metastore::{Applied, Command};
use serde::Deserialize;

use super::auth::{self, Caller};
use super::reply::{json_array, json_string, JsonObject};
use super::topics::{parse_json, propose_error};
use super::{App, Body, Reply};
use crate::clock;

/// A grant as the API reads and writes it.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantRequest {
    action: String,
    #[serde(default)]
    patterns: Vec<String>,
}

/// `POST /v1/users` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct CreateRequest {
    username: String,
    #[serde(default)]
    password: String,
    /// A hash imported from the Go release (bcrypt), instead of `password`.
    #[serde(default)]
    password_hash: String,
    #[serde(default)]
    grants: Vec<GrantRequest>,
}

/// `PUT /v1/users/{u}/grants` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct GrantsRequest {
    grants: Vec<GrantRequest>,
}

/// `PUT /v1/users/{u}/password` body.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct PasswordRequest {
    #[serde(default)]
    current_password: String,
    new_password: String,
}

fn forbidden(message: &str) -> Reply {
    Reply::error(403, &format!("forbidden: {message}"))
}

fn need_admin(caller: &Caller) -> Result<(), Reply> {
    if caller.is_admin() {
        Ok(())
    } else {
        Err(forbidden("the users API needs the admin grant"))
    }
}

/// The grants of a request, checked against what `caller` may pass on.
fn grants_of(caller: &Caller, requested: Vec<GrantRequest>) -> Result<Vec<Grant>, Reply> {
    let mut grants = Vec::with_capacity(requested.len());
    for grant in requested {
        let action = Action::parse(&grant.action).ok_or_else(|| {
            Reply::error(
                400,
                &format!(
                    "invalid argument: grant action {:?} must be produce, consume, create or admin",
                    grant.action
                ),
            )
        })?;
        grants.push(Grant {
            action,
            patterns: grant.patterns,
        });
    }
    let grants = narad_core::metastore::users::normalize_grants(&grants)
        .map_err(|error| super::topics::topic_error(&error))?;
    if let Caller::User(user) = caller {
        if let Some(grant) = grants.iter().find(|grant| !user.may_pass_on(grant)) {
            return Err(if grant.action == Action::Admin {
                forbidden("only the root user grants admin")
            } else {
                forbidden(&format!(
                    "you can only pass on {} grants you hold",
                    grant.action.as_str()
                ))
            });
        }
    }
    Ok(grants)
}

/// A user's JSON.
pub fn user_json(user: &User) -> String {
    let mut object = JsonObject::new().string("username", &user.username);
    if !user.grants.is_empty() {
        let grants: Vec<String> = user
            .grants
            .iter()
            .map(|grant| {
                let patterns: Vec<String> = grant.patterns.iter().map(|p| json_string(p)).collect();
                JsonObject::new()
                    .string("action", grant.action.as_str())
                    .raw("patterns", &json_array(&patterns))
                    .finish()
            })
            .collect();
        object = object.raw("grants", &json_array(&grants));
    }
    if user.root {
        object = object.raw("root", "true");
    }
    object
        .number("created_at_ms", user.created_at_ms)
        .number("updated_at_ms", user.updated_at_ms)
        .finish()
}

fn settle(result: Result<Reply, Reply>) -> Reply {
    match result {
        Ok(reply) | Err(reply) => reply,
    }
}

/// `POST /v1/users` → 201 user.
pub async fn create_user(app: &App, caller: &Caller, body: Body) -> Reply {
    settle(create(app, caller, body).await)
}

async fn create(app: &App, caller: &Caller, body: Body) -> Result<Reply, Reply> {
    need_admin(caller)?;
    let request: CreateRequest = parse_json(body)?;
    narad_core::metastore::users::validate_username(&request.username)
        .map_err(|error| super::topics::topic_error(&error))?;
    let import = !request.password_hash.is_empty();
    if import {
        if !request.password.is_empty() || !auth::is_bcrypt_hash(&request.password_hash) {
            return Err(Reply::error(
                400,
                "invalid argument: give either password or a bcrypt password_hash ($2a$, $2b$ or $2y$)",
            ));
        }
    } else {
        auth::check_new_password(&request.password)
            .map_err(|message| Reply::error(400, &message))?;
    }
    let grants = grants_of(caller, request.grants)?;
    let password_hash = if import {
        request.password_hash
    } else {
        let password = request.password;
        auth::offload(move || auth::hash_password(&password)).await
    };
    let command = Command::CreateUser(narad_core::metastore::users::CreateUser {
        username: request.username,
        password_hash,
        grants,
        root: false,
        at_ms: clock::unix_ms(),
    });
    match app.metastore.propose(command).await {
        Ok(Applied::UserCreated(user)) => Ok(Reply::json(201, user_json(&user))),
        Ok(other) => Err(unexpected(other)),
        Err(error) => Err(propose_error(error)),
    }
}

/// `GET /v1/users` → `{"users":[…]}`, in name order.
pub fn list_users(app: &App, caller: &Caller) -> Reply {
    if let Err(reply) = need_admin(caller) {
        return reply;
    }
    let view = app.metastore.view();
    let users: Vec<String> = view.state.users().iter().map(user_json).collect();
    Reply::json(
        200,
        JsonObject::new().raw("users", &json_array(&users)).finish(),
    )
}

/// `GET /v1/users/{u}` → user.
pub fn get_user(app: &App, caller: &Caller, username: &str) -> Reply {
    if let Err(reply) = need_admin(caller) {
        return reply;
    }
    match app.metastore.view().state.users().get(username) {
        Some(user) => Reply::json(200, user_json(user)),
        None => Reply::error(404, "user not found"),
    }
}

/// `DELETE /v1/users/{u}` → 204 (never root, never oneself).
pub async fn delete_user(app: &App, caller: &Caller, username: &str) -> Reply {
    if let Err(reply) = need_admin(caller) {
        return reply;
    }
    if caller.username() == username {
        return forbidden("you cannot delete yourself");
    }
    let command = Command::DeleteUser {
        username: username.to_string(),
    };
    match app.metastore.propose(command).await {
        Ok(Applied::UserDeleted(_)) => Reply::empty(204),
        Ok(other) => unexpected(other),
        Err(error) => propose_error(error),
    }
}

/// `PUT /v1/users/{u}/grants` → 200 user (replaces the whole set; never root's).
pub async fn set_grants(app: &App, caller: &Caller, username: &str, body: Body) -> Reply {
    settle(regrant(app, caller, username, body).await)
}

async fn regrant(app: &App, caller: &Caller, username: &str, body: Body) -> Result<Reply, Reply> {
    need_admin(caller)?;
    let request: GrantsRequest = parse_json(body)?;
    let grants = grants_of(caller, request.grants)?;
    let command = Command::SetGrants {
        username: username.to_string(),
        grants,
        at_ms: clock::unix_ms(),
    };
    match app.metastore.propose(command).await {
        Ok(Applied::GrantsSet(user)) => Ok(Reply::json(200, user_json(&user))),
        Ok(other) => Err(unexpected(other)),
        Err(error) => Err(propose_error(error)),
    }
}

/// `PUT /v1/users/{u}/password` → 204. A user changes its own password with `current_password`; an
/// admin changes another's without it, except root's, which only root changes.
pub async fn set_password(app: &App, caller: &Caller, username: &str, body: Body) -> Reply {
    settle(repassword(app, caller, username, body).await)
}

async fn repassword(
    app: &App,
    caller: &Caller,
    username: &str,
    body: Body,
) -> Result<Reply, Reply> {
    let own = caller.username() == username;
    if !own && !caller.is_admin() {
        return Err(forbidden("you can only change your own password"));
    }
    let request: PasswordRequest = parse_json(body)?;
    let target = app
        .metastore
        .view()
        .state
        .users()
        .get(username)
        .cloned()
        .ok_or_else(|| Reply::error(404, "user not found"))?;
    if target.root && !own && matches!(caller, Caller::User(_)) {
        return Err(forbidden("only the root user changes its password"));
    }
    auth::check_new_password(&request.new_password)
        .map_err(|message| Reply::error(400, &message))?;
    if own {
        let (hash, current) = (target.password_hash.clone(), request.current_password);
        if current.is_empty() {
            return Err(Reply::error(
                400,
                "invalid argument: current_password required to change your own password",
            ));
        }
        if !auth::offload(move || auth::verify_password(&hash, &current)).await {
            return Err(forbidden("current_password is wrong"));
        }
    }
    let password = request.new_password;
    let password_hash = auth::offload(move || auth::hash_password(&password)).await;
    let command = Command::SetPassword {
        username: username.to_string(),
        password_hash,
        at_ms: clock::unix_ms(),
    };
    match app.metastore.propose(command).await {
        Ok(Applied::PasswordSet(_)) => Ok(Reply::empty(204)),
        Ok(other) => Err(unexpected(other)),
        Err(error) => Err(propose_error(error)),
    }
}

fn unexpected(applied: Applied) -> Reply {
    tracing::error!(
        ?applied,
        "metastore answered a user command with another outcome"
    );
    Reply::error(500, "user update failed")
}

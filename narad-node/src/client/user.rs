//! `narad user add|grant|ls|rm|passwd`: the `/v1/users` routes. `--json` prints the server's JSON
//! (`ls`: one user per line); otherwise a table, or nothing but the exit code.

use serde_json::{json, Value};

use super::http::{segment, Client, Reply};
use super::output::{print_line, table};
use crate::cli::{GrantArg, UserArgs, UserCommand};

/// `narad user …`.
pub fn run(args: &UserArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.client)?;
    let json = args.client.json;
    match &args.command {
        UserCommand::Add {
            name,
            new_password,
            grants,
        } => {
            let body = json!({
                "username": name,
                "password": new_password,
                "grants": grants_json(grants),
            });
            let reply = client
                .post("/v1/users", &[], body.to_string().as_bytes())?
                .expect(201)?;
            print_user(&reply, json)
        }
        UserCommand::Grant { name, grants } => {
            let body = json!({ "grants": grants_json(grants) });
            let reply = client
                .put(&user_path(name, "/grants"), body.to_string().as_bytes())?
                .expect(200)?;
            print_user(&reply, json)
        }
        UserCommand::Ls => {
            let reply = client.get("/v1/users", &[])?.expect(200)?;
            let body: Value = reply.json()?;
            let users = body["users"].as_array().cloned().unwrap_or_default();
            if json {
                for user in &users {
                    print_line(user.to_string().as_bytes())?;
                }
                return Ok(());
            }
            print_line(users_table(&users).trim_end().as_bytes())
        }
        UserCommand::Rm { name } => {
            client.delete(&user_path(name, ""))?.expect(204)?;
            Ok(())
        }
        UserCommand::Passwd {
            name,
            new_password,
            current_password,
        } => {
            let mut body = json!({ "new_password": new_password });
            if let Some(current) = current_password {
                body["current_password"] = json!(current);
            }
            client
                .put(&user_path(name, "/password"), body.to_string().as_bytes())?
                .expect(204)?;
            Ok(())
        }
    }
}

fn user_path(name: &str, tail: &str) -> String {
    format!("/v1/users/{}{tail}", segment(name))
}

fn grants_json(grants: &[GrantArg]) -> Value {
    grants
        .iter()
        .map(|grant| json!({ "action": grant.action, "patterns": grant.patterns }))
        .collect()
}

fn print_user(reply: &Reply, json: bool) -> anyhow::Result<()> {
    if json {
        return print_line(reply.json_line());
    }
    let user: Value = reply.json()?;
    print_line(users_table(&[user]).trim_end().as_bytes())
}

/// `produce:orders-*,audit consume:audit`, or `root` / `-`.
fn grants_cell(user: &Value) -> String {
    if user["root"] == true {
        return "root".to_string();
    }
    let grants: Vec<String> = user["grants"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|grant| {
            let action = grant["action"].as_str().unwrap_or("?");
            let patterns: Vec<&str> = grant["patterns"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(Value::as_str)
                .collect();
            if patterns.is_empty() {
                action.to_string()
            } else {
                format!("{action}:{}", patterns.join(","))
            }
        })
        .collect();
    if grants.is_empty() {
        "-".to_string()
    } else {
        grants.join(" ")
    }
}

/// The users as a table.
fn users_table(users: &[Value]) -> String {
    let rows: Vec<Vec<String>> = users
        .iter()
        .map(|user| {
            vec![
                user["username"].as_str().unwrap_or("?").to_string(),
                grants_cell(user),
            ]
        })
        .collect();
    table(&["USERNAME", "GRANTS"], &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_table_shows_root_and_grants() {
        let users = [
            json!({"username": "admin", "root": true, "created_at_ms": 1, "updated_at_ms": 1}),
            json!({"username": "svc", "grants": [
                {"action": "produce", "patterns": ["audit", "orders-*"]},
                {"action": "admin", "patterns": []}
            ], "created_at_ms": 1, "updated_at_ms": 1}),
            json!({"username": "idle", "created_at_ms": 1, "updated_at_ms": 1}),
        ];
        assert_eq!(
            users_table(&users),
            "USERNAME  GRANTS\n\
             admin     root\n\
             svc       produce:audit,orders-* admin\n\
             idle      -\n"
        );
    }
}

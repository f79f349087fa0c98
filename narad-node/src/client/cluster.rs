//! `narad cluster members|moves|move|rebalance|decommission`: the `/v1/cluster` routes (admin).
//! `--json` prints the server's JSON (or, for answers without a body, what was done as one JSON
//! line); otherwise a table or a sentence.

use serde_json::{json, Value};

use super::http::Client;
use super::output::{cell, print_line, table};
use crate::cli::{ClusterArgs, ClusterCommand};

/// A member's fields, in the order shown. Only those some member has become columns, so a node
/// that does not report one (Narad's members carry no `leader`) shows no empty column for it.
const MEMBER_FIELDS: [&str; 7] = [
    "id",
    "addr",
    "status",
    "leader",
    "draining",
    "owned_partitions",
    "outbound_moves",
];

/// The columns of `cluster moves`, and the JSON field each shows.
const MOVE_COLUMNS: [(&str, &str); 6] = [
    ("TOPIC", "topic"),
    ("PARTITION", "partition"),
    ("FROM", "from"),
    ("TO", "to"),
    ("STATE", "state"),
    ("COPIED_BYTES", "copied_bytes"),
];

/// `narad cluster …`.
pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.client)?;
    let json = args.client.json;
    match &args.command {
        ClusterCommand::Members => {
            let reply = client.get("/v1/cluster/members", &[])?.expect(200)?;
            if json {
                return print_line(reply.json_line());
            }
            let body: Value = reply.json()?;
            let members = body["members"].as_array().cloned().unwrap_or_default();
            print_line(members_table(&members).trim_end().as_bytes())
        }
        ClusterCommand::Moves => {
            let reply = client.get("/v1/cluster/moves", &[])?.expect(200)?;
            if json {
                return print_line(reply.json_line());
            }
            let body: Value = reply.json()?;
            let moves = body["moves"].as_array().cloned().unwrap_or_default();
            print_line(moves_table(&moves).trim_end().as_bytes())
        }
        ClusterCommand::Move {
            topic,
            partition,
            to,
        } => {
            let body = json!({ "topic": topic, "partition": partition, "to": to });
            client
                .post("/v1/cluster/moves", &[], body.to_string().as_bytes())?
                .expect(202)?;
            let line = if json {
                body.to_string()
            } else {
                format!(
                    "moving {topic}/{partition} to member {to} (`narad cluster moves` follows it)"
                )
            };
            print_line(line.as_bytes())
        }
        ClusterCommand::Rebalance => {
            let reply = client
                .post("/v1/cluster/rebalance", &[], b"")?
                .expect(200)?;
            if json {
                return print_line(reply.json_line());
            }
            let body: Value = reply.json()?;
            let planned = body["planned"].as_u64().unwrap_or(0);
            print_line(planned_line(planned).as_bytes())
        }
        ClusterCommand::Decommission { id, cancel, force } => {
            let path = format!("/v1/cluster/members/{id}/decommission");
            let reply = if *cancel {
                client.delete(&path)?
            } else if *force {
                client.post(&path, &[("force", "true")], b"")?
            } else {
                client.post(&path, &[], b"")?
            };
            reply.expect(204)?;
            let draining = !*cancel;
            let line = if json {
                json!({ "id": id, "draining": draining }).to_string()
            } else if draining {
                format!("member {id} is draining: its partitions move away (`narad cluster moves`)")
            } else {
                format!(
                    "member {id} is no longer draining; its moves not yet switched were aborted"
                )
            };
            print_line(line.as_bytes())
        }
    }
}

/// `N moves planned`, or why none was.
fn planned_line(planned: u64) -> String {
    match planned {
        0 => "no move planned: the partitions are even, or the moves in flight are at their limit"
            .to_string(),
        1 => "1 move planned".to_string(),
        n => format!("{n} moves planned"),
    }
}

/// The members as a table.
fn members_table(members: &[Value]) -> String {
    let fields: Vec<&str> = MEMBER_FIELDS
        .into_iter()
        .filter(|field| members.iter().any(|member| member.get(field).is_some()))
        .collect();
    let headers: Vec<String> = fields.iter().map(|field| field.to_uppercase()).collect();
    let headers: Vec<&str> = headers.iter().map(String::as_str).collect();
    let rows: Vec<Vec<String>> = members
        .iter()
        .map(|member| fields.iter().map(|field| cell(member.get(field))).collect())
        .collect();
    table(&headers, &rows)
}

/// The moves as a table (its header alone when none is in flight).
fn moves_table(moves: &[Value]) -> String {
    let headers: Vec<&str> = MOVE_COLUMNS.iter().map(|(header, _)| *header).collect();
    let rows: Vec<Vec<String>> = moves
        .iter()
        .map(|moving| {
            MOVE_COLUMNS
                .iter()
                .map(|(_, field)| cell(moving.get(field)))
                .collect()
        })
        .collect();
    table(&headers, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_are_the_fields_members_have() {
        let members = [
            serde_json::json!({"id": 1, "addr": "127.0.0.1:7943", "status": "alive", "leader": true,
                               "owned_partitions": 3}),
            serde_json::json!({"id": 2, "addr": "127.0.0.1:7945", "status": "dead", "leader": false}),
        ];
        assert_eq!(
            members_table(&members),
            "ID  ADDR            STATUS  LEADER  OWNED_PARTITIONS\n\
             1   127.0.0.1:7943  alive   true    3\n\
             2   127.0.0.1:7945  dead    false   -\n"
        );
        let draining = [
            json!({"id": 4, "addr": "h:1", "status": "alive", "leader": false,
                   "owned_partitions": 2, "draining": true, "outbound_moves": 2}),
        ];
        assert_eq!(
            members_table(&draining),
            "ID  ADDR  STATUS  LEADER  DRAINING  OWNED_PARTITIONS  OUTBOUND_MOVES\n\
             4   h:1   alive   false   true      2                 2\n"
        );
    }

    #[test]
    fn moves_show_every_column_even_when_there_are_none() {
        assert_eq!(
            moves_table(&[]),
            "TOPIC  PARTITION  FROM  TO  STATE  COPIED_BYTES\n"
        );
        let moves = [
            json!({"topic": "orders", "partition": 2, "from": 1, "to": 3, "state": "copying",
                   "copied_bytes": 1048576}),
            json!({"topic": "audit", "partition": 0, "from": 2, "to": 1, "state": "frozen",
                   "copied_bytes": 0}),
        ];
        assert_eq!(
            moves_table(&moves),
            "TOPIC   PARTITION  FROM  TO  STATE    COPIED_BYTES\n\
             orders  2          1     3   copying  1048576\n\
             audit   0          2     1   frozen   0\n"
        );
    }

    #[test]
    fn the_planned_count_reads_as_a_sentence() {
        assert_eq!(planned_line(1), "1 move planned");
        assert_eq!(planned_line(3), "3 moves planned");
        assert!(planned_line(0).starts_with("no move planned"));
    }
}

//! `narad cluster members`: `GET /v1/cluster/members`.

use serde_json::Value;

use super::http::Client;
use super::output::{cell, print_line, table};
use crate::cli::{ClusterArgs, ClusterCommand};

/// A member's fields, in the order shown. Only those some member has become columns: Narad's
/// members also carry `draining` and `outbound_moves`, this node's carry `leader`.
const MEMBER_FIELDS: [&str; 7] = [
    "id",
    "addr",
    "status",
    "leader",
    "draining",
    "owned_partitions",
    "outbound_moves",
];

/// `narad cluster …`.
pub fn run(args: &ClusterArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.client)?;
    match args.command {
        ClusterCommand::Members => {
            let reply = client.get("/v1/cluster/members", &[])?.expect(200)?;
            if args.client.json {
                return print_line(reply.json_line());
            }
            let body: Value = reply.json()?;
            let members = body["members"].as_array().cloned().unwrap_or_default();
            print_line(members_table(&members).trim_end().as_bytes())
        }
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
    }
}

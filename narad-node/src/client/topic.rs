//! `narad topic add|ls|info|edit|rm`: the `/v1/topics` routes. `--json` prints the server's JSON
//! (`ls`: one topic per line, over every page); otherwise small tables.

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Map, Value};

use super::http::{topic_path, Client, Reply};
use super::output::{cell, duration_ms, print_line, size_bytes, table, utc_time};
use crate::cli::{TopicAddArgs, TopicArgs, TopicCommand, TopicEditArgs};

/// The columns of a topic's row, and the JSON field each shows.
const TOPIC_COLUMNS: [(&str, &str); 7] = [
    ("NAME", "name"),
    ("PARTITIONS", "partitions"),
    ("RETENTION", "retention_ms"),
    ("RETENTION_BYTES", "retention_bytes"),
    ("VISIBILITY", "visibility_timeout_ms"),
    ("MAX_IN_FLIGHT", "max_in_flight_per_partition"),
    ("MAX_ACKED_AHEAD", "max_acked_ahead_per_partition"),
];

/// The columns of `topic info`'s partition table, and the JSON field each shows.
const PARTITION_COLUMNS: [(&str, &str); 7] = [
    ("PARTITION", "index"),
    ("OLDEST", "oldest_offset"),
    ("NEXT", "next_offset"),
    ("HIGH_WATERMARK", "high_watermark"),
    ("SEGMENTS", "segments"),
    ("SIZE_BYTES", "size_bytes"),
    ("OWNER", "owner_node"),
];

/// `narad topic …`.
pub fn run(args: &TopicArgs) -> anyhow::Result<()> {
    let client = Client::new(&args.client)?;
    let json = args.client.json;
    match &args.command {
        TopicCommand::Add(add) => {
            let body = Value::Object(add_fields(add)).to_string();
            let reply = client
                .post("/v1/topics", &[], body.as_bytes())?
                .expect(201)?;
            print_topic(&reply, json)
        }
        TopicCommand::Ls(ls) => list(&client, ls.limit, json),
        TopicCommand::Info { name } => {
            let reply = client.get(&topic_path(name), &[])?.expect(200)?;
            if json {
                return print_line(reply.json_line());
            }
            let topic: Value = reply.json()?;
            let stats = topic["partition_stats"]
                .as_array()
                .cloned()
                .unwrap_or_default();
            let rows: Vec<Vec<String>> = stats
                .iter()
                .map(|stat| {
                    PARTITION_COLUMNS
                        .iter()
                        .map(|(_, field)| cell(stat.get(field)))
                        .collect()
                })
                .collect();
            let headers: Vec<&str> = PARTITION_COLUMNS
                .iter()
                .map(|(header, _)| *header)
                .collect();
            let text = format!(
                "{}\n{}",
                topic_table(std::slice::from_ref(&topic)),
                table(&headers, &rows)
            );
            print_line(text.trim_end().as_bytes())
        }
        TopicCommand::Edit(edit) => {
            let fields = edit_fields(edit);
            if fields.is_empty() {
                anyhow::bail!(
                    "nothing to change: give --partitions, --retention, --retention-bytes, \
                     --max-in-flight or --max-acked-ahead"
                );
            }
            let body = Value::Object(fields).to_string();
            let reply = client
                .patch(&topic_path(&edit.name), body.as_bytes())?
                .expect(200)?;
            print_topic(&reply, json)
        }
        TopicCommand::Rm { name } => {
            client.delete(&topic_path(name))?.expect(204)?;
            let line = if json {
                serde_json::json!({ "deleted": name }).to_string()
            } else {
                format!("deleted topic {name}")
            };
            print_line(line.as_bytes())
        }
    }
}

/// The create body: the name and every flag given (the node defaults the others).
fn add_fields(args: &TopicAddArgs) -> Map<String, Value> {
    let mut fields = Map::new();
    fields.insert("name".to_string(), Value::from(args.name.as_str()));
    let optional = [
        ("partitions", args.partitions.map(u64::from)),
        ("retention_ms", args.retention),
        ("retention_bytes", args.retention_bytes),
        ("visibility_timeout_ms", args.visibility),
        (
            "max_in_flight_per_partition",
            args.max_in_flight.map(u64::from),
        ),
        (
            "max_acked_ahead_per_partition",
            args.max_acked_ahead.map(u64::from),
        ),
    ];
    insert_given(&mut fields, optional);
    fields
}

/// The alter body: the flags given. (No `visibility_timeout_ms`: the API refuses it on alter.)
fn edit_fields(args: &TopicEditArgs) -> Map<String, Value> {
    let mut fields = Map::new();
    let optional = [
        ("partitions", args.partitions.map(u64::from)),
        ("retention_ms", args.retention),
        ("retention_bytes", args.retention_bytes),
        (
            "max_in_flight_per_partition",
            args.max_in_flight.map(u64::from),
        ),
        (
            "max_acked_ahead_per_partition",
            args.max_acked_ahead.map(u64::from),
        ),
    ];
    insert_given(&mut fields, optional);
    fields
}

/// Adds the fields whose flag was given.
fn insert_given<const N: usize>(
    fields: &mut Map<String, Value>,
    optional: [(&str, Option<u64>); N],
) {
    for (field, value) in optional {
        if let Some(value) = value {
            fields.insert(field.to_string(), Value::from(value));
        }
    }
}

/// `topic ls`: every page, by name.
fn list(client: &Client, limit: u32, json: bool) -> anyhow::Result<()> {
    #[derive(Deserialize)]
    struct Page<'a> {
        #[serde(borrow)]
        topics: Vec<&'a RawValue>,
        #[serde(default)]
        next_page_token: String,
    }
    let limit = limit.to_string();
    let mut token = String::new();
    let mut topics: Vec<Value> = Vec::new();
    loop {
        let reply = client
            .get("/v1/topics", &[("limit", &limit), ("page_token", &token)])?
            .expect(200)?;
        let page: Page = reply.json()?;
        for topic in &page.topics {
            if json {
                print_line(topic.get().as_bytes())?;
            } else {
                topics.push(serde_json::from_str(topic.get())?);
            }
        }
        // Tokens are names, ascending: one that does not move on would page forever.
        if page.next_page_token.is_empty() || page.next_page_token <= token {
            break;
        }
        token = page.next_page_token;
    }
    if !json {
        print_line(topic_table(&topics).trim_end().as_bytes())?;
    }
    Ok(())
}

/// A created or altered topic: the server's JSON, or its row.
fn print_topic(reply: &Reply, json: bool) -> anyhow::Result<()> {
    if json {
        return print_line(reply.json_line());
    }
    let topic: Value = reply.json()?;
    print_line(
        topic_table(std::slice::from_ref(&topic))
            .trim_end()
            .as_bytes(),
    )
}

/// Topics as a table (durations as `7d`, sizes as `10GiB`, no size bound as `-`, the creation time
/// in UTC).
fn topic_table(topics: &[Value]) -> String {
    let mut headers: Vec<&str> = TOPIC_COLUMNS.iter().map(|(header, _)| *header).collect();
    headers.push("CREATED");
    let rows: Vec<Vec<String>> = topics
        .iter()
        .map(|topic| {
            let mut row: Vec<String> = TOPIC_COLUMNS
                .iter()
                .map(|(_, field)| match topic[field].as_u64() {
                    Some(ms) if field.ends_with("_ms") => duration_ms(ms),
                    Some(bytes) if field.ends_with("_bytes") => size_bytes(bytes),
                    _ => cell(topic.get(field)),
                })
                .collect();
            row.push(
                topic["created_at"]
                    .as_u64()
                    .map(utc_time)
                    .unwrap_or_else(|| cell(topic.get("created_at"))),
            );
            row
        })
        .collect();
    table(&headers, &rows)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bodies_carry_only_the_flags_given() {
        let add = TopicAddArgs {
            name: "orders".to_string(),
            partitions: Some(6),
            retention: Some(7_200_000),
            retention_bytes: Some(10 << 30),
            visibility: None,
            max_in_flight: None,
            max_acked_ahead: Some(10),
        };
        assert_eq!(
            Value::Object(add_fields(&add)),
            serde_json::json!({
                "name": "orders",
                "partitions": 6,
                "retention_ms": 7_200_000,
                "retention_bytes": 10_737_418_240u64,
                "max_acked_ahead_per_partition": 10,
            })
        );
        let edit = TopicEditArgs {
            name: "orders".to_string(),
            partitions: None,
            retention: None,
            retention_bytes: None,
            max_in_flight: None,
            max_acked_ahead: None,
        };
        assert!(edit_fields(&edit).is_empty());
        let edit = TopicEditArgs {
            partitions: Some(9),
            retention_bytes: Some(0),
            ..edit
        };
        assert_eq!(
            Value::Object(edit_fields(&edit)),
            serde_json::json!({ "partitions": 9, "retention_bytes": 0 })
        );
    }

    #[test]
    fn a_topic_row_reads_as_a_person_would() {
        let topic = serde_json::json!({
            "name": "orders", "partitions": 3, "retention_ms": 604_800_000,
            "visibility_timeout_ms": 30_000, "max_in_flight_per_partition": 1024,
            "max_acked_ahead_per_partition": 1024, "created_at": 1_785_326_400u64,
        });
        let mut sized = topic.clone();
        sized["retention_bytes"] = Value::from(10u64 << 30);
        assert_eq!(
            topic_table(&[topic, sized]),
            "NAME    PARTITIONS  RETENTION  RETENTION_BYTES  VISIBILITY  MAX_IN_FLIGHT  \
             MAX_ACKED_AHEAD  CREATED\n\
             orders  3           7d         -                30s         1024           \
             1024             2026-07-29T12:00:00Z\n\
             orders  3           7d         10GiB            30s         1024           \
             1024             2026-07-29T12:00:00Z\n"
        );
    }
}

//! Topic schemas: compiling JSON Schema text (jsonschema crate), a cache of compiled validators, and
//! the compatibility check a PATCH runs before it replaces a schema.
//!
//! The metastore stores the schema as raw text; the node compiles it once per topic incarnation and
//! schema version and keeps the validator until the topic changes ([`SCHEMA_CACHE_MAX`] entries, the
//! least recently used dropped first). Remote `$ref`s are not resolved (the crate's HTTP and file
//! resolvers are compiled out): a schema must be self-contained.
//!
//! Compatibility (a conservative structural check, since deciding "every payload valid before is
//! still valid" is undecidable in general): a new schema is refused when it changes the top-level
//! `type`, requires a property the old one did not require, changes the `type` of a property both
//! declare, or closes `additionalProperties` that the old one left open. A topic with no schema may get
//! any valid one.

use std::collections::BTreeMap;
use std::sync::{Arc, Mutex};

use jsonschema::Validator;
use narad_core::ids::TopicId;
use serde_json::Value;

/// Compiled validators kept at once.
pub const SCHEMA_CACHE_MAX: usize = 1024;

/// Compiles schema text, or says why it is not a usable schema.
pub fn compile(text: &str) -> Result<Validator, String> {
    let value: Value = serde_json::from_str(text).map_err(|error| error.to_string())?;
    if !(value.is_object() || value.is_boolean()) {
        return Err("a schema must be a JSON object or boolean".to_string());
    }
    jsonschema::validator_for(&value).map_err(|error| error.to_string())
}

/// Checks a payload against a compiled schema; the message names the first violation.
pub fn check_payload(validator: &Validator, payload: &[u8]) -> Result<(), String> {
    let value: Value =
        serde_json::from_slice(payload).map_err(|error| format!("payload is not JSON: {error}"))?;
    validator
        .validate(&value)
        .map_err(|error| error.to_string())
}

/// Whether `new` may replace `old` (see the module doc).
pub fn check_compatible(old: &str, new: &str) -> Result<(), String> {
    let (Ok(old), Ok(new)) = (
        serde_json::from_str::<Value>(old),
        serde_json::from_str::<Value>(new),
    ) else {
        return Err("schema is not JSON".to_string());
    };
    let field = |schema: &Value, key: &str| schema.get(key).cloned();
    if let (Some(before), Some(after)) = (field(&old, "type"), field(&new, "type")) {
        if before != after {
            return Err(format!("type changes from {before} to {after}"));
        }
    }
    let required = |schema: &Value| -> Vec<String> {
        schema
            .get("required")
            .and_then(Value::as_array)
            .map(|names| {
                names
                    .iter()
                    .filter_map(|name| name.as_str().map(str::to_string))
                    .collect()
            })
            .unwrap_or_default()
    };
    let required_before = required(&old);
    if let Some(added) = required(&new)
        .into_iter()
        .find(|name| !required_before.contains(name))
    {
        return Err(format!("property {added:?} becomes required"));
    }
    if let (Some(Value::Object(before)), Some(Value::Object(after))) =
        (old.get("properties"), new.get("properties"))
    {
        for (name, schema) in after {
            let before_type = before.get(name).and_then(|property| property.get("type"));
            let after_type = schema.get("type");
            if let (Some(before_type), Some(after_type)) = (before_type, after_type) {
                if before_type != after_type {
                    return Err(format!(
                        "property {name:?} changes type from {before_type} to {after_type}"
                    ));
                }
            }
        }
    }
    let closed = |schema: &Value| schema.get("additionalProperties") == Some(&Value::Bool(false));
    if closed(&new) && !closed(&old) {
        return Err("additionalProperties becomes false".to_string());
    }
    Ok(())
}

/// Compiled validators by topic incarnation and schema version.
#[derive(Default)]
pub struct SchemaCache {
    inner: Mutex<CacheInner>,
}

#[derive(Default)]
struct CacheInner {
    entries: BTreeMap<TopicId, CacheEntry>,
    clock: u64,
}

struct CacheEntry {
    schema_version: u32,
    validator: Arc<Validator>,
    used: u64,
}

impl std::fmt::Debug for SchemaCache {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("SchemaCache").finish_non_exhaustive()
    }
}

impl SchemaCache {
    /// The validator of a topic's schema version, compiled on first use.
    pub fn validator(
        &self,
        topic: TopicId,
        schema_version: u32,
        text: &str,
    ) -> Result<Arc<Validator>, String> {
        let mut inner = self
            .inner
            .lock()
            .unwrap_or_else(|poison| poison.into_inner());
        inner.clock += 1;
        let now = inner.clock;
        if let Some(entry) = inner.entries.get_mut(&topic) {
            if entry.schema_version == schema_version {
                entry.used = now;
                return Ok(entry.validator.clone());
            }
        }
        let validator = Arc::new(compile(text)?);
        if inner.entries.len() >= SCHEMA_CACHE_MAX && !inner.entries.contains_key(&topic) {
            let oldest = inner
                .entries
                .iter()
                .min_by_key(|(_, entry)| entry.used)
                .map(|(id, _)| *id);
            if let Some(oldest) = oldest {
                inner.entries.remove(&oldest);
            }
        }
        inner.entries.insert(
            topic,
            CacheEntry {
                schema_version,
                validator: validator.clone(),
                used: now,
            },
        );
        Ok(validator)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const ORDER: &str =
        r#"{"type":"object","properties":{"id":{"type":"integer"}},"required":["id"]}"#;

    #[test]
    fn payloads_are_checked_against_the_schema() {
        let validator = compile(ORDER).unwrap();
        assert_eq!(check_payload(&validator, br#"{"id":1}"#), Ok(()));
        assert!(check_payload(&validator, br#"{"id":"x"}"#)
            .unwrap_err()
            .contains("is not of type \"integer\""));
        assert!(check_payload(&validator, b"not json")
            .unwrap_err()
            .starts_with("payload is not JSON"));
    }

    #[test]
    fn schemas_must_compile() {
        assert!(compile("[1]").is_err());
        assert!(compile("{").is_err());
        assert!(compile(r#"{"type":"nope"}"#).is_err());
        assert!(compile("true").is_ok());
    }

    #[test]
    fn compatible_changes_pass_and_breaking_ones_are_named() {
        let loosened =
            r#"{"type":"object","properties":{"id":{"type":"integer"},"note":{"type":"string"}}}"#;
        assert_eq!(check_compatible(ORDER, loosened), Ok(()));
        assert_eq!(
            check_compatible(ORDER, r#"{"type":"array"}"#),
            Err("type changes from \"object\" to \"array\"".to_string())
        );
        assert_eq!(
            check_compatible(ORDER, r#"{"type":"object","required":["id","qty"]}"#),
            Err("property \"qty\" becomes required".to_string())
        );
        assert_eq!(
            check_compatible(
                ORDER,
                r#"{"type":"object","properties":{"id":{"type":"string"}},"required":["id"]}"#
            ),
            Err("property \"id\" changes type from \"integer\" to \"string\"".to_string())
        );
        assert_eq!(
            check_compatible(
                ORDER,
                r#"{"type":"object","required":["id"],"additionalProperties":false}"#
            ),
            Err("additionalProperties becomes false".to_string())
        );
    }

    #[test]
    fn the_cache_recompiles_on_a_new_schema_version() {
        let cache = SchemaCache::default();
        let first = cache.validator(TopicId(1), 1, ORDER).unwrap();
        let again = cache.validator(TopicId(1), 1, "ignored: cached").unwrap();
        assert!(Arc::ptr_eq(&first, &again));
        let next = cache.validator(TopicId(1), 2, "true").unwrap();
        assert!(next.is_valid(&serde_json::json!("anything")));
    }
}

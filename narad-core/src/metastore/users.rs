//! Users and grants: who may log in, and what each may do to which topics (the `/v1` surface's §1 Auth).
//!
//! A user holds a password hash (a PHC string, argon2id for new hashes, or a bcrypt `$2…$` hash imported
//! from the Go release) and a set of [`Grant`]s. Hashing happens before a command is proposed, so a
//! replica only stores what the proposer computed: applying stays a pure function of the log.
//!
//! The root user (`admin`, [`User::root`]) may do everything, can't be deleted, and its grants are
//! fixed. Which caller may propose what (admins manage users, only root grants admin, only root changes
//! root's password) is the HTTP layer's check: the caller is not part of a command.

use serde::{Deserialize, Serialize};

use super::TopicError;

/// The root user's name, seeded once.
pub const ROOT_USERNAME: &str = "admin";
/// Longest username, in bytes.
pub const USERNAME_BYTES_MAX: usize = 64;
/// Most users the metastore holds.
pub const USERS_MAX: usize = 10_000;
/// Most grants one user holds (one per action after normalizing, so 4 in practice).
pub const GRANTS_MAX: usize = 4;
/// Most patterns one grant holds.
pub const PATTERNS_MAX: usize = 256;
/// Longest stored password hash, in bytes (a PHC argon2id string is about 100).
pub const PASSWORD_HASH_BYTES_MAX: usize = 512;

/// What a grant allows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub enum Action {
    /// Produce to matching topics.
    Produce,
    /// Consume (queue mode and replay) and ack on matching topics.
    Consume,
    /// Create matching topics (the creator becomes the topic's owner).
    Create,
    /// Everything, users included. Takes no patterns.
    Admin,
}

impl Action {
    /// The action's name on the wire.
    pub fn as_str(self) -> &'static str {
        match self {
            Action::Produce => "produce",
            Action::Consume => "consume",
            Action::Create => "create",
            Action::Admin => "admin",
        }
    }

    /// The action of a wire name.
    pub fn parse(name: &str) -> Option<Action> {
        match name {
            "produce" => Some(Action::Produce),
            "consume" => Some(Action::Consume),
            "create" => Some(Action::Create),
            "admin" => Some(Action::Admin),
            _ => None,
        }
    }
}

/// One grant: an action on the topics whose names match any of `patterns`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Grant {
    /// What is allowed.
    pub action: Action,
    /// Literal topic names, or `prefix*` (`*` alone: every topic). Empty for [`Action::Admin`].
    pub patterns: Vec<String>,
}

/// A stored user.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct User {
    /// Its name, `^[A-Za-z0-9._-]{1,64}$`.
    pub username: String,
    /// Its password hash (PHC argon2id, or bcrypt).
    pub password_hash: String,
    /// Its grants, normalized ([`normalize_grants`]). Empty for root.
    pub grants: Vec<Grant>,
    /// Whether this is the root user.
    pub root: bool,
    /// When it was created, Unix ms (from the proposer).
    pub created_at_ms: u64,
    /// When its grants or password last changed, Unix ms (from the proposer).
    pub updated_at_ms: u64,
}

impl User {
    /// Whether this user holds the admin grant (root does).
    pub fn is_admin(&self) -> bool {
        self.root
            || self
                .grants
                .iter()
                .any(|grant| grant.action == Action::Admin)
    }

    /// Whether this user may do `action` to the topic `topic`.
    pub fn may(&self, action: Action, topic: &str) -> bool {
        self.is_admin()
            || self.grants.iter().any(|grant| {
                grant.action == action
                    && grant
                        .patterns
                        .iter()
                        .any(|pattern| pattern_matches(pattern, topic))
            })
    }

    /// Whether this user may pass `grant` on: only root grants admin; others pass on only patterns that
    /// one of their own grants of that action covers (an admin covers every pattern).
    pub fn may_pass_on(&self, grant: &Grant) -> bool {
        if grant.action == Action::Admin {
            return self.root;
        }
        if self.is_admin() {
            return true;
        }
        grant.patterns.iter().all(|given| {
            self.grants.iter().any(|held| {
                held.action == grant.action
                    && held
                        .patterns
                        .iter()
                        .any(|pattern| pattern_covers(pattern, given))
            })
        })
    }
}

/// Whether `pattern` (a literal name, or `prefix*`) matches the topic `name`.
pub fn pattern_matches(pattern: &str, name: &str) -> bool {
    match pattern.strip_suffix('*') {
        Some(prefix) => name.starts_with(prefix),
        None => pattern == name,
    }
}

/// Whether every name `given` matches is also matched by `held`.
pub fn pattern_covers(held: &str, given: &str) -> bool {
    match held.strip_suffix('*') {
        // `given` is a literal or a narrower prefix: it starts with held's prefix either way.
        Some(prefix) => given.starts_with(prefix),
        None => held == given,
    }
}

/// Checks a username against `^[A-Za-z0-9._-]{1,64}$`.
pub fn validate_username(name: &str) -> Result<(), TopicError> {
    let allowed = |byte: u8| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-');
    if name.is_empty() || name.len() > USERNAME_BYTES_MAX || !name.bytes().all(allowed) {
        return Err(TopicError::UsernameInvalid);
    }
    Ok(())
}

/// Checks one pattern: a topic name, optionally ending in `*`, or `*` alone.
fn validate_pattern(pattern: &str) -> Result<(), TopicError> {
    let name = pattern.strip_suffix('*').unwrap_or(pattern);
    let allowed = |byte: u8| byte.is_ascii_alphanumeric() || matches!(byte, b'.' | b'_' | b'-');
    let valid = if pattern.ends_with('*') {
        name.len() < super::TOPIC_NAME_BYTES_MAX && name.bytes().all(allowed)
    } else {
        super::validate_topic_name(name).is_ok()
    };
    if valid {
        Ok(())
    } else {
        Err(TopicError::GrantInvalid(format!(
            "pattern {pattern:?} must be a topic name or a prefix ending in *"
        )))
    }
}

/// The canonical form of a grant set: one grant per action in action order, patterns sorted without
/// repeats. Refuses an admin grant with patterns, another grant without any, and bad patterns.
pub fn normalize_grants(grants: &[Grant]) -> Result<Vec<Grant>, TopicError> {
    let mut merged: std::collections::BTreeMap<Action, std::collections::BTreeSet<String>> =
        std::collections::BTreeMap::new();
    for grant in grants {
        match grant.action {
            Action::Admin if !grant.patterns.is_empty() => {
                return Err(TopicError::GrantInvalid(
                    "the admin grant takes no patterns".to_string(),
                ))
            }
            Action::Admin => {}
            action @ (Action::Produce | Action::Consume | Action::Create)
                if grant.patterns.is_empty() =>
            {
                return Err(TopicError::GrantInvalid(format!(
                    "the {} grant needs at least one pattern",
                    action.as_str()
                )))
            }
            Action::Produce | Action::Consume | Action::Create => {}
        }
        for pattern in &grant.patterns {
            validate_pattern(pattern)?;
        }
        let patterns = merged.entry(grant.action).or_default();
        patterns.extend(grant.patterns.iter().cloned());
        if patterns.len() > PATTERNS_MAX {
            return Err(TopicError::GrantInvalid(format!(
                "a grant holds at most {PATTERNS_MAX} patterns"
            )));
        }
    }
    Ok(merged
        .into_iter()
        .map(|(action, patterns)| Grant {
            action,
            patterns: patterns.into_iter().collect(),
        })
        .collect())
}

/// Creates a user (`root`: the seeded root, refused once a root exists).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct CreateUser {
    /// Its name.
    pub username: String,
    /// Its password hash, computed by the proposer.
    pub password_hash: String,
    /// Its grants (normalized when applied).
    pub grants: Vec<Grant>,
    /// Whether it is the root user.
    pub root: bool,
    /// Creation time, Unix ms (from the proposer).
    pub at_ms: u64,
}

/// The users of the replicated state, and the rules a command on them obeys.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Users {
    users: std::collections::BTreeMap<String, User>,
}

impl Users {
    /// The user of that name.
    pub fn get(&self, username: &str) -> Option<&User> {
        self.users.get(username)
    }

    /// Every user, in name order.
    pub fn iter(&self) -> impl Iterator<Item = &User> {
        self.users.values()
    }

    /// How many users there are.
    pub fn len(&self) -> usize {
        self.users.len()
    }

    /// Whether there is no user.
    pub fn is_empty(&self) -> bool {
        self.users.is_empty()
    }

    /// Whether the root user exists.
    pub fn has_root(&self) -> bool {
        self.users.values().any(|user| user.root)
    }

    pub(super) fn create(&mut self, create: &CreateUser) -> Result<User, TopicError> {
        validate_username(&create.username)?;
        check_hash(&create.password_hash)?;
        if self.users.contains_key(&create.username) {
            return Err(TopicError::UserExists);
        }
        if create.root && (self.has_root() || !create.grants.is_empty()) {
            return Err(TopicError::RootExists);
        }
        if self.users.len() >= USERS_MAX {
            return Err(TopicError::TooManyUsers);
        }
        let user = User {
            username: create.username.clone(),
            password_hash: create.password_hash.clone(),
            grants: normalize_grants(&create.grants)?,
            root: create.root,
            created_at_ms: create.at_ms,
            updated_at_ms: create.at_ms,
        };
        self.users.insert(user.username.clone(), user.clone());
        Ok(user)
    }

    pub(super) fn delete(&mut self, username: &str) -> Result<(), TopicError> {
        match self.users.get(username) {
            None => Err(TopicError::UserNotFound),
            Some(user) if user.root => Err(TopicError::RootUndeletable),
            Some(_) => {
                self.users.remove(username);
                Ok(())
            }
        }
    }

    pub(super) fn set_grants(
        &mut self,
        username: &str,
        grants: &[Grant],
        at_ms: u64,
    ) -> Result<User, TopicError> {
        let user = self
            .users
            .get_mut(username)
            .ok_or(TopicError::UserNotFound)?;
        if user.root {
            return Err(TopicError::RootGrantsFixed);
        }
        user.grants = normalize_grants(grants)?;
        user.updated_at_ms = at_ms;
        Ok(user.clone())
    }

    pub(super) fn set_password(
        &mut self,
        username: &str,
        password_hash: &str,
        at_ms: u64,
    ) -> Result<(), TopicError> {
        check_hash(password_hash)?;
        let user = self
            .users
            .get_mut(username)
            .ok_or(TopicError::UserNotFound)?;
        user.password_hash = password_hash.to_string();
        user.updated_at_ms = at_ms;
        Ok(())
    }

    /// What is wrong with the users, if anything (a snapshot that fails this is refused).
    pub(super) fn invariant_violation(&self) -> Option<String> {
        if self.users.values().filter(|user| user.root).count() > 1 {
            return Some("more than one root user".to_string());
        }
        for (name, user) in &self.users {
            if name != &user.username || validate_username(name).is_err() {
                return Some(format!(
                    "user {name:?} is stored under another or a bad name"
                ));
            }
            if user.root && !user.grants.is_empty() {
                return Some("the root user holds grants".to_string());
            }
            if normalize_grants(&user.grants).as_ref() != Ok(&user.grants) {
                return Some(format!("user {name:?} holds unnormalized grants"));
            }
        }
        None
    }
}

fn check_hash(hash: &str) -> Result<(), TopicError> {
    if hash.is_empty() || hash.len() > PASSWORD_HASH_BYTES_MAX || !hash.starts_with('$') {
        return Err(TopicError::PasswordHashInvalid);
    }
    Ok(())
}

//! Basic auth: credentials, password hashes, the per-username failure bucket and the verified-credential
//! cache.
//!
//! A request's `Authorization: Basic` credentials are checked against the user's stored hash from the
//! local metastore replica, so a password or grant change is seen by the next request this replica
//! serves. New hashes are argon2id (PHC strings); bcrypt hashes imported from the Go release still
//! verify. Both are slow on purpose, so they run on blocking threads ([`offload`]), and a credential
//! that verified once is remembered as an HMAC under a key drawn at start-up (never stored): the next
//! request with it costs one HMAC, not one argon2id. The entry holds the hash it was verified against,
//! so it stops matching the moment the password changes.
//!
//! Each username has a failure bucket: 5 tokens, one more every 12 s, one taken per failed login. An
//! empty bucket answers 429 before any hash is computed, so guessing is bounded per name.

use std::collections::HashMap;
use std::sync::Mutex;
use std::time::Duration;

use argon2::password_hash::rand_core::OsRng;
use argon2::password_hash::{PasswordHash, PasswordHasher, PasswordVerifier, SaltString};
use argon2::Argon2;
use base64::Engine as _;
use hmac::{Hmac, Mac};
use narad_core::metastore::users::User;
use sha2::Sha256;

use crate::clock::Clock;

/// Tokens in a full failure bucket.
pub const FAILURE_BUCKET_TOKENS: u32 = 5;
/// How long one token takes to come back.
pub const FAILURE_REFILL: Duration = Duration::from_secs(12);
/// Most usernames with a failure bucket; past it, full buckets are forgotten first.
pub const FAILURE_BUCKETS_MAX: usize = 100_000;
/// Shortest password a user may be given.
pub const PASSWORD_BYTES_MIN: usize = 8;
/// Longest password (argon2 hashes all of it: the bound keeps one request's work bounded).
pub const PASSWORD_BYTES_MAX: usize = 1024;
/// The realm of the 401 challenge.
pub const CHALLENGE: (&str, &str) = ("www-authenticate", "Basic realm=\"narad\"");

/// Credentials of one request.
#[derive(Clone, PartialEq, Eq)]
pub struct Credentials {
    /// The username.
    pub username: String,
    /// The password, as sent.
    pub password: String,
}

impl std::fmt::Debug for Credentials {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Credentials")
            .field("username", &self.username)
            .finish_non_exhaustive()
    }
}

/// Parses an `Authorization` header value of the Basic scheme (`None`: absent or malformed).
pub fn parse_basic(header: &[u8]) -> Option<Credentials> {
    let header = std::str::from_utf8(header).ok()?.trim();
    let (scheme, encoded) = header.split_once(' ')?;
    if !scheme.eq_ignore_ascii_case("basic") {
        return None;
    }
    let decoded = base64::engine::general_purpose::STANDARD
        .decode(encoded.trim())
        .ok()?;
    let decoded = String::from_utf8(decoded).ok()?;
    let (username, password) = decoded.split_once(':')?;
    Some(Credentials {
        username: username.to_string(),
        password: password.to_string(),
    })
}

/// A new argon2id hash (PHC string) of `password`, with a random salt. Slow: call it through
/// [`offload`].
pub fn hash_password(password: &str) -> String {
    let salt = SaltString::generate(&mut OsRng);
    Argon2::default()
        .hash_password(password.as_bytes(), &salt)
        .expect("argon2id with default parameters hashes any password")
        .to_string()
}

/// Whether `hash` is a well-formed bcrypt hash (`$2a$`, `$2b$` or `$2y$`, cost, 53 characters of salt
/// and hash): what `POST /v1/users` imports from the Go release.
pub fn is_bcrypt_hash(hash: &str) -> bool {
    hash.parse::<bcrypt::HashParts>().is_ok()
        && ["$2a$", "$2b$", "$2y$"]
            .iter()
            .any(|prefix| hash.starts_with(prefix))
}

/// Whether `password` matches `hash` (argon2 PHC, or bcrypt `$2a$`/`$2b$`/`$2y$`). A malformed hash
/// matches nothing. Slow: call it through [`offload`].
pub fn verify_password(hash: &str, password: &str) -> bool {
    if hash.starts_with("$2") {
        return bcrypt::verify(password, hash).unwrap_or(false);
    }
    match PasswordHash::new(hash) {
        Ok(parsed) => Argon2::default()
            .verify_password(password.as_bytes(), &parsed)
            .is_ok(),
        Err(_) => false,
    }
}

pub use super::offload;

/// Whether a password is acceptable for a user.
pub fn check_new_password(password: &str) -> Result<(), String> {
    if (PASSWORD_BYTES_MIN..=PASSWORD_BYTES_MAX).contains(&password.len()) {
        Ok(())
    } else {
        Err(format!(
            "invalid argument: password must be {PASSWORD_BYTES_MIN} to {PASSWORD_BYTES_MAX} bytes"
        ))
    }
}

/// Why a login failed.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Refusal {
    /// No or bad credentials: 401.
    Unauthenticated,
    /// The username's failure bucket is empty: 429.
    Throttled,
}

/// The node's login state: failure buckets and verified credentials.
#[derive(Debug)]
pub struct Auth {
    enabled: bool,
    clock: Clock,
    buckets: Mutex<HashMap<String, Bucket>>,
    verified: Mutex<HashMap<String, Verified>>,
    cache_key: [u8; 32],
    /// A hash that unknown usernames are verified against, so a guess at a name costs what a guess at
    /// a password does.
    decoy_hash: std::sync::OnceLock<String>,
    /// Verifications running at once: one per core. A flood of logins then waits here instead of
    /// filling the blocking pool the metastore's disk work also runs on.
    verifying: tokio::sync::Semaphore,
}

#[derive(Clone, Copy, Debug)]
struct Bucket {
    tokens: u32,
    /// When the bucket last gained (or started refilling) a token.
    since: Duration,
}

#[derive(Debug)]
struct Verified {
    /// The stored hash the credential matched.
    hash: String,
    /// HMAC(cache key, password).
    tag: [u8; 32],
}

impl Auth {
    /// Login state; `enabled = false` lets every request through as [`Caller::Open`].
    pub fn new(enabled: bool, clock: Clock) -> Auth {
        let mut cache_key = [0u8; 32];
        // A secret, so from the OS, not from the node's seeded (and logged) stream.
        rand::Rng::fill(
            &mut <rand_chacha::ChaCha20Rng as rand::SeedableRng>::from_os_rng(),
            &mut cache_key[..],
        );
        Auth {
            enabled,
            clock,
            buckets: Mutex::new(HashMap::new()),
            verified: Mutex::new(HashMap::new()),
            cache_key,
            decoy_hash: std::sync::OnceLock::new(),
            verifying: tokio::sync::Semaphore::new(
                std::thread::available_parallelism().map_or(1, std::num::NonZeroUsize::get),
            ),
        }
    }

    /// Whether requests must authenticate.
    pub fn enabled(&self) -> bool {
        self.enabled
    }

    /// Checks `credentials` against `user` (the stored user of that name, if any).
    pub async fn login(
        &self,
        credentials: &Credentials,
        user: Option<&User>,
    ) -> Result<(), Refusal> {
        let now = Duration::from_nanos(self.clock.now().0);
        self.login_at(now, credentials, user).await
    }

    async fn login_at(
        &self,
        now: Duration,
        credentials: &Credentials,
        user: Option<&User>,
    ) -> Result<(), Refusal> {
        if !self.has_tokens(&credentials.username, now) {
            return Err(Refusal::Throttled);
        }
        if matches!(user, Some(user) if self.remembered(user, &credentials.password)) {
            return Ok(());
        }
        let _permit = self
            .verifying
            .acquire()
            .await
            .expect("the semaphore is never closed");
        // Again, after the wait: a burst of guesses queued behind the permits must not all be
        // verified on the strength of one full bucket, and a burst of right ones is verified once.
        let now = Duration::from_nanos(self.clock.now().0).max(now);
        if !self.has_tokens(&credentials.username, now) {
            return Err(Refusal::Throttled);
        }
        if matches!(user, Some(user) if self.remembered(user, &credentials.password)) {
            return Ok(());
        }
        let matched = match user {
            Some(user) => {
                let (hash, password) = (user.password_hash.clone(), credentials.password.clone());
                let matched = offload(move || verify_password(&hash, &password)).await;
                if matched {
                    self.remember(user, &credentials.password);
                }
                matched
            }
            None => {
                let decoy = self
                    .decoy_hash
                    .get_or_init(|| hash_password("narad-decoy"))
                    .clone();
                let password = credentials.password.clone();
                offload(move || verify_password(&decoy, &password)).await;
                false
            }
        };
        if matched {
            Ok(())
        } else {
            self.take_token(&credentials.username, now);
            Err(Refusal::Unauthenticated)
        }
    }

    fn tag(&self, password: &str) -> [u8; 32] {
        let mut mac = <Hmac<Sha256> as Mac>::new_from_slice(&self.cache_key)
            .expect("HMAC takes keys of any length");
        mac.update(password.as_bytes());
        mac.finalize().into_bytes().into()
    }

    fn remembered(&self, user: &User, password: &str) -> bool {
        let tag = self.tag(password);
        let verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        verified.get(&user.username).is_some_and(|entry| {
            entry.hash == user.password_hash
                && bool::from(subtle::ConstantTimeEq::ct_eq(&entry.tag[..], &tag[..]))
        })
    }

    fn remember(&self, user: &User, password: &str) {
        let tag = self.tag(password);
        let mut verified = self.verified.lock().unwrap_or_else(|p| p.into_inner());
        // Users are bounded by the metastore; names of deleted users go when the map is rebuilt.
        if verified.len() > narad_core::metastore::users::USERS_MAX {
            verified.clear();
        }
        verified.insert(
            user.username.clone(),
            Verified {
                hash: user.password_hash.clone(),
                tag,
            },
        );
    }

    /// The bucket of `username` as of now, refilled.
    fn refilled(&self, bucket: Bucket, now: Duration) -> Bucket {
        let gained = (now.saturating_sub(bucket.since).as_nanos() / FAILURE_REFILL.as_nanos())
            .min(u128::from(FAILURE_BUCKET_TOKENS)) as u32;
        let tokens = (bucket.tokens + gained).min(FAILURE_BUCKET_TOKENS);
        let since = if tokens == FAILURE_BUCKET_TOKENS {
            now
        } else {
            bucket.since + FAILURE_REFILL * gained
        };
        Bucket { tokens, since }
    }

    fn has_tokens(&self, username: &str, now: Duration) -> bool {
        let buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        buckets
            .get(username)
            .is_none_or(|bucket| self.refilled(*bucket, now).tokens > 0)
    }

    fn take_token(&self, username: &str, now: Duration) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|p| p.into_inner());
        if buckets.len() >= FAILURE_BUCKETS_MAX && !buckets.contains_key(username) {
            buckets.retain(|_, bucket| self.refilled(*bucket, now).tokens < FAILURE_BUCKET_TOKENS);
            if buckets.len() >= FAILURE_BUCKETS_MAX {
                // Every bucket is in use: the oldest-refilling ones go (a flood of names).
                buckets.clear();
            }
        }
        let bucket = buckets.entry(username.to_string()).or_insert(Bucket {
            tokens: FAILURE_BUCKET_TOKENS,
            since: now,
        });
        let mut refilled = self.refilled(*bucket, now);
        if refilled.tokens == FAILURE_BUCKET_TOKENS {
            refilled.since = now;
        }
        refilled.tokens = refilled.tokens.saturating_sub(1);
        *bucket = refilled;
    }
}

/// Who is calling: anyone (auth off), or a logged-in user.
#[derive(Clone, Debug)]
pub enum Caller {
    /// Auth is off: every action is allowed, and created topics have no owner.
    Open,
    /// A user that logged in, as the local replica held it at login.
    User(Box<User>),
}

impl Caller {
    /// Whether the caller may do `action` to `topic`.
    pub fn may(&self, action: narad_core::metastore::users::Action, topic: &str) -> bool {
        match self {
            Caller::Open => true,
            Caller::User(user) => user.may(action, topic),
        }
    }

    /// Whether the caller is an admin (auth off: everyone is).
    pub fn is_admin(&self) -> bool {
        match self {
            Caller::Open => true,
            Caller::User(user) => user.is_admin(),
        }
    }

    /// The caller's username (empty when auth is off).
    pub fn username(&self) -> &str {
        match self {
            Caller::Open => "",
            Caller::User(user) => &user.username,
        }
    }

    /// Whether the caller may alter or delete a topic owned by `owner`.
    pub fn manages(&self, owner: &str) -> bool {
        match self {
            Caller::Open => true,
            Caller::User(user) => user.is_admin() || (!owner.is_empty() && user.username == owner),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn user(hash: String) -> User {
        User {
            username: "alice".to_string(),
            password_hash: hash,
            grants: Vec::new(),
            root: false,
            created_at_ms: 0,
            updated_at_ms: 0,
        }
    }

    fn creds(username: &str, password: &str) -> Credentials {
        Credentials {
            username: username.to_string(),
            password: password.to_string(),
        }
    }

    #[test]
    fn basic_headers_parse_and_bad_ones_do_not() {
        assert_eq!(
            parse_basic(b"Basic YWxpY2U6czNjcjM6dA=="),
            Some(creds("alice", "s3cr3:t"))
        );
        assert_eq!(parse_basic(b"basic  YWxpY2U6"), Some(creds("alice", "")));
        for bad in [
            &b"Bearer x"[..],
            b"Basic !!",
            b"Basic YWxpY2U=",
            b"Basic",
            b"\xff",
        ] {
            assert_eq!(parse_basic(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn argon2id_and_bcrypt_hashes_verify() {
        let hash = hash_password("correct horse");
        assert!(hash.starts_with("$argon2id$"));
        assert!(verify_password(&hash, "correct horse"));
        assert!(!verify_password(&hash, "correct horsf"));
        let bcrypt = bcrypt::hash("from go", 4).unwrap();
        assert!(verify_password(&bcrypt, "from go"));
        assert!(!verify_password(&bcrypt, "from rust"));
        assert!(!verify_password("$nonsense", "x"));
        assert!(is_bcrypt_hash(&bcrypt));
        assert!(!is_bcrypt_hash(&hash) && !is_bcrypt_hash("$2b$04$short"));
    }

    #[tokio::test]
    async fn five_failures_empty_the_bucket_and_a_token_returns_after_12_s() {
        let auth = Auth::new(true, Clock::start());
        let at = |s: u64| Duration::from_secs(100 + s);
        let stored = user(hash_password("right-password"));
        for _ in 0..FAILURE_BUCKET_TOKENS {
            assert_eq!(
                auth.login_at(at(0), &creds("alice", "wrong"), Some(&stored))
                    .await,
                Err(Refusal::Unauthenticated)
            );
        }
        // Even the right password is refused while the bucket is empty: guessing stops here.
        assert_eq!(
            auth.login_at(at(1), &creds("alice", "right-password"), Some(&stored))
                .await,
            Err(Refusal::Throttled)
        );
        // Another name has its own bucket.
        assert_eq!(
            auth.login_at(at(1), &creds("bob", "x"), None).await,
            Err(Refusal::Unauthenticated)
        );
        // 12 s after the first failure one token is back: one more try, then 429 again.
        assert_eq!(
            auth.login_at(at(12), &creds("alice", "right-password"), Some(&stored))
                .await,
            Ok(())
        );
        assert_eq!(
            auth.login_at(at(12), &creds("alice", "wrong"), Some(&stored))
                .await,
            Err(Refusal::Unauthenticated)
        );
        assert_eq!(
            auth.login_at(at(13), &creds("alice", "wrong"), Some(&stored))
                .await,
            Err(Refusal::Throttled)
        );
        // A full minute refills every token.
        for _ in 0..FAILURE_BUCKET_TOKENS {
            assert_eq!(
                auth.login_at(at(72), &creds("alice", "wrong"), Some(&stored))
                    .await,
                Err(Refusal::Unauthenticated)
            );
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_burst_of_guesses_is_bounded_by_the_bucket_not_by_its_size() {
        let auth = std::sync::Arc::new(Auth::new(true, Clock::start()));
        let stored = std::sync::Arc::new(user(hash_password("right-password")));
        let guesses: Vec<_> = (0..40)
            .map(|_| {
                let (auth, stored) = (auth.clone(), stored.clone());
                tokio::spawn(
                    async move { auth.login(&creds("alice", "wrong"), Some(&stored)).await },
                )
            })
            .collect();
        let mut verified = 0;
        for guess in guesses {
            if guess.await.unwrap() == Err(Refusal::Unauthenticated) {
                verified += 1;
            }
        }
        let permits = auth.verifying.available_permits();
        assert!(
            verified <= FAILURE_BUCKET_TOKENS as usize + permits,
            "{verified} guesses were checked"
        );
        assert!(verified >= FAILURE_BUCKET_TOKENS as usize);
    }

    #[tokio::test]
    async fn a_remembered_credential_stops_matching_when_the_hash_changes() {
        let auth = Auth::new(true, Clock::start());
        let old = user(hash_password("old-password"));
        assert_eq!(
            auth.login(&creds("alice", "old-password"), Some(&old))
                .await,
            Ok(())
        );
        assert!(auth.remembered(&old, "old-password"));
        assert!(!auth.remembered(&old, "old-passwore"));
        let new = user(hash_password("new-password"));
        assert!(!auth.remembered(&new, "old-password"));
        assert_eq!(
            auth.login(&creds("alice", "old-password"), Some(&new))
                .await,
            Err(Refusal::Unauthenticated)
        );
        assert_eq!(
            auth.login(&creds("alice", "new-password"), Some(&new))
                .await,
            Ok(())
        );
    }
}

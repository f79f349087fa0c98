//! The peers' proof of the cluster secret, bound to the connection it travels on.
//!
//! Each side sends HMAC-SHA256(secret, [`AUTH_LABEL`] ‖ exporter), where the exporter is 32 bytes of
//! the connection's TLS keying material (RFC 5705/8446 exporter, label [`AUTH_LABEL`], context the
//! speaker's role). Both ends of one connection derive the same exporter value, and no other
//! connection does: a relay that terminates TLS on each side holds two connections with two exporter
//! values, so a proof it forwards fails on the other leg. The role in the context makes the two
//! directions' proofs differ, so a peer without the secret cannot answer a proof with itself.
//! Proofs are compared in constant time (`Mac::verify_slice`).

use hmac::{Hmac, Mac};
use narad_core::codec::cluster::PROOF_BYTES;
use sha2::Sha256;

/// The exporter label and the HMAC's leading constant.
pub const AUTH_LABEL: &[u8] = b"narad-cluster-auth-v1";
/// Bytes of exporter keying material the proof covers.
pub const EXPORTER_BYTES: usize = 32;

/// Which end of the connection speaks.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Role {
    /// The side that dialled.
    Client,
    /// The side that accepted.
    Server,
}

impl Role {
    /// The exporter context of this role's proof.
    pub fn context(self) -> &'static [u8] {
        match self {
            Role::Client => b"client",
            Role::Server => b"server",
        }
    }
}

fn mac(secret: &[u8], exporter: &[u8; EXPORTER_BYTES]) -> Hmac<Sha256> {
    let mut mac = Hmac::<Sha256>::new_from_slice(secret).expect("HMAC takes keys of any length");
    mac.update(AUTH_LABEL);
    mac.update(exporter);
    mac
}

/// The proof for `exporter` (the connection's keying material for the speaker's role).
pub fn proof(secret: &[u8], exporter: &[u8; EXPORTER_BYTES]) -> [u8; PROOF_BYTES] {
    mac(secret, exporter).finalize().into_bytes().into()
}

/// Whether `proof` is the proof for `exporter`, compared in constant time.
pub fn verify(secret: &[u8], exporter: &[u8; EXPORTER_BYTES], proof: &[u8; PROOF_BYTES]) -> bool {
    mac(secret, exporter).verify_slice(proof).is_ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_proof_holds_only_for_its_secret_and_its_connection() {
        let exporter = [7u8; EXPORTER_BYTES];
        let good = proof(b"secret", &exporter);
        assert!(verify(b"secret", &exporter, &good));
        assert!(!verify(b"other", &exporter, &good));
        let mut other_connection = exporter;
        other_connection[0] ^= 1;
        assert!(!verify(b"secret", &other_connection, &good));
        // The proof of the constant alone (the release's token) is not accepted.
        let mut bare = Hmac::<Sha256>::new_from_slice(b"secret").unwrap();
        bare.update(AUTH_LABEL);
        let bare: [u8; PROOF_BYTES] = bare.finalize().into_bytes().into();
        assert!(!verify(b"secret", &exporter, &bare));
    }
}

//! The cluster cookie on the client port: the proof a client gives that it
//! knows the cookie ([`ClientKey`]), and where a process on a node's host
//! finds the cookie without being told ([`local_cookie`]).

use std::path::Path;

use aws_lc_rs::hmac;

/// The file in a node's data directory that holds its identity (and the
/// cluster cookie, readable by the node's user only).
pub const IDENTITY_FILE: &str = "identity.toml";

/// The cluster cookie in the identity file of data directory `path`, when
/// there is one this user can read.
pub fn local_cookie(path: &Path) -> Option<String> {
    #[derive(serde::Deserialize)]
    struct CookieOnly {
        #[serde(default)]
        cookie: String,
    }
    let text = std::fs::read_to_string(path.join(IDENTITY_FILE)).ok()?;
    let identity: CookieOnly = toml::from_str(&text).ok()?;
    (!identity.cookie.is_empty()).then_some(identity.cookie)
}

/// Equality of two secrets that takes as long wherever the first
/// difference is.
pub fn same_secret(a: &[u8], b: &[u8]) -> bool {
    a.len() == b.len() && a.iter().zip(b).fold(0u8, |acc, (x, y)| acc | (x ^ y)) == 0
}

/// The key a client proves it knows the cluster cookie with when it opens a
/// connection to a node's client port: the node sends a random challenge,
/// the client answers HMAC-SHA256(key, challenge ++ cluster id). The cookie
/// itself never crosses the wire.
#[derive(Clone)]
pub struct ClientKey {
    key: hmac::Key,
}

impl std::fmt::Debug for ClientKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("ClientKey(..)")
    }
}

impl ClientKey {
    pub fn new(cookie: &str) -> ClientKey {
        let mut material = b"curvine client auth v1\0".to_vec();
        material.extend_from_slice(cookie.as_bytes());
        ClientKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, &material),
        }
    }

    fn message(challenge: &[u8], cluster_id: &str) -> Vec<u8> {
        let mut m = challenge.to_vec();
        m.extend_from_slice(cluster_id.as_bytes());
        m
    }

    /// The answer to `challenge` from the node of cluster `cluster_id`.
    pub fn proof(&self, challenge: &[u8], cluster_id: &str) -> Vec<u8> {
        hmac::sign(&self.key, &Self::message(challenge, cluster_id))
            .as_ref()
            .to_vec()
    }

    /// Whether `proof` answers `challenge` (in constant time).
    pub fn verify(&self, challenge: &[u8], cluster_id: &str, proof: &[u8]) -> bool {
        hmac::verify(&self.key, &Self::message(challenge, cluster_id), proof).is_ok()
    }

    /// A fresh random challenge.
    pub fn challenge() -> Vec<u8> {
        let mut c = vec![0u8; 32];
        aws_lc_rs::rand::fill(&mut c).expect("the system's random source");
        c
    }
}

#[cfg(test)]
mod tests {
    use super::ClientKey;

    #[test]
    fn only_the_same_cookie_and_challenge_verify() {
        let key = ClientKey::new("cookie");
        let c = ClientKey::challenge();
        let proof = key.proof(&c, "cluster-a");
        assert!(key.verify(&c, "cluster-a", &proof));
        assert!(!key.verify(&c, "cluster-b", &proof));
        assert!(!key.verify(&ClientKey::challenge(), "cluster-a", &proof));
        assert!(!ClientKey::new("cookie2").verify(&c, "cluster-a", &proof));
        assert!(!key.verify(&c, "cluster-a", &proof[..16]));
    }
}

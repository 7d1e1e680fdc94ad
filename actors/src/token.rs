//! Access tokens for blocks: an HMAC-SHA256 (truncated to 128 bits) over the
//! block id, the access and the expiry, keyed by a secret derived from the
//! cluster cookie. The namespace issues them; the data port checks them, so a
//! client that did not go through the namespace cannot read or write blocks.

use std::time::Duration;

use aws_lc_rs::hmac;

use curvine_messages::block::{Access, BlockId, Token};
use curvine_messages::{FsError, FsResult};

#[derive(Clone)]
pub struct TokenKey {
    key: hmac::Key,
    ttl: Duration,
}

impl std::fmt::Debug for TokenKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("TokenKey(..)")
    }
}

fn now_s() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}

impl TokenKey {
    /// A key from the cluster secret; tokens live for `ttl`.
    pub fn new(cookie: &str, ttl: Duration) -> TokenKey {
        let mut material = b"curvine block token v1\0".to_vec();
        material.extend_from_slice(cookie.as_bytes());
        TokenKey {
            key: hmac::Key::new(hmac::HMAC_SHA256, &material),
            ttl,
        }
    }

    fn mac(&self, block: BlockId, access: Access, expires_s: u64) -> [u8; 16] {
        let tag = hmac::sign(&self.key, &Token::signed_bytes(block, access, expires_s));
        let mut mac = [0u8; 16];
        mac.copy_from_slice(&tag.as_ref()[..16]);
        mac
    }

    pub fn issue(&self, block: BlockId, access: Access) -> Token {
        let expires_s = now_s() + self.ttl.as_secs();
        Token {
            block,
            access,
            expires_s,
            mac: self.mac(block, access, expires_s),
        }
    }

    /// Checks a token allows `access` (a write token also allows reading the
    /// block back) and has not expired.
    pub fn check(&self, token: &Token, access: Access) -> FsResult<()> {
        let expected = self.mac(token.block, token.access, token.expires_s);
        let diff = expected
            .iter()
            .zip(token.mac.iter())
            .fold(0u8, |acc, (a, b)| acc | (a ^ b));
        if diff != 0 {
            return Err(FsError::PermissionDenied(format!(
                "invalid access token for block {:#x}",
                token.block
            )));
        }
        if token.expires_s < now_s() {
            return Err(FsError::PermissionDenied(format!(
                "access token for block {:#x} expired; reopen the file",
                token.block
            )));
        }
        if access == Access::Write && token.access != Access::Write {
            return Err(FsError::PermissionDenied(format!(
                "token for block {:#x} allows reading only",
                token.block
            )));
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_verify_and_reject_tampering() {
        let key = TokenKey::new("secret", Duration::from_secs(60));
        let t = key.issue(42, Access::Read);
        key.check(&t, Access::Read).unwrap();
        assert!(key.check(&t, Access::Write).is_err());
        let mut other = t.clone();
        other.block = 43;
        assert!(key.check(&other, Access::Read).is_err());
        let mut longer = t.clone();
        longer.expires_s += 1000;
        assert!(key.check(&longer, Access::Read).is_err());
        let foreign = TokenKey::new("other", Duration::from_secs(60));
        assert!(foreign.check(&t, Access::Read).is_err());
        let w = key.issue(7, Access::Write);
        key.check(&w, Access::Write).unwrap();
        key.check(&w, Access::Read).unwrap();
    }
}

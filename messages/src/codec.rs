//! Encoding of everything that leaves a process: wire frames and stored values.
//!
//! Wire: a connection opens with [`Hello`] bytes (magic + protocol version) so
//! that a peer of another version is refused before any postcard payload is
//! read; then frames of `u32` big-endian length + postcard payload.
//! Stored values: one version byte, then postcard. Decoding never panics: bad,
//! truncated or newer bytes become a [`CodecError`].

use serde::{de::DeserializeOwned, Serialize};

/// The client/node protocol version. Bumped on any incompatible change to
/// [`crate::rpc`] or to the messages between nodes ([`crate::cluster`],
/// [`crate::shard`]); checked when a connection opens.
pub const PROTOCOL_VERSION: u16 = 12;

/// The first bytes of every client connection.
pub const MAGIC: [u8; 4] = *b"CRVN";

/// Largest frame a peer may send; a larger length prefix closes the connection.
pub const MAX_FRAME: usize = 16 * 1024 * 1024;

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CodecError {
    #[error("cannot decode {what}: {reason}")]
    Malformed { what: &'static str, reason: String },
    #[error("{what} was written by a newer release (record version {found}, this release reads up to {supported})")]
    NewerVersion {
        what: &'static str,
        found: u8,
        supported: u8,
    },
    #[error("{what} has unknown record version {found}")]
    UnknownVersion { what: &'static str, found: u8 },
    #[error("cannot encode {what}: {reason}")]
    Encode { what: &'static str, reason: String },
    #[error("frame of {len} bytes exceeds the limit of {max} bytes")]
    FrameTooLarge { len: usize, max: usize },
}

impl From<CodecError> for crate::FsError {
    fn from(e: CodecError) -> Self {
        match e {
            CodecError::Malformed { .. } | CodecError::FrameTooLarge { .. } => {
                crate::FsError::Protocol(e.to_string())
            }
            _ => crate::FsError::Corrupt(e.to_string()),
        }
    }
}

/// Encodes a wire payload (no version byte: the connection carries the version).
pub fn to_bytes<T: Serialize>(what: &'static str, value: &T) -> Result<Vec<u8>, CodecError> {
    postcard::to_stdvec(value).map_err(|e| CodecError::Encode {
        what,
        reason: e.to_string(),
    })
}

/// Decodes a wire payload. Trailing bytes are an error: they mean the peer
/// wrote a different type than the one expected.
pub fn from_bytes<T: DeserializeOwned>(what: &'static str, bytes: &[u8]) -> Result<T, CodecError> {
    match postcard::take_from_bytes::<T>(bytes) {
        Ok((value, [])) => Ok(value),
        Ok((_, rest)) => Err(CodecError::Malformed {
            what,
            reason: format!("{} trailing bytes", rest.len()),
        }),
        Err(e) => Err(CodecError::Malformed {
            what,
            reason: e.to_string(),
        }),
    }
}

/// A value stored on disk. Its encoding starts with [`Versioned::VERSION`]; a
/// later release bumps the version and reads the older one through
/// [`Versioned::migrate`].
pub trait Versioned: Serialize + DeserializeOwned {
    /// Version written by this release.
    const VERSION: u8;
    /// Name used in errors.
    const WHAT: &'static str;
    /// Reads a value stored by an older release. The default knows none.
    fn migrate(version: u8, _payload: &[u8]) -> Result<Self, CodecError> {
        Err(CodecError::UnknownVersion {
            what: Self::WHAT,
            found: version,
        })
    }
}

/// Encodes a stored value with its version byte.
pub fn encode_versioned<T: Versioned>(value: &T) -> Vec<u8> {
    let mut out = Vec::with_capacity(64);
    out.push(T::VERSION);
    // Serializing plain data structures into a Vec cannot fail; should it ever,
    // the version byte alone is stored and decoding reports it clearly.
    postcard::to_extend(value, out).unwrap_or_else(|_| vec![T::VERSION])
}

/// Decodes a stored value, migrating older versions and refusing newer ones.
pub fn decode_versioned<T: Versioned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (&version, payload) = bytes.split_first().ok_or(CodecError::Malformed {
        what: T::WHAT,
        reason: "empty value".into(),
    })?;
    if version == T::VERSION {
        from_bytes(T::WHAT, payload)
    } else if version > T::VERSION {
        Err(CodecError::NewerVersion {
            what: T::WHAT,
            found: version,
            supported: T::VERSION,
        })
    } else {
        T::migrate(version, payload)
    }
}

/// The fixed opening of a connection: magic and protocol version.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Hello {
    pub version: u16,
}

impl Hello {
    pub const LEN: usize = 6;

    pub fn current() -> Self {
        Hello {
            version: PROTOCOL_VERSION,
        }
    }

    pub fn encode(&self) -> [u8; Self::LEN] {
        let v = self.version.to_be_bytes();
        [MAGIC[0], MAGIC[1], MAGIC[2], MAGIC[3], v[0], v[1]]
    }

    pub fn decode(bytes: &[u8; Self::LEN]) -> Result<Hello, CodecError> {
        if bytes[..4] != MAGIC {
            return Err(CodecError::Malformed {
                what: "connection hello",
                reason: "not a curvine client (bad magic bytes)".into(),
            });
        }
        Ok(Hello {
            version: u16::from_be_bytes([bytes[4], bytes[5]]),
        })
    }
}

/// Checks a frame length prefix against [`MAX_FRAME`].
pub fn check_frame_len(len: usize) -> Result<(), CodecError> {
    if len > MAX_FRAME {
        Err(CodecError::FrameTooLarge {
            len,
            max: MAX_FRAME,
        })
    } else {
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde::Deserialize;

    #[derive(Debug, Serialize, Deserialize, PartialEq)]
    struct Sample {
        a: u64,
        b: String,
    }
    impl Versioned for Sample {
        const VERSION: u8 = 2;
        const WHAT: &'static str = "sample";
        fn migrate(version: u8, payload: &[u8]) -> Result<Self, CodecError> {
            match version {
                1 => Ok(Sample {
                    a: from_bytes::<u64>("sample v1", payload)?,
                    b: String::new(),
                }),
                _ => Err(CodecError::UnknownVersion {
                    what: Self::WHAT,
                    found: version,
                }),
            }
        }
    }

    #[test]
    fn versioned_roundtrip_and_migration() {
        let s = Sample {
            a: 7,
            b: "x".into(),
        };
        assert_eq!(
            decode_versioned::<Sample>(&encode_versioned(&s)).unwrap(),
            s
        );
        let mut v1 = vec![1u8];
        v1.extend(postcard::to_stdvec(&9u64).unwrap());
        assert_eq!(
            decode_versioned::<Sample>(&v1).unwrap(),
            Sample {
                a: 9,
                b: String::new()
            }
        );
        let mut v3 = encode_versioned(&s);
        v3[0] = 3;
        assert!(matches!(
            decode_versioned::<Sample>(&v3),
            Err(CodecError::NewerVersion { found: 3, .. })
        ));
        assert!(decode_versioned::<Sample>(&[]).is_err());
    }

    #[test]
    fn hello_rejects_foreign_bytes() {
        assert!(Hello::decode(b"GET / ").is_err());
        let h = Hello::current();
        assert_eq!(Hello::decode(&h.encode()).unwrap(), h);
    }
}

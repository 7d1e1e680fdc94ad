//! Configuration errors, and where a key's value came from (`Source`).

use serde::{Deserialize, Serialize};
use std::fmt;

/// A configuration error, naming the key, the value and what is allowed.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ConfError {
    #[error("unknown config key '{key}' (from {origin}){hint}")]
    UnknownKey {
        key: String,
        origin: Source,
        hint: String,
    },
    #[error("invalid value {value} for config key '{key}' (from {origin}): {allowed}")]
    InvalidValue {
        key: String,
        value: String,
        origin: Source,
        allowed: String,
    },
    #[error("cannot read config file {path}: {reason}")]
    File { path: String, reason: String },
    #[error("'{arg}' is not key=value")]
    NotKeyValue { arg: String },
}

/// Where a key's value came from.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Source {
    Default,
    File(String),
    Env(String),
    Flag(String),
}

impl fmt::Display for Source {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Source::Default => write!(f, "default"),
            Source::File(p) => write!(f, "file {p}"),
            Source::Env(v) => write!(f, "env {v}"),
            Source::Flag(a) => write!(f, "flag {a}"),
        }
    }
}

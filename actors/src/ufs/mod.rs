//! Under-file-systems through OpenDAL: `s3://bucket/prefix` on any
//! S3-compatible endpoint and `file:///dir` for a local directory.
//!
//! A [`Ufs`] is one mounted location. Paths given to it are relative to the
//! mount's root: `""` is the root, `"a/b"` an object or directory below it.
//! Every error is an [`FsError`] naming the operation, the object and what
//! the store answered (the S3 error code when there is one); requests that
//! failed in a way worth retrying (throttling, 5xx, a dropped connection) are
//! retried with backoff first. Secrets given in mount properties never appear
//! in errors, `Debug` output or logs.
//!
//! [`FsError`]: curvine_messages::FsError
//!
//! Modules: `uri` (parsed locations), `config` (mount properties and
//! request limits), `client` (the OpenDAL client of a location, its calls'
//! traces and metrics, `check` and `stat`), `errors` (what a failed call
//! becomes), `list` (directory listings, page by page) and `objects`
//! (reading, writing, creating, deleting and renaming objects).

mod client;
mod config;
mod errors;
mod list;
mod objects;
mod uri;

pub use config::{check_props, is_secret, redacted, UfsOptions, S3_KEYS};
pub use errors::describe;
pub use objects::UfsWriter;
pub use uri::{Scheme, UfsUri};

use std::fmt;

use opendal::Operator;

use crate::trace::Tracer;

/// An object or directory in the UFS.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UfsObject {
    /// Its name within its directory.
    pub name: String,
    pub is_dir: bool,
    pub len: u64,
    /// Last modification, in ns since the epoch (0 when the store has none).
    pub mtime_ns: i64,
    /// The store's entity tag (empty when it has none: local directories).
    pub etag: String,
}

impl UfsObject {
    /// Whether `other` describes the same content (length, mtime and etag).
    pub fn same_content(&self, other: &UfsObject) -> bool {
        self.is_dir == other.is_dir
            && self.len == other.len
            && self.mtime_ns == other.mtime_ns
            && self.etag == other.etag
    }
}

/// One page of a directory listing.
#[derive(Debug, Clone, Default)]
pub struct UfsPage {
    pub entries: Vec<UfsObject>,
    /// Where the next page starts (pass it back to `list_page`); `None`
    /// after the last page.
    pub next: Option<String>,
}

/// One mounted UFS location.
#[derive(Clone)]
pub struct Ufs {
    uri: UfsUri,
    op: Operator,
    opts: UfsOptions,
    /// The store lists in key order and can start after a key (S3).
    sorted_listing: bool,
    read_if_match: bool,
    /// Where calls made for a traced request are recorded (actor `ufs`).
    tracer: Option<Tracer>,
}

impl fmt::Debug for Ufs {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Ufs({})", self.uri)
    }
}

/// Where a local-directory UFS keeps uploads until they complete; never listed.
pub const UPLOAD_DIR: &str = ".curvine-uploads";

pub(super) fn dir_key(rel: &str) -> String {
    if rel.is_empty() {
        "/".into()
    } else {
        format!("{}/", rel.trim_end_matches('/'))
    }
}

pub(super) fn object(name: String, meta: &opendal::Metadata) -> UfsObject {
    UfsObject {
        name,
        is_dir: meta.is_dir(),
        len: if meta.is_dir() {
            0
        } else {
            meta.content_length()
        },
        mtime_ns: meta
            .last_modified()
            .map(|t| t.into_inner().as_nanosecond() as i64)
            .unwrap_or(0),
        etag: meta.etag().unwrap_or("").trim_matches('"').to_string(),
    }
}

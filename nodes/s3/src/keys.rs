//! Buckets and keys as paths, and the names S3 allows that a file system
//! cannot hold.

use s3s::{s3_error, S3Result};

use curvine_messages::path::child;
use curvine_messages::Attr;

/// Where a multipart upload keeps its parts, under the root (a name no
/// bucket can have: bucket names start with a letter or digit).
pub(crate) const UPLOADS: &str = ".s3-uploads";

/// Longest key S3 accepts (bytes).
const MAX_KEY: usize = 1024;

/// `root` as an absolute path without a trailing slash (`/` stays `/`).
pub(crate) fn normalize_root(root: &str) -> String {
    curvine_messages::path::normalize(root, "/").unwrap_or_else(|_| "/".into())
}

/// The directory of `bucket`. Bucket names are checked by the S3 layer
/// (3-63 lowercase letters, digits, dots and hyphens); a name that would
/// be a hidden directory is refused here too.
pub(crate) fn bucket_path(root: &str, bucket: &str) -> S3Result<String> {
    if bucket.is_empty() || bucket.starts_with('.') || bucket.contains('/') {
        return Err(s3_error!(
            InvalidBucketName,
            "invalid bucket name {bucket:?}"
        ));
    }
    Ok(child(root, bucket))
}

/// The path of `key` in `bucket`, for a key the file system can hold: no
/// empty, `.` or `..` segments, no leading `/` and no NUL. A key ending in
/// `/` names a directory (a "folder" marker); the path has no trailing `/`.
pub(crate) fn object_path(root: &str, bucket: &str, key: &str) -> S3Result<String> {
    let dir = bucket_path(root, bucket)?;
    check_key(key)?;
    Ok(format!("{dir}/{}", key.trim_end_matches('/')))
}

fn check_key(key: &str) -> S3Result<()> {
    if key.len() > MAX_KEY {
        return Err(s3_error!(
            KeyTooLongError,
            "a key is at most {MAX_KEY} bytes"
        ));
    }
    let body = key.strip_suffix('/').unwrap_or(key);
    let bad = body.is_empty()
        || key.contains('\0')
        || body
            .split('/')
            .any(|seg| seg.is_empty() || seg == "." || seg == "..");
    if bad {
        return Err(s3_error!(
            InvalidArgument,
            "key {key:?} cannot be stored as a path: it has an empty, \".\" or \"..\" segment, a leading \"/\" or a NUL"
        ));
    }
    Ok(())
}

/// Whether a key names a directory marker (`photos/`).
pub(crate) fn is_dir_key(key: &str) -> bool {
    key.ends_with('/')
}

/// The ETag of a file's current content: its inode, size and mtime (each
/// new version written through any client has a new mtime). It is not an
/// MD5 (it has a `-`), so clients do not compare it with one.
pub(crate) fn etag(attr: &Attr) -> String {
    format!("{:x}{:x}-{:x}", attr.ino, attr.size, attr.mtime_ns)
}

/// A file's mtime as an S3 timestamp.
pub(crate) fn timestamp(ns: i64) -> s3s::dto::Timestamp {
    let t = if ns >= 0 {
        std::time::UNIX_EPOCH + std::time::Duration::from_nanos(ns as u64)
    } else {
        std::time::UNIX_EPOCH
    };
    s3s::dto::Timestamp::from(t)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_below_their_bucket() {
        assert_eq!(object_path("/", "b", "a/c.txt").unwrap(), "/b/a/c.txt");
        assert_eq!(object_path("/data", "b", "dir/").unwrap(), "/data/b/dir");
        for bad in ["", "/a", "a//b", "a/../b", "..", "./a", "a/.", "/"] {
            assert!(object_path("/", "b", bad).is_err(), "{bad:?} accepted");
        }
        assert!(bucket_path("/", ".s3-uploads").is_err());
        assert_eq!(normalize_root("data/"), "/data");
        assert_eq!(normalize_root("//"), "/");
    }
}

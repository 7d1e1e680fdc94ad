//! UFS locations: `s3://bucket/prefix` and `file:///dir`, parsed and checked.

use std::fmt;

use curvine_messages::{FsError, FsResult};

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Scheme {
    S3,
    File,
}

impl Scheme {
    pub fn name(self) -> &'static str {
        match self {
            Scheme::S3 => "s3",
            Scheme::File => "file",
        }
    }
}

/// A parsed UFS location: `s3://bucket/prefix` or `file:///dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UfsUri {
    pub scheme: Scheme,
    /// The bucket (S3) or empty (file).
    pub bucket: String,
    /// The prefix inside the bucket without leading or trailing `/` (S3),
    /// or the absolute directory (file).
    pub root: String,
}

impl UfsUri {
    pub fn parse(uri: &str) -> FsResult<UfsUri> {
        let bad = |why: &str| FsError::InvalidArgument(format!("UFS location {uri:?}: {why}"));
        if let Some(rest) = uri.strip_prefix("s3://") {
            let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
            if bucket.is_empty() {
                return Err(bad("no bucket (expected s3://bucket/prefix)"));
            }
            let valid = bucket.len() >= 3
                && bucket.len() <= 63
                && bucket.bytes().all(|b| {
                    b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-' || b == b'.'
                });
            if !valid {
                return Err(bad(
                    "bucket names are 3 to 63 characters of a-z, 0-9, '-' and '.'",
                ));
            }
            let prefix = prefix.trim_matches('/');
            if prefix.split('/').any(|c| c == "." || c == "..") || prefix.contains("//") {
                return Err(bad("the prefix may not hold '.', '..' or empty components"));
            }
            Ok(UfsUri {
                scheme: Scheme::S3,
                bucket: bucket.to_string(),
                root: prefix.to_string(),
            })
        } else if let Some(rest) = uri.strip_prefix("file://") {
            if !rest.starts_with('/') {
                return Err(bad("expected an absolute directory, file:///dir"));
            }
            let dir = rest.trim_end_matches('/');
            if dir.split('/').any(|c| c == "." || c == "..") {
                return Err(bad("the directory may not hold '.' or '..'"));
            }
            Ok(UfsUri {
                scheme: Scheme::File,
                bucket: String::new(),
                root: if dir.is_empty() {
                    "/".into()
                } else {
                    dir.into()
                },
            })
        } else {
            Err(bad("supported schemes are s3:// and file://"))
        }
    }

    /// The location of an object below this root, for messages.
    pub fn join(&self, rel: &str) -> String {
        let base = self.to_string();
        if rel.is_empty() {
            base
        } else {
            format!("{}/{rel}", base.trim_end_matches('/'))
        }
    }
}

impl fmt::Display for UfsUri {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.scheme {
            Scheme::S3 if self.root.is_empty() => write!(f, "s3://{}", self.bucket),
            Scheme::S3 => write!(f, "s3://{}/{}", self.bucket, self.root),
            Scheme::File => write!(f, "file://{}", self.root),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn uris_parse_and_print() {
        let u = UfsUri::parse("s3://bucket-1/a/b/").unwrap();
        assert_eq!(
            (u.scheme, u.bucket.as_str(), u.root.as_str()),
            (Scheme::S3, "bucket-1", "a/b")
        );
        assert_eq!(u.to_string(), "s3://bucket-1/a/b");
        assert_eq!(u.join("x/y"), "s3://bucket-1/a/b/x/y");
        let f = UfsUri::parse("file:///tmp/data/").unwrap();
        assert_eq!((f.scheme, f.root.as_str()), (Scheme::File, "/tmp/data"));
        for bad in [
            "s3://",
            "s3://B/x",
            "s3://ab",
            "hdfs://x/y",
            "file://rel",
            "s3://bkt/a/../b",
        ] {
            let e = UfsUri::parse(bad).unwrap_err();
            assert!(matches!(e, FsError::InvalidArgument(_)), "{bad}: {e}");
            assert!(e.to_string().contains(bad), "{e}");
        }
    }
}

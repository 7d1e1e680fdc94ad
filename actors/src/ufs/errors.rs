//! What a failed UFS call becomes: an [`FsError`] naming the operation, the
//! object and what the store answered (never the request's signed
//! headers), counted in the metrics.

use opendal::ErrorKind;

use curvine_messages::FsError;

use super::Ufs;

impl Ufs {
    /// An error of `what` on `rel`, with the store's answer.
    pub(super) fn error(&self, what: &str, rel: &str, e: opendal::Error) -> FsError {
        let kind = format!("{:?}", e.kind());
        crate::stats::process().add(
            "curvine_ufs_errors_total",
            "Under-file-system operations that failed, per scheme, operation and error kind.",
            &[
                ("scheme", self.uri.scheme.name()),
                ("op", what),
                ("error", &kind),
            ],
            1,
        );
        let location = self.uri.join(rel);
        let mut cause = describe(&e);
        if cause.contains("signing credential") {
            cause.push_str(
                " (no credentials: give -c s3.credentials.access=... -c s3.credentials.secret=...)",
            );
        }
        match e.kind() {
            ErrorKind::NotFound if cause.contains("NoSuchBucket") => {
                FsError::Ufs(format!("{what} {location}: {cause}"))
            }
            ErrorKind::NotFound => FsError::NotFound(format!("{what} {location}: {cause}")),
            ErrorKind::ConditionNotMatch => FsError::Stale(format!(
                "{what} {location}: the object changed while it was read"
            )),
            ErrorKind::IsADirectory => FsError::IsADirectory(location),
            ErrorKind::NotADirectory => FsError::NotADirectory(location),
            ErrorKind::AlreadyExists => FsError::AlreadyExists(location),
            _ => FsError::Ufs(format!("{what} {location}: {cause}")),
        }
    }
}

/// Whether an error is the OS saying a path component is not a directory.
pub(super) fn not_a_directory(e: &opendal::Error) -> bool {
    if e.kind() == ErrorKind::NotADirectory {
        return true;
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        if let Some(io) = s.downcast_ref::<std::io::Error>() {
            return io.raw_os_error() == Some(libc::ENOTDIR);
        }
        source = s.source();
    }
    e.message().contains("os error 20")
}

/// What the store said, shortly: the S3 error code and message when the
/// answer carried one, else the error's kind, message and cause. Never the
/// request's headers (they carry the signature).
pub fn describe(e: &opendal::Error) -> String {
    let message = e.message();
    if let Some(code) = field(message, "code") {
        let text = field(message, "message").unwrap_or_default();
        return if text.is_empty() {
            code
        } else {
            format!("{code}: {text}")
        };
    }
    let mut out = format!("{}", e.kind());
    if !message.is_empty() {
        out.push_str(": ");
        out.push_str(message);
    }
    let mut source = std::error::Error::source(e);
    while let Some(s) = source {
        out.push_str(": ");
        out.push_str(&s.to_string());
        source = s.source();
    }
    if e.is_temporary() {
        out.push_str(" (retried)");
    }
    out
}

/// The value of `name: "..."` in a `Debug`-formatted S3 error.
fn field(message: &str, name: &str) -> Option<String> {
    let start = message.find(&format!("{name}: \""))? + name.len() + 3;
    let rest = &message[start..];
    let end = rest.find('"')?;
    Some(rest[..end].to_string())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn s3_error_codes_are_extracted() {
        let m = r#"S3Error { code: "NoSuchBucket", message: "The specified bucket does not exist", resource: "", request_id: "" }"#;
        assert_eq!(field(m, "code").unwrap(), "NoSuchBucket");
        assert_eq!(
            field(m, "message").unwrap(),
            "The specified bucket does not exist"
        );
    }
}

//! The file-system error carried on the wire and returned to users, with its errno.

use serde::{Deserialize, Serialize};

/// Formats the optional detail that follows an error's fixed text.
fn detail(text: &str) -> String {
    if text.is_empty() {
        String::new()
    } else {
        format!(": {text}")
    }
}

/// Every error a namespace or data operation can return. The fixed text of each
/// variant is the one `strerror` uses; the `String` adds what the error concerns
/// when the caller cannot know it (an inner path component, a limit).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize, thiserror::Error)]
pub enum FsError {
    #[error("no such file or directory{}", detail(.0))]
    NotFound(String),
    #[error("file exists{}", detail(.0))]
    AlreadyExists(String),
    #[error("not a directory{}", detail(.0))]
    NotADirectory(String),
    #[error("is a directory{}", detail(.0))]
    IsADirectory(String),
    #[error("directory not empty{}", detail(.0))]
    NotEmpty(String),
    #[error("invalid argument{}", detail(.0))]
    InvalidArgument(String),
    #[error("file name too long{}", detail(.0))]
    NameTooLong(String),
    #[error("permission denied{}", detail(.0))]
    PermissionDenied(String),
    #[error("operation not permitted{}", detail(.0))]
    NotPermitted(String),
    #[error("no space left on device{}", detail(.0))]
    NoSpace(String),
    #[error("input/output error{}", detail(.0))]
    Io(String),
    #[error("invalid cross-device link{}", detail(.0))]
    CrossDevice(String),
    #[error("operation not supported{}", detail(.0))]
    NotSupported(String),
    #[error("too many levels of symbolic links{}", detail(.0))]
    TooManyLinks(String),
    /// An extended attribute that does not exist.
    #[error("no data available{}", detail(.0))]
    NoData(String),
    /// A value larger than its limit (an extended attribute over 64 KiB).
    #[error("argument list too long{}", detail(.0))]
    TooBig(String),
    /// A name is held by an operation in progress; the caller retries.
    #[error("device or resource busy{}", detail(.0))]
    Busy(String),
    /// A file is open for writing by another writer (not retried: the
    /// caller waits for that writer or removes the file).
    #[error("device or resource busy{}", detail(.0))]
    InUse(String),
    /// A shard or node cannot be reached right now; the caller may retry.
    #[error("resource temporarily unavailable{}", detail(.0))]
    Unavailable(String),
    #[error("timed out{}", detail(.0))]
    TimedOut(String),
    /// The peer speaks another protocol version or sent bytes that do not decode.
    #[error("protocol error{}", detail(.0))]
    Protocol(String),
    /// Stored data failed a version or checksum check.
    #[error("data corrupted{}", detail(.0))]
    Corrupt(String),
    /// The node holding the data or the shard is down (EIO, not retried:
    /// the caller learns at once instead of waiting for the node).
    #[error("input/output error: node down{}", detail(.0))]
    NodeDown(String),
    /// The under-file-system (S3, a mounted directory) failed a request; the
    /// text names the operation, the object and the S3 error code.
    #[error("under-file-system error{}", detail(.0))]
    Ufs(String),
    /// The UFS object changed while it was read: nothing of it is kept, the
    /// caller opens it again.
    #[error("stale file handle{}", detail(.0))]
    Stale(String),
    /// A name with bytes that are not UTF-8 where only UTF-8 can go (an
    /// object key in a UFS).
    #[error("invalid or incomplete multibyte or wide character{}", detail(.0))]
    IllegalName(String),
    /// A file with as many names as it may have (EMLINK).
    #[error("too many links{}", detail(.0))]
    LinkLimit(String),
}

/// Result of a file-system operation.
pub type FsResult<T> = Result<T, FsError>;

impl FsError {
    /// The errno a POSIX caller (FUSE, the CLI's exit status) sees for this error.
    pub fn errno(&self) -> i32 {
        match self {
            FsError::NotFound(_) => libc::ENOENT,
            FsError::AlreadyExists(_) => libc::EEXIST,
            FsError::NotADirectory(_) => libc::ENOTDIR,
            FsError::IsADirectory(_) => libc::EISDIR,
            FsError::NotEmpty(_) => libc::ENOTEMPTY,
            FsError::InvalidArgument(_) => libc::EINVAL,
            FsError::NameTooLong(_) => libc::ENAMETOOLONG,
            FsError::PermissionDenied(_) => libc::EACCES,
            FsError::NotPermitted(_) => libc::EPERM,
            FsError::NoSpace(_) => libc::ENOSPC,
            FsError::Io(_) => libc::EIO,
            FsError::CrossDevice(_) => libc::EXDEV,
            FsError::NotSupported(_) => libc::ENOTSUP,
            FsError::TooManyLinks(_) => libc::ELOOP,
            FsError::NoData(_) => libc::ENODATA,
            FsError::TooBig(_) => libc::E2BIG,
            FsError::Busy(_) => libc::EBUSY,
            FsError::InUse(_) => libc::EBUSY,
            FsError::Unavailable(_) => libc::EAGAIN,
            FsError::TimedOut(_) => libc::ETIMEDOUT,
            FsError::Protocol(_) => libc::EPROTO,
            FsError::Corrupt(_) => libc::EIO,
            FsError::NodeDown(_) => libc::EIO,
            FsError::Ufs(_) => libc::EIO,
            FsError::Stale(_) => libc::ESTALE,
            FsError::IllegalName(_) => libc::EILSEQ,
            FsError::LinkLimit(_) => libc::EMLINK,
        }
    }

    /// A short stable name of the kind, for metrics, traces and JSON output.
    pub fn kind_name(&self) -> &'static str {
        match self {
            FsError::NotFound(_) => "not_found",
            FsError::AlreadyExists(_) => "already_exists",
            FsError::NotADirectory(_) => "not_a_directory",
            FsError::IsADirectory(_) => "is_a_directory",
            FsError::NotEmpty(_) => "not_empty",
            FsError::InvalidArgument(_) => "invalid_argument",
            FsError::NameTooLong(_) => "name_too_long",
            FsError::PermissionDenied(_) => "permission_denied",
            FsError::NotPermitted(_) => "not_permitted",
            FsError::NoSpace(_) => "no_space",
            FsError::Io(_) => "io",
            FsError::CrossDevice(_) => "cross_device",
            FsError::NotSupported(_) => "not_supported",
            FsError::TooManyLinks(_) => "too_many_links",
            FsError::NoData(_) => "no_data",
            FsError::TooBig(_) => "too_big",
            FsError::Busy(_) => "busy",
            FsError::InUse(_) => "in_use",
            FsError::Unavailable(_) => "unavailable",
            FsError::TimedOut(_) => "timed_out",
            FsError::Protocol(_) => "protocol",
            FsError::Corrupt(_) => "corrupt",
            FsError::NodeDown(_) => "node_down",
            FsError::Ufs(_) => "ufs",
            FsError::Stale(_) => "stale",
            FsError::IllegalName(_) => "illegal_name",
            FsError::LinkLimit(_) => "link_limit",
        }
    }

    /// Whether retrying the same request later may succeed without any change
    /// by the caller (a lock held by another operation, a shard restarting).
    pub fn is_retryable(&self) -> bool {
        matches!(self, FsError::Busy(_) | FsError::Unavailable(_))
    }

    /// The same error with its detail replaced (used to name the user's path).
    pub fn with_detail(self, text: impl Into<String>) -> FsError {
        let text = text.into();
        match self {
            FsError::NotFound(_) => FsError::NotFound(text),
            FsError::AlreadyExists(_) => FsError::AlreadyExists(text),
            FsError::NotADirectory(_) => FsError::NotADirectory(text),
            FsError::IsADirectory(_) => FsError::IsADirectory(text),
            FsError::NotEmpty(_) => FsError::NotEmpty(text),
            FsError::InvalidArgument(_) => FsError::InvalidArgument(text),
            FsError::NameTooLong(_) => FsError::NameTooLong(text),
            FsError::PermissionDenied(_) => FsError::PermissionDenied(text),
            FsError::NotPermitted(_) => FsError::NotPermitted(text),
            FsError::NoSpace(_) => FsError::NoSpace(text),
            FsError::Io(_) => FsError::Io(text),
            FsError::CrossDevice(_) => FsError::CrossDevice(text),
            FsError::NotSupported(_) => FsError::NotSupported(text),
            FsError::TooManyLinks(_) => FsError::TooManyLinks(text),
            FsError::NoData(_) => FsError::NoData(text),
            FsError::TooBig(_) => FsError::TooBig(text),
            FsError::Busy(_) => FsError::Busy(text),
            FsError::InUse(_) => FsError::InUse(text),
            FsError::Unavailable(_) => FsError::Unavailable(text),
            FsError::TimedOut(_) => FsError::TimedOut(text),
            FsError::Protocol(_) => FsError::Protocol(text),
            FsError::Corrupt(_) => FsError::Corrupt(text),
            FsError::Stale(_) => FsError::Stale(text),
            FsError::LinkLimit(_) => FsError::LinkLimit(text),
            // Keep where only UTF-8 goes: that is what the user must act on.
            FsError::IllegalName(why) if !text.is_empty() => {
                FsError::IllegalName(format!("{text}: {why}"))
            }
            FsError::IllegalName(why) => FsError::IllegalName(why),
            // Keep what the UFS said: it is the cause the user acts on.
            FsError::Ufs(cause) if !text.is_empty() => FsError::Ufs(format!("{text}: {cause}")),
            FsError::Ufs(cause) => FsError::Ufs(cause),
            // Keep which node is down: that is what the user must act on.
            FsError::NodeDown(node) if !text.is_empty() => {
                FsError::NodeDown(format!("{text}: {node}"))
            }
            FsError::NodeDown(node) => FsError::NodeDown(node),
        }
    }

    /// The detail text alone.
    pub fn detail(&self) -> &str {
        match self {
            FsError::NotFound(s)
            | FsError::AlreadyExists(s)
            | FsError::NotADirectory(s)
            | FsError::IsADirectory(s)
            | FsError::NotEmpty(s)
            | FsError::InvalidArgument(s)
            | FsError::NameTooLong(s)
            | FsError::PermissionDenied(s)
            | FsError::NotPermitted(s)
            | FsError::NoSpace(s)
            | FsError::Io(s)
            | FsError::CrossDevice(s)
            | FsError::NotSupported(s)
            | FsError::TooManyLinks(s)
            | FsError::NoData(s)
            | FsError::TooBig(s)
            | FsError::Busy(s)
            | FsError::InUse(s)
            | FsError::Unavailable(s)
            | FsError::TimedOut(s)
            | FsError::Protocol(s)
            | FsError::Corrupt(s)
            | FsError::NodeDown(s)
            | FsError::Ufs(s)
            | FsError::Stale(s)
            | FsError::IllegalName(s)
            | FsError::LinkLimit(s) => s,
        }
    }

    /// The error's fixed text without its detail (`no such file or directory`).
    pub fn text(&self) -> String {
        self.clone().with_detail("").to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_is_strerror_with_optional_detail() {
        assert_eq!(
            FsError::NotFound(String::new()).to_string(),
            "no such file or directory"
        );
        assert_eq!(
            FsError::InvalidArgument("cannot move a directory into itself".into()).to_string(),
            "invalid argument: cannot move a directory into itself"
        );
    }

    #[test]
    fn errno_mapping() {
        assert_eq!(FsError::NotEmpty(String::new()).errno(), libc::ENOTEMPTY);
        assert_eq!(
            FsError::NameTooLong(String::new()).errno(),
            libc::ENAMETOOLONG
        );
        assert_eq!(FsError::CrossDevice(String::new()).errno(), libc::EXDEV);
        assert_eq!(FsError::NotSupported(String::new()).errno(), libc::ENOTSUP);
        // A symlink loop and a file with too many names are two errors.
        assert_eq!(FsError::TooManyLinks(String::new()).errno(), libc::ELOOP);
        assert_eq!(FsError::LinkLimit(String::new()).errno(), libc::EMLINK);
        assert_eq!(
            FsError::LinkLimit("x".into()).with_detail("/a").to_string(),
            "too many links: /a"
        );
    }
}

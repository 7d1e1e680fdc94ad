//! File-system errors as S3 errors: the S3 code a client acts on, with a
//! message naming the object and what the cluster said.

use s3s::{S3Error, S3ErrorCode};

use curvine_messages::FsError;

/// What a request was about, for the code a missing path gets.
#[derive(Clone, Copy)]
pub(crate) enum Subject<'a> {
    Bucket(&'a str),
    Object(&'a str, &'a str),
    Upload(&'a str),
}

impl Subject<'_> {
    fn name(&self) -> String {
        match self {
            Subject::Bucket(b) => format!("bucket {b}"),
            Subject::Object(b, k) => format!("{b}/{k}"),
            Subject::Upload(id) => format!("upload {id}"),
        }
    }
}

/// The S3 error for `e`, met while serving a request about `subject`.
pub(crate) fn s3_err(e: FsError, subject: Subject<'_>) -> S3Error {
    use S3ErrorCode as C;
    let code = match (&e, subject) {
        (FsError::NotFound(_) | FsError::NotADirectory(_), Subject::Bucket(_)) => C::NoSuchBucket,
        (FsError::NotFound(_) | FsError::NotADirectory(_), Subject::Upload(_)) => C::NoSuchUpload,
        (
            FsError::NotFound(_) | FsError::NotADirectory(_) | FsError::IsADirectory(_),
            Subject::Object(..),
        ) => C::NoSuchKey,
        (FsError::NotEmpty(_), Subject::Bucket(_)) => C::BucketNotEmpty,
        (FsError::AlreadyExists(_), Subject::Bucket(_)) => C::BucketAlreadyOwnedByYou,
        (FsError::PermissionDenied(_) | FsError::NotPermitted(_), _) => C::AccessDenied,
        (FsError::NameTooLong(_), Subject::Object(..)) => C::KeyTooLongError,
        (FsError::InvalidArgument(_) | FsError::IllegalName(_), _) => C::InvalidArgument,
        // Another writer holds the file open, or a name is being changed.
        (FsError::InUse(_) | FsError::Busy(_), _) => C::OperationAborted,
        (FsError::Unavailable(_) | FsError::TimedOut(_) | FsError::NodeDown(_), _) => {
            C::ServiceUnavailable
        }
        // A full cache is not a broken one: 507, as S3-compatible stores
        // answer when their disks are full.
        (FsError::NoSpace(_), _) => C::Custom(INSUFFICIENT_STORAGE.into()),
        _ => C::InternalError,
    };
    let message = format!("{}: {e}", subject.name());
    // The client's mistakes are its to see; the node's own failures are
    // the operator's.
    if matches!(code, C::InternalError | C::ServiceUnavailable) {
        tracing::warn!(code = code.as_str(), "S3 request failed: {message}");
    } else {
        tracing::debug!(code = code.as_str(), "S3 request refused: {message}");
    }
    let full = matches!(&code, C::Custom(c) if &**c == INSUFFICIENT_STORAGE);
    let mut err = S3Error::with_message(code, message);
    if full {
        err.set_status_code(http::StatusCode::INSUFFICIENT_STORAGE);
    }
    err
}

/// The code of a request refused because no tier had room for its bytes.
const INSUFFICIENT_STORAGE: &str = "InsufficientStorage";

/// The error of a request body that could not be read.
pub(crate) fn body_err(e: impl std::fmt::Display) -> S3Error {
    S3Error::with_message(
        S3ErrorCode::IncompleteBody,
        format!("the request body ended early: {e}"),
    )
}

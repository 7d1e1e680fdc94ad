//! The mount table: which UFS location is mounted at which namespace path,
//! how, and with which properties. Shard 0 stores it; every node caches it.

use std::collections::BTreeMap;
use std::fmt;

use serde::{Deserialize, Serialize};

use crate::block::TierKind;
use crate::codec::{from_bytes, CodecError, Versioned};
use crate::error::{FsError, FsResult};
use crate::trace::TraceCtx;

/// Which side is the authority for a mount's content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum WriteType {
    /// The UFS is the authority: the namespace caches it, writes go to the
    /// UFS when a file is closed.
    CacheMode,
    /// The cluster is the authority: writes land in the cache and are
    /// persisted to the UFS in the background.
    FsMode,
}

impl WriteType {
    pub fn parse(text: &str) -> FsResult<WriteType> {
        match text {
            "cache_mode" | "cache" => Ok(WriteType::CacheMode),
            "fs_mode" | "fs" => Ok(WriteType::FsMode),
            other => Err(FsError::InvalidArgument(format!(
                "write type {other:?}: expected cache_mode or fs_mode"
            ))),
        }
    }
}

impl fmt::Display for WriteType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            WriteType::CacheMode => "cache_mode",
            WriteType::FsMode => "fs_mode",
        })
    }
}

/// Mount properties whose values are never shown (logs, reports, listings).
pub fn is_secret(key: &str) -> bool {
    let k = key.to_ascii_lowercase();
    k.contains("secret") || k.contains("token") || k.contains("password")
}

/// One mount.
#[derive(Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountInfo {
    /// Never reused within a cluster: inodes remember the mount they came from.
    pub id: u32,
    /// The mount point in the namespace (absolute, normalized).
    pub path: String,
    /// The UFS location (`s3://bucket/prefix`, `file:///dir`).
    pub ufs: String,
    pub write_type: WriteType,
    /// `-c key=value` properties (credentials, endpoint).
    pub props: BTreeMap<String, String>,
    /// Cached data is dropped this long after it was read from (or last
    /// checked against) the UFS; the UFS keeps it. 0: never.
    pub ttl_ms: u64,
    /// How long a cache_mode file is trusted before the UFS object is
    /// checked again; `None`: the node's `ufs.check_interval`.
    pub check_interval_ms: Option<u64>,
    /// Check the UFS object on every open (cache_mode).
    pub read_verify_ufs: bool,
    /// Keep what is read from the UFS in the cache.
    pub auto_cache: bool,
    /// File settings for files under the mount (`None`: the cluster's).
    pub replicas: Option<u16>,
    pub block_size: Option<u64>,
    pub storage: Option<TierKind>,
    pub created_ns: i64,
}

impl MountInfo {
    /// The same mount with secret property values replaced.
    pub fn redacted(&self) -> MountInfo {
        let mut m = self.clone();
        for (k, v) in m.props.iter_mut() {
            if is_secret(k) {
                *v = "<redacted>".into();
            }
        }
        m
    }

    /// The path below the mount point of `path` (`""` for the point
    /// itself), or `None` when `path` is not under this mount.
    pub fn relative<'a>(&self, path: &'a str) -> Option<&'a str> {
        if self.path == "/" {
            return Some(path.trim_start_matches('/'));
        }
        let rest = path.strip_prefix(self.path.as_str())?;
        if rest.is_empty() {
            Some("")
        } else {
            rest.strip_prefix('/')
        }
    }
}

/// Never prints secret property values.
impl fmt::Debug for MountInfo {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let shown = self.redacted();
        f.debug_struct("MountInfo")
            .field("id", &shown.id)
            .field("path", &shown.path)
            .field("ufs", &shown.ufs)
            .field("write_type", &shown.write_type)
            .field("props", &shown.props)
            .field("ttl_ms", &shown.ttl_ms)
            .field("check_interval_ms", &shown.check_interval_ms)
            .field("read_verify_ufs", &shown.read_verify_ufs)
            .field("auto_cache", &shown.auto_cache)
            .field("replicas", &shown.replicas)
            .field("block_size", &shown.block_size)
            .field("storage", &shown.storage)
            .finish()
    }
}

/// Whether a file's content is in its UFS.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum Persist {
    /// The UFS holds what the cache holds.
    Synced,
    /// Written in the cache, not yet in the UFS (fs_mode).
    Pending { since_ns: i64 },
    /// Persisting failed; it is tried again at `next_ns`.
    Failed {
        since_ns: i64,
        attempts: u32,
        error: String,
        next_ns: i64,
    },
}

impl Persist {
    /// When the content waiting to be persisted was written (`None` once persisted).
    pub fn since_ns(&self) -> Option<i64> {
        match self {
            Persist::Synced => None,
            Persist::Pending { since_ns } | Persist::Failed { since_ns, .. } => Some(*since_ns),
        }
    }
}

/// A change to replay on an fs_mode mount's UFS, in order. Each is checked
/// against the namespace when it is applied, so a replay that comes late
/// (or twice) never undoes a later change.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum UfsOp {
    /// A file was closed: upload it if `path` still names inode `ino`.
    Put { path: String, ino: u64 },
    /// Delete the object (or the tree, for a directory) if the namespace no
    /// longer has `path`.
    Delete { path: String, dir: bool },
    /// Move the object (or tree) if the namespace now has `to`, not `from`.
    Rename { from: String, to: String, dir: bool },
}

/// One journal record (kept in shard 0 until applied).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct JournalEntry {
    pub seq: u64,
    pub mount: u32,
    pub op: UfsOp,
    pub at_ns: i64,
    /// The trace of the request that made the change, when it was traced:
    /// its replay on the UFS joins it.
    pub trace: Option<TraceCtx>,
}

/// [`JournalEntry`] as version 1 stored it (no trace).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct JournalEntryV1 {
    seq: u64,
    mount: u32,
    op: UfsOp,
    at_ns: i64,
}

impl Versioned for JournalEntry {
    const VERSION: u8 = 2;
    const WHAT: &'static str = "UFS journal entry";
    fn migrate(version: u8, payload: &[u8]) -> Result<Self, CodecError> {
        match version {
            1 => from_bytes::<JournalEntryV1>(Self::WHAT, payload).map(|v| JournalEntry {
                seq: v.seq,
                mount: v.mount,
                op: v.op,
                at_ns: v.at_ns,
                trace: None,
            }),
            found => Err(CodecError::UnknownVersion {
                what: Self::WHAT,
                found,
            }),
        }
    }
}

/// What an inode under a mount knows of its UFS object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UfsState {
    /// The mount it belongs to ([`MountInfo::id`]).
    pub mount: u32,
    /// The UFS object's length, mtime and etag when the cache last matched it.
    pub len: u64,
    pub mtime_ns: i64,
    pub etag: String,
    /// When the UFS object was last compared (files) or the directory last
    /// listed whole (directories); 0: never.
    pub checked_ns: i64,
    pub persist: Persist,
}

impl UfsState {
    /// A name just read from the UFS.
    pub fn synced(mount: u32, len: u64, mtime_ns: i64, etag: String, now_ns: i64) -> UfsState {
        UfsState {
            mount,
            len,
            mtime_ns,
            etag,
            checked_ns: now_ns,
            persist: Persist::Synced,
        }
    }

    /// A directory of the UFS not listed yet.
    pub fn unlisted(mount: u32) -> UfsState {
        UfsState {
            mount,
            len: 0,
            mtime_ns: 0,
            etag: String::new(),
            checked_ns: 0,
            persist: Persist::Synced,
        }
    }

    /// A file written here, waiting to be persisted since `now_ns`.
    pub fn pending(mount: u32, now_ns: i64) -> UfsState {
        UfsState {
            persist: Persist::Pending { since_ns: now_ns },
            ..UfsState::unlisted(mount)
        }
    }

    /// Whether the UFS object `(len, mtime_ns, etag)` is the one cached.
    pub fn matches(&self, len: u64, mtime_ns: i64, etag: &str) -> bool {
        self.len == len && self.mtime_ns == mtime_ns && self.etag == etag
    }

    /// Words for `stat`: persisted, pending or failed.
    pub fn describe(&self) -> String {
        match &self.persist {
            Persist::Synced => "persisted".into(),
            Persist::Pending { .. } => "pending".into(),
            Persist::Failed {
                attempts, error, ..
            } => format!("failed ({attempts} attempts, retrying): {error}"),
        }
    }
}

/// A UFS object as the namespace records it: name, length, mtime, etag.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct UfsFile {
    pub name: String,
    pub len: u64,
    pub mtime_ns: i64,
    pub etag: String,
}

/// Where a load job is.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub enum JobState {
    /// Listing the UFS tree and recording its files.
    Listing,
    /// Caching the files.
    Running,
    /// Every file was tried (some may have failed: see `files_failed`).
    Done,
    /// The job could not go on (its listing failed, its mount is gone).
    Failed,
    Cancelled,
}

impl JobState {
    pub fn finished(self) -> bool {
        matches!(
            self,
            JobState::Done | JobState::Failed | JobState::Cancelled
        )
    }
}

impl fmt::Display for JobState {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            JobState::Listing => "listing",
            JobState::Running => "running",
            JobState::Done => "done",
            JobState::Failed => "failed",
            JobState::Cancelled => "cancelled",
        })
    }
}

/// Failures a job keeps by name (the count goes on).
pub const MAX_JOB_FAILURES: usize = 100;

/// A load job: cache everything under a path of a mount. Kept in shard 0,
/// so a restarted node resumes it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadJob {
    pub id: String,
    /// The namespace path loaded.
    pub path: String,
    pub mount: u32,
    pub state: JobState,
    /// Skip files already cached whole and unchanged.
    pub no_overwrite: bool,
    pub created_ns: i64,
    pub updated_ns: i64,
    pub finished_ns: i64,
    /// Where the listing goes on (a UFS key), while listing.
    pub cursor: Option<String>,
    /// Task records written so far.
    pub tasks: u64,
    pub files_total: u64,
    pub files_done: u64,
    pub files_skipped: u64,
    pub files_failed: u64,
    pub bytes_total: u64,
    pub bytes_done: u64,
    /// The first failures: path and error.
    pub failures: Vec<(String, String)>,
    /// Why the job failed as a whole.
    pub error: String,
    /// The trace of the request that created the job, when it was traced:
    /// the job's work (listing, each file, each node's part) joins it.
    pub trace: Option<TraceCtx>,
}

/// [`LoadJob`] as version 1 stored it (no trace).
#[derive(Deserialize)]
#[cfg_attr(test, derive(Serialize))]
struct LoadJobV1 {
    id: String,
    path: String,
    mount: u32,
    state: JobState,
    no_overwrite: bool,
    created_ns: i64,
    updated_ns: i64,
    finished_ns: i64,
    cursor: Option<String>,
    tasks: u64,
    files_total: u64,
    files_done: u64,
    files_skipped: u64,
    files_failed: u64,
    bytes_total: u64,
    bytes_done: u64,
    failures: Vec<(String, String)>,
    error: String,
}

impl Versioned for LoadJob {
    const VERSION: u8 = 2;
    const WHAT: &'static str = "load job";
    fn migrate(version: u8, payload: &[u8]) -> Result<Self, CodecError> {
        match version {
            1 => from_bytes::<LoadJobV1>(Self::WHAT, payload).map(|v| LoadJob {
                id: v.id,
                path: v.path,
                mount: v.mount,
                state: v.state,
                no_overwrite: v.no_overwrite,
                created_ns: v.created_ns,
                updated_ns: v.updated_ns,
                finished_ns: v.finished_ns,
                cursor: v.cursor,
                tasks: v.tasks,
                files_total: v.files_total,
                files_done: v.files_done,
                files_skipped: v.files_skipped,
                files_failed: v.files_failed,
                bytes_total: v.bytes_total,
                bytes_done: v.bytes_done,
                failures: v.failures,
                error: v.error,
                trace: None,
            }),
            found => Err(CodecError::UnknownVersion {
                what: Self::WHAT,
                found,
            }),
        }
    }
}

/// One file of a load job.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LoadTask {
    pub n: u64,
    pub path: String,
    pub ino: u64,
    pub size: u64,
    pub done: bool,
    pub attempts: u32,
    pub error: Option<String>,
}

impl Versioned for LoadTask {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "load task";
}

/// Every mount, with a version that grows with each change.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct MountTable {
    pub version: u64,
    /// The id the next mount gets.
    pub next_id: u32,
    pub mounts: Vec<MountInfo>,
}

impl Versioned for MountTable {
    const VERSION: u8 = 1;
    const WHAT: &'static str = "mount table";
}

impl MountTable {
    /// The mount `path` is under (the deepest one), with the path below it.
    pub fn find<'a>(&self, path: &'a str) -> Option<(&MountInfo, &'a str)> {
        self.mounts
            .iter()
            .filter_map(|m| m.relative(path).map(|rel| (m, rel)))
            .max_by_key(|(m, _)| m.path.len())
    }

    pub fn by_id(&self, id: u32) -> Option<&MountInfo> {
        self.mounts.iter().find(|m| m.id == id)
    }

    /// Whether a mount point lies strictly below `path` (such a path cannot
    /// be renamed or removed while mounted).
    pub fn has_mount_below(&self, path: &str) -> Option<&MountInfo> {
        let prefix = if path == "/" {
            "/".to_string()
        } else {
            format!("{path}/")
        };
        self.mounts
            .iter()
            .find(|m| m.path != path && m.path.starts_with(&prefix))
    }

    pub fn redacted(&self) -> MountTable {
        MountTable {
            version: self.version,
            next_id: self.next_id,
            mounts: self.mounts.iter().map(MountInfo::redacted).collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::codec::{decode_versioned, encode_versioned};

    /// A value as version `version` stored it.
    fn stored<T: Serialize>(version: u8, v: &T) -> Vec<u8> {
        let mut out = vec![version];
        out.extend(postcard::to_allocvec(v).unwrap());
        out
    }

    #[test]
    fn version_1_journal_entries_and_load_jobs_still_read() {
        let v1 = JournalEntryV1 {
            seq: 7,
            mount: 2,
            op: UfsOp::Rename {
                from: "/a".into(),
                to: "/b".into(),
                dir: false,
            },
            at_ns: 99,
        };
        let e: JournalEntry = decode_versioned(&stored(1, &v1)).unwrap();
        assert_eq!((e.seq, e.mount, e.at_ns, e.trace), (7, 2, 99, None));
        assert_eq!(e.op, v1.op);
        let e2 = JournalEntry {
            trace: Some(TraceCtx { trace: 5, span: 6 }),
            ..e
        };
        assert_eq!(
            decode_versioned::<JournalEntry>(&encode_versioned(&e2)).unwrap(),
            e2
        );

        let v1 = LoadJobV1 {
            id: "ab12".into(),
            path: "/m/d".into(),
            mount: 3,
            state: JobState::Running,
            no_overwrite: true,
            created_ns: 1,
            updated_ns: 2,
            finished_ns: 0,
            cursor: Some("k".into()),
            tasks: 10,
            files_total: 10,
            files_done: 4,
            files_skipped: 1,
            files_failed: 1,
            bytes_total: 1000,
            bytes_done: 400,
            failures: vec![("/m/d/x".into(), "gone".into())],
            error: String::new(),
        };
        let job: LoadJob = decode_versioned(&stored(1, &v1)).unwrap();
        assert_eq!(job.id, "ab12");
        assert_eq!(job.state, JobState::Running);
        assert_eq!((job.files_done, job.bytes_done, job.trace), (4, 400, None));
        assert_eq!(job.failures, v1.failures);
        assert_eq!(
            decode_versioned::<LoadJob>(&encode_versioned(&job)).unwrap(),
            job
        );
        // A version this release does not know is refused, not guessed.
        assert!(decode_versioned::<LoadJob>(&stored(9, &v1)).is_err());
    }

    fn mount(id: u32, path: &str) -> MountInfo {
        MountInfo {
            id,
            path: path.into(),
            ufs: "s3://b/p".into(),
            write_type: WriteType::CacheMode,
            props: [
                ("s3.credentials.access".to_string(), "AKID".to_string()),
                (
                    "s3.credentials.secret".to_string(),
                    "SUPERSECRET".to_string(),
                ),
            ]
            .into_iter()
            .collect(),
            ttl_ms: 0,
            check_interval_ms: None,
            read_verify_ufs: false,
            auto_cache: true,
            replicas: None,
            block_size: None,
            storage: None,
            created_ns: 0,
        }
    }

    #[test]
    fn paths_resolve_to_the_deepest_mount() {
        let t = MountTable {
            version: 1,
            next_id: 3,
            mounts: vec![mount(1, "/data"), mount(2, "/data/deep")],
        };
        assert_eq!(
            t.find("/data/x/y").map(|(m, r)| (m.id, r)),
            Some((1, "x/y"))
        );
        assert_eq!(t.find("/data").map(|(m, r)| (m.id, r)), Some((1, "")));
        assert_eq!(
            t.find("/data/deep/z").map(|(m, r)| (m.id, r)),
            Some((2, "z"))
        );
        assert_eq!(t.find("/database").map(|(m, _)| m.id), None);
        assert_eq!(t.find("/").map(|(m, _)| m.id), None);
        assert_eq!(t.has_mount_below("/data").map(|m| m.id), Some(2));
        assert_eq!(t.has_mount_below("/").map(|m| m.id), Some(1));
        assert!(t.has_mount_below("/data/deep").is_none());
    }

    #[test]
    fn secrets_never_print() {
        let m = mount(1, "/m");
        let shown = format!(
            "{m:?} {:?}",
            MountTable {
                version: 1,
                next_id: 2,
                mounts: vec![m.clone()]
            }
        );
        assert!(!shown.contains("SUPERSECRET"), "{shown}");
        assert!(shown.contains("AKID"));
        assert_eq!(m.redacted().props["s3.credentials.secret"], "<redacted>");
        assert!(is_secret("s3.credentials.session_token"));
    }

    #[test]
    fn write_types_parse() {
        assert_eq!(
            WriteType::parse("cache_mode").unwrap(),
            WriteType::CacheMode
        );
        assert_eq!(WriteType::parse("fs_mode").unwrap(), WriteType::FsMode);
        assert!(WriteType::parse("through")
            .unwrap_err()
            .to_string()
            .contains("through"));
    }
}

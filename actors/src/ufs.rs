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

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use bytes::Bytes;
use futures::{Stream, StreamExt, TryStreamExt};
use opendal::layers::{RetryLayer, TimeoutLayer};
use opendal::options::{DeleteOptions, ListOptions, ReaderOptions, WriteOptions};
use opendal::{ErrorKind, Operator};

use curvine_conf::UfsConf;
use curvine_messages::trace::Outcome;
use curvine_messages::{FsError, FsResult};

use crate::trace::{Span, Tracer};

/// Mount properties an `s3://` mount accepts (`-c key=value`), with what they mean.
pub const S3_KEYS: &[(&str, &str)] = &[
    (
        "s3.endpoint_url",
        "endpoint of an S3-compatible store, e.g. http://host:9000 (default: AWS)",
    ),
    ("s3.region_name", "region of the bucket (default us-east-1)"),
    ("s3.credentials.access", "access key id"),
    ("s3.credentials.secret", "secret access key"),
    (
        "s3.credentials.session_token",
        "session token of temporary credentials",
    ),
    (
        "s3.force.path.style",
        "true: http://endpoint/bucket/key (default); false: http://bucket.endpoint/key",
    ),
];

pub use curvine_messages::mount::is_secret;

/// The properties with secret values replaced, for display.
pub fn redacted(props: &BTreeMap<String, String>) -> BTreeMap<String, String> {
    props
        .iter()
        .map(|(k, v)| {
            let v = if is_secret(k) {
                "<redacted>".to_string()
            } else {
                v.clone()
            };
            (k.clone(), v)
        })
        .collect()
}

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

/// Request limits of a UFS client, from the node's `ufs.*` config.
#[derive(Debug, Clone)]
pub struct UfsOptions {
    pub timeout: Duration,
    pub io_timeout: Duration,
    pub retries: usize,
    pub retry_min_delay: Duration,
    pub retry_max_delay: Duration,
    pub part_size: usize,
    pub upload_concurrency: usize,
    pub list_page: usize,
}

impl From<&UfsConf> for UfsOptions {
    fn from(c: &UfsConf) -> UfsOptions {
        UfsOptions {
            timeout: c.timeout.0,
            io_timeout: c.io_timeout.0,
            retries: c.retries as usize,
            retry_min_delay: c.retry_min_delay.0,
            retry_max_delay: c.retry_max_delay.0,
            part_size: c.part_size.0 as usize,
            upload_concurrency: c.upload_concurrency as usize,
            list_page: c.list_page as usize,
        }
    }
}

impl Default for UfsOptions {
    fn default() -> UfsOptions {
        UfsOptions::from(&UfsConf::default())
    }
}

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

/// Checks mount properties against what the scheme accepts.
pub fn check_props(uri: &UfsUri, props: &BTreeMap<String, String>) -> FsResult<()> {
    let allowed: &[(&str, &str)] = match uri.scheme {
        Scheme::S3 => S3_KEYS,
        Scheme::File => &[],
    };
    for (key, value) in props {
        if !allowed.iter().any(|(k, _)| k == key) {
            let names: Vec<&str> = allowed.iter().map(|(k, _)| *k).collect();
            return Err(FsError::InvalidArgument(format!(
                "unknown mount property {key:?} for {uri}; allowed: {}",
                if names.is_empty() {
                    "none".to_string()
                } else {
                    names.join(", ")
                }
            )));
        }
        if key == "s3.force.path.style" && !matches!(value.as_str(), "true" | "false") {
            return Err(FsError::InvalidArgument(format!(
                "mount property s3.force.path.style={value:?}: expected true or false"
            )));
        }
        if key == "s3.endpoint_url"
            && !(value.starts_with("http://") || value.starts_with("https://"))
        {
            return Err(FsError::InvalidArgument(format!(
                "mount property s3.endpoint_url={value:?}: expected http://host:port or https://host"
            )));
        }
    }
    let has = |k: &str| props.contains_key(k);
    if has("s3.credentials.access") != has("s3.credentials.secret") {
        return Err(FsError::InvalidArgument(
            "give both s3.credentials.access and s3.credentials.secret, or neither".into(),
        ));
    }
    Ok(())
}

impl Ufs {
    /// A client for `uri` with mount properties `props` (checked here; no
    /// request is sent: [`Ufs::check`] does that).
    pub fn new(uri: &UfsUri, props: &BTreeMap<String, String>, opts: &UfsOptions) -> FsResult<Ufs> {
        check_props(uri, props)?;
        opendal::install_default();
        let config_error =
            |e: opendal::Error| FsError::InvalidArgument(format!("UFS {uri}: {}", e.message()));
        let op = match uri.scheme {
            Scheme::S3 => {
                let get = |k: &str| props.get(k).map(String::as_str);
                let mut b = opendal::services::S3::default()
                    .bucket(&uri.bucket)
                    .root(&format!("/{}", uri.root))
                    .region(get("s3.region_name").unwrap_or("us-east-1"))
                    .disable_ec2_metadata();
                if let Some(endpoint) = get("s3.endpoint_url") {
                    b = b.endpoint(endpoint);
                }
                if let (Some(access), Some(secret)) =
                    (get("s3.credentials.access"), get("s3.credentials.secret"))
                {
                    // Given credentials are the only ones used: nothing
                    // from the environment or ~/.aws may override them.
                    b = b
                        .access_key_id(access)
                        .secret_access_key(secret)
                        .disable_config_load();
                    if let Some(token) = get("s3.credentials.session_token") {
                        b = b.session_token(token);
                    }
                }
                if get("s3.force.path.style") == Some("false") {
                    b = b.enable_virtual_host_style();
                }
                Operator::new(b).map_err(config_error)?
            }
            Scheme::File => {
                // The store would create a missing root: a mount of a
                // directory that is not there is a mistake to report.
                match std::fs::metadata(&uri.root) {
                    Ok(m) if m.is_dir() => {}
                    Ok(_) => return Err(FsError::NotADirectory(uri.to_string())),
                    Err(e) => return Err(FsError::NotFound(format!("{uri}: {e}"))),
                }
                // Uploads are written beside the tree and renamed into
                // place on close, so a reader never sees half an object.
                let b = opendal::services::Fs::default()
                    .root(&uri.root)
                    .atomic_write_dir(&format!("{}/{UPLOAD_DIR}", uri.root.trim_end_matches('/')));
                Operator::new(b).map_err(config_error)?
            }
        };
        let op = op
            .layer(
                TimeoutLayer::new()
                    .with_timeout(opts.timeout)
                    .with_io_timeout(opts.io_timeout),
            )
            .layer(
                RetryLayer::new()
                    .with_jitter()
                    .with_max_times(opts.retries)
                    .with_min_delay(opts.retry_min_delay)
                    .with_max_delay(opts.retry_max_delay),
            );
        let cap = op.info().capability();
        Ok(Ufs {
            uri: uri.clone(),
            sorted_listing: cap.list_with_start_after,
            read_if_match: cap.read_with_if_match,
            op,
            opts: opts.clone(),
            tracer: None,
        })
    }

    /// This client with its calls for traced requests recorded in `tracer`.
    pub fn with_tracer(mut self, tracer: Option<Tracer>) -> Ufs {
        self.tracer = tracer;
        self
    }

    /// The span of a call `op` when the running task works for a traced
    /// request.
    fn span(&self, op: &'static str) -> Option<Span> {
        self.tracer
            .as_ref()?
            .start(crate::trace::current(), 0, "ufs", &self.uri, op)
    }

    /// Runs `call`, the call `op`, as a span of a traced request.
    async fn traced<T>(
        &self,
        op: &'static str,
        call: impl std::future::Future<Output = FsResult<T>>,
    ) -> FsResult<T> {
        let span = self.span(op);
        let result = call.await;
        if let Some(span) = span {
            span.end(crate::trace::outcome_of(&result));
        }
        result
    }

    pub fn uri(&self) -> &UfsUri {
        &self.uri
    }

    /// Counts a call of operation `op` (metrics).
    fn called(&self, op: &'static str) {
        crate::stats::process().add(
            "curvine_ufs_requests_total",
            "Under-file-system operations started, per scheme and operation.",
            &[("scheme", self.uri.scheme.name()), ("op", op)],
            1,
        );
    }

    /// An error of `what` on `rel`, with the store's answer.
    fn error(&self, what: &str, rel: &str, e: opendal::Error) -> FsError {
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

    /// Checks that the location can be reached with the credentials: a
    /// listing of its root (missing bucket, wrong keys, an endpoint that
    /// does not answer are errors naming the cause).
    pub async fn check(&self) -> FsResult<()> {
        self.called("check");
        self.traced("check", async {
            if self.uri.scheme == Scheme::File {
                let meta = tokio::fs::metadata(&self.uri.root)
                    .await
                    .map_err(|e| FsError::Ufs(format!("{}: {e}", self.uri)))?;
                if !meta.is_dir() {
                    return Err(FsError::NotADirectory(self.uri.to_string()));
                }
                return Ok(());
            }
            let mut lister = self
                .op
                .lister_options(
                    "/",
                    ListOptions {
                        limit: Some(1),
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| self.error("list", "", e))?;
            if let Some(entry) = lister.next().await {
                entry.map_err(|e| self.error("list", "", e))?;
            }
            Ok(())
        })
        .await
    }

    /// The object or directory at `rel`, or `None`. A name is a directory
    /// when objects exist below it (S3 has no directories of its own).
    pub async fn stat(&self, rel: &str) -> FsResult<Option<UfsObject>> {
        self.called("stat");
        self.traced("stat", async {
            let name = rel.rsplit('/').next().unwrap_or("").to_string();
            if rel.is_empty() {
                return Ok(Some(UfsObject {
                    name,
                    is_dir: true,
                    len: 0,
                    mtime_ns: 0,
                    etag: String::new(),
                }));
            }
            match self.op.stat(rel).await {
                Ok(meta) if meta.is_file() => return Ok(Some(object(name, &meta))),
                Ok(meta) if meta.is_dir() => return Ok(Some(object(name, &meta))),
                Ok(_) => {}
                Err(e)
                    if e.kind() == ErrorKind::NotFound
                        && !describe(&e).contains("NoSuchBucket") => {}
                Err(e) if not_a_directory(&e) => return Ok(None),
                Err(e) => return Err(self.error("stat", rel, e)),
            }
            // A prefix with objects below it.
            let mut lister = match self
                .op
                .lister_options(
                    &dir_key(rel),
                    ListOptions {
                        limit: Some(2),
                        ..Default::default()
                    },
                )
                .await
            {
                Ok(l) => l,
                Err(e) if e.kind() == ErrorKind::NotFound => return Ok(None),
                Err(e) if not_a_directory(&e) => return Ok(None),
                Err(e) => return Err(self.error("list", rel, e)),
            };
            let dir = dir_key(rel);
            while let Some(entry) = lister.next().await {
                match entry {
                    Ok(entry) if entry.path() == dir => continue,
                    Ok(_) => {
                        return Ok(Some(UfsObject {
                            name,
                            is_dir: true,
                            len: 0,
                            mtime_ns: 0,
                            etag: String::new(),
                        }))
                    }
                    Err(e) if e.kind() == ErrorKind::NotFound || not_a_directory(&e) => {
                        return Ok(None)
                    }
                    Err(e) => return Err(self.error("list", rel, e)),
                }
            }
            // An empty directory marker (`rel/`) counts as a directory.
            match self.op.stat(&dir).await {
                Ok(meta) if meta.is_dir() => Ok(Some(UfsObject {
                    name,
                    is_dir: true,
                    len: 0,
                    mtime_ns: 0,
                    etag: String::new(),
                })),
                Ok(_) => Ok(None),
                Err(e) if e.kind() == ErrorKind::NotFound || not_a_directory(&e) => Ok(None),
                Err(e) => Err(self.error("stat", &dir, e)),
            }
        })
        .await
    }

    /// The key a store that lists in key order starts after, for `cursor`
    /// in directory `rel`.
    fn start_after(&self, rel: &str, cursor: Option<&str>) -> Option<String> {
        match (cursor, self.sorted_listing) {
            (Some(c), true) if rel.is_empty() => Some(c.to_string()),
            (Some(c), true) => Some(format!("{}/{c}", rel.trim_end_matches('/'))),
            _ => None,
        }
    }

    /// Whether a store read whole (not in key order) already returned `key`
    /// on an earlier page.
    fn seen_before(&self, key: &str, cursor: Option<&str>) -> bool {
        !self.sorted_listing && cursor.is_some_and(|c| key <= c)
    }

    /// Up to `limit` entries of directory `rel`, continuing after `cursor`
    /// (the previous page's [`UfsPage::next`]). Stores that list in key
    /// order (S3) are asked one page at a time and their order is kept;
    /// local directories are read and sorted by name. Callers that need
    /// name order sort what they gather.
    pub async fn list_page(
        &self,
        rel: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> FsResult<UfsPage> {
        self.called("list");
        self.traced("list", async {
            let dir = dir_key(rel);
            let limit = limit.max(1);
            let start_after = self.start_after(rel, cursor);
            let mut lister = match self
                .op
                .lister_options(
                    &dir,
                    ListOptions {
                        limit: Some(self.opts.list_page.min(limit)),
                        start_after,
                        ..Default::default()
                    },
                )
                .await
            {
                Ok(l) => l,
                Err(e) if e.kind() == ErrorKind::NotFound && self.uri.scheme == Scheme::File => {
                    return Err(FsError::NotFound(self.uri.join(rel)))
                }
                Err(e) => return Err(self.error("list", rel, e)),
            };
            let mut entries = Vec::new();
            let mut more = false;
            while let Some(entry) = lister.next().await {
                let entry = entry.map_err(|e| self.error("list", rel, e))?;
                if entry.path() == dir || entry.path() == "/" {
                    continue;
                }
                let name = entry.name().trim_end_matches('/').to_string();
                if name.is_empty()
                    || name == "."
                    || name == ".."
                    || name.contains('/')
                    || (rel.is_empty() && name == UPLOAD_DIR)
                {
                    continue;
                }
                if self.seen_before(&name, cursor) {
                    continue;
                }
                if self.sorted_listing && entries.len() == limit {
                    more = true;
                    break;
                }
                entries.push(object(name, entry.metadata()));
            }
            if !self.sorted_listing {
                entries.sort_by(|a, b| a.name.cmp(&b.name));
                more = entries.len() > limit;
                entries.truncate(limit);
            }
            let next = match entries.last() {
                Some(last) if more => Some(if self.sorted_listing && last.is_dir {
                    // Keys below a prefix sort after it: continue past all of them.
                    format!("{}/\u{10FFFF}", last.name)
                } else {
                    last.name.clone()
                }),
                _ => None,
            };
            Ok(UfsPage { entries, next })
        })
        .await
    }

    /// Up to `limit` objects anywhere below directory `rel` (files only,
    /// with their paths relative to `rel`), continuing after `cursor`.
    /// Stores that list in key order page; local directories are read
    /// whole and sorted.
    pub async fn list_tree_page(
        &self,
        rel: &str,
        cursor: Option<&str>,
        limit: usize,
    ) -> FsResult<(Vec<(String, UfsObject)>, Option<String>)> {
        self.called("list");
        self.traced("list", async {
            let dir = dir_key(rel);
            let limit = limit.max(1);
            let start_after = self.start_after(rel, cursor);
            let mut lister = self
                .op
                .lister_options(
                    &dir,
                    ListOptions {
                        limit: Some(self.opts.list_page.min(limit)),
                        start_after,
                        recursive: true,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| self.error("list", rel, e))?;
            let mut out = Vec::new();
            let mut more = false;
            while let Some(entry) = lister.next().await {
                let entry = entry.map_err(|e| self.error("list", rel, e))?;
                if entry.metadata().is_dir() {
                    continue;
                }
                let Some(tail) = entry.path().strip_prefix(dir.trim_start_matches('/')) else {
                    continue;
                };
                let tail = tail.trim_start_matches('/').to_string();
                if tail.is_empty()
                    || tail
                        .split('/')
                        .any(|c| c.is_empty() || c == "." || c == "..")
                    || (rel.is_empty() && tail.starts_with(UPLOAD_DIR))
                {
                    continue;
                }
                if self.seen_before(&tail, cursor) {
                    continue;
                }
                if self.sorted_listing && out.len() == limit {
                    more = true;
                    break;
                }
                let name = tail.rsplit('/').next().unwrap_or("").to_string();
                out.push((tail, object(name, entry.metadata())));
            }
            if !self.sorted_listing {
                out.sort_by(|a, b| a.0.cmp(&b.0));
                more = out.len() > limit;
                out.truncate(limit);
            }
            let next = if more {
                out.last().map(|(p, _)| p.clone())
            } else {
                None
            };
            Ok((out, next))
        })
        .await
    }

    /// The bytes `[offset, offset + len)` of the object at `rel`, as they
    /// arrive. With `etag`, a store that supports it refuses the read once
    /// the object changed (`Stale`).
    pub async fn read(
        &self,
        rel: &str,
        offset: u64,
        len: u64,
        etag: Option<&str>,
    ) -> FsResult<impl Stream<Item = FsResult<Bytes>> + Send + 'static> {
        self.called("read");
        // The span lasts until the stream ends or its reader drops it.
        let mut span = StreamSpan {
            span: self.span("read"),
            error: None,
        };
        let if_match = etag
            .filter(|e| !e.is_empty() && self.read_if_match)
            .map(String::from);
        let opened = async {
            let reader = self
                .op
                .reader_options(
                    rel,
                    ReaderOptions {
                        if_match,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| self.error("read", rel, e))?;
            reader
                .into_stream(offset..offset + len)
                .await
                .map_err(|e| self.error("read", rel, e))
        }
        .await;
        let stream = opened.inspect_err(|e| span.fail(e))?;
        let this = self.clone();
        let rel = rel.to_string();
        Ok(stream.map_ok(|buf| buf.to_bytes()).map_err(move |e| {
            let e = this.error("read", &rel, e);
            span.fail(&e);
            e
        }))
    }

    /// The whole object at `rel` (for tests and small objects).
    pub async fn read_all(&self, rel: &str) -> FsResult<Vec<u8>> {
        self.called("read");
        self.traced("read", async {
            let buf = self
                .op
                .read(rel)
                .await
                .map_err(|e| self.error("read", rel, e))?;
            Ok(buf.to_vec())
        })
        .await
    }

    /// A writer of the object at `rel`: parts of `ufs.part_size` uploaded
    /// `ufs.upload_concurrency` at a time (a multipart upload once the
    /// object is larger than one part). Nothing is visible until `close`.
    pub async fn writer(&self, rel: &str) -> FsResult<UfsWriter> {
        self.called("write");
        let writer = self
            .op
            .writer_options(
                rel,
                WriteOptions {
                    chunk: Some(self.opts.part_size),
                    concurrent: self.opts.upload_concurrency,
                    ..Default::default()
                },
            )
            .await
            .map_err(|e| self.error("write", rel, e))?;
        Ok(UfsWriter {
            ufs: self.clone(),
            rel: rel.to_string(),
            writer,
            written: 0,
            span: self.span("write"),
        })
    }

    /// Writes a whole object (small objects and tests).
    pub async fn write_all(&self, rel: &str, data: Vec<u8>) -> FsResult<UfsObject> {
        let mut w = self.writer(rel).await?;
        w.write(Bytes::from(data)).await?;
        w.close().await
    }

    /// Creates directory `rel` (a `rel/` marker object on S3).
    pub async fn mkdir(&self, rel: &str) -> FsResult<()> {
        self.called("mkdir");
        self.traced("mkdir", async {
            if rel.is_empty() {
                return Ok(());
            }
            self.op
                .create_dir(&dir_key(rel))
                .await
                .map_err(|e| self.error("mkdir", rel, e))
        })
        .await
    }

    /// Deletes the object at `rel` (a missing object is not an error).
    pub async fn delete(&self, rel: &str) -> FsResult<()> {
        self.called("delete");
        self.traced("delete", async {
            match self.op.delete(rel).await {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
                Err(e) => Err(self.error("delete", rel, e)),
            }
        })
        .await
    }

    /// Deletes directory `rel` and everything below it.
    pub async fn delete_dir(&self, rel: &str) -> FsResult<()> {
        self.called("delete");
        self.traced("delete", async {
            if rel.is_empty() {
                return Err(FsError::InvalidArgument(format!(
                    "refusing to delete the whole of {}",
                    self.uri
                )));
            }
            match self
                .op
                .delete_options(
                    &dir_key(rel),
                    DeleteOptions {
                        recursive: true,
                        ..Default::default()
                    },
                )
                .await
            {
                Ok(()) => Ok(()),
                Err(e) if e.kind() == ErrorKind::NotFound => Ok(()),
                Err(e) => Err(self.error("delete", rel, e)),
            }
        })
        .await
    }

    /// Moves the object or directory `from` to `to`. Local directories
    /// rename; S3 copies each object, then deletes the sources (not atomic:
    /// a failure part way leaves both names, never neither).
    pub async fn rename(&self, from: &str, to: &str, is_dir: bool) -> FsResult<()> {
        self.called("rename");
        self.traced("rename", async {
            if self.uri.scheme == Scheme::File {
                let src = format!("{}/{from}", self.uri.root.trim_end_matches('/'));
                let dst = format!("{}/{to}", self.uri.root.trim_end_matches('/'));
                if let Some(parent) = std::path::Path::new(&dst).parent() {
                    tokio::fs::create_dir_all(parent)
                        .await
                        .map_err(|e| FsError::Ufs(format!("rename {}: {e}", self.uri.join(to))))?;
                }
                return tokio::fs::rename(&src, &dst).await.map_err(|e| {
                    if e.kind() == std::io::ErrorKind::NotFound {
                        FsError::NotFound(self.uri.join(from))
                    } else {
                        FsError::Ufs(format!(
                            "rename {} to {}: {e}",
                            self.uri.join(from),
                            self.uri.join(to)
                        ))
                    }
                });
            }
            if !is_dir {
                self.op
                    .copy(from, to)
                    .await
                    .map_err(|e| self.error("copy", from, e))?;
                return self.delete(from).await;
            }
            let src_dir = dir_key(from);
            let mut lister = self
                .op
                .lister_options(
                    &src_dir,
                    ListOptions {
                        recursive: true,
                        ..Default::default()
                    },
                )
                .await
                .map_err(|e| self.error("list", from, e))?;
            let mut moved = Vec::new();
            while let Some(entry) = lister.next().await {
                let entry = entry.map_err(|e| self.error("list", from, e))?;
                let Some(tail) = entry.path().strip_prefix(&src_dir) else {
                    continue;
                };
                let target = format!("{}/{tail}", to.trim_end_matches('/'));
                if entry.metadata().is_dir() {
                    self.op
                        .create_dir(&target)
                        .await
                        .map_err(|e| self.error("mkdir", &target, e))?;
                } else {
                    self.op
                        .copy(entry.path(), &target)
                        .await
                        .map_err(|e| self.error("copy", entry.path(), e))?;
                }
                moved.push(entry.path().to_string());
            }
            self.mkdir(to).await?;
            for path in moved {
                self.delete(&path).await?;
            }
            self.delete(&src_dir).await
        })
        .await
    }
}

/// Writes one UFS object; see [`Ufs::writer`].
pub struct UfsWriter {
    ufs: Ufs,
    rel: String,
    writer: opendal::Writer,
    written: u64,
    /// From the writer's creation to its close (a traced request's).
    span: Option<Span>,
}

impl UfsWriter {
    pub async fn write(&mut self, data: Bytes) -> FsResult<()> {
        self.written += data.len() as u64;
        self.writer
            .write(data)
            .await
            .map_err(|e| self.ufs.error("write", &self.rel, e))
    }

    pub fn written(&self) -> u64 {
        self.written
    }

    /// Completes the upload and returns what the store now holds.
    pub async fn close(mut self) -> FsResult<UfsObject> {
        let span = self.span.take();
        let result = async {
            self.writer
                .close()
                .await
                .map_err(|e| self.ufs.error("write", &self.rel, e))?;
            match self.ufs.stat(&self.rel).await? {
                Some(obj) if !obj.is_dir => Ok(obj),
                _ => Err(FsError::Ufs(format!(
                    "write {}: the object is missing after its upload completed",
                    self.ufs.uri.join(&self.rel)
                ))),
            }
        }
        .await;
        if let Some(span) = span {
            span.end(crate::trace::outcome_of(&result));
        }
        result
    }

    /// Abandons the upload (its parts are deleted; nothing becomes visible).
    pub async fn abort(mut self) {
        if let Some(span) = self.span.take() {
            span.end(Outcome::Error("aborted".into()));
        }
        if let Err(e) = self.writer.abort().await {
            tracing::warn!(object = %self.ufs.uri.join(&self.rel), "aborting an upload: {}", describe(&e));
        }
    }
}

/// The span of a read stream: recorded when the stream is dropped, with the
/// first error it gave, if any.
struct StreamSpan {
    span: Option<Span>,
    error: Option<String>,
}

impl StreamSpan {
    fn fail(&mut self, e: &FsError) {
        self.error
            .get_or_insert_with(|| crate::trace::error_kind(e));
    }
}

impl Drop for StreamSpan {
    fn drop(&mut self) {
        if let Some(span) = self.span.take() {
            span.end(match self.error.take() {
                None => Outcome::Ok,
                Some(kind) => Outcome::Error(kind),
            });
        }
    }
}

/// Where a local-directory UFS keeps uploads until they complete; never listed.
pub const UPLOAD_DIR: &str = ".curvine-uploads";

/// Whether an error is the OS saying a path component is not a directory.
fn not_a_directory(e: &opendal::Error) -> bool {
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

fn dir_key(rel: &str) -> String {
    if rel.is_empty() {
        "/".into()
    } else {
        format!("{}/", rel.trim_end_matches('/'))
    }
}

fn object(name: String, meta: &opendal::Metadata) -> UfsObject {
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

    #[test]
    fn props_are_checked_and_secrets_redacted() {
        let u = UfsUri::parse("s3://bucket/x").unwrap();
        let mut p = BTreeMap::new();
        p.insert("s3.credentials.access".to_string(), "AK".to_string());
        p.insert("s3.credentials.secret".to_string(), "SECRET".to_string());
        check_props(&u, &p).unwrap();
        let shown = format!("{:?}", redacted(&p));
        assert!(!shown.contains("SECRET") && shown.contains("AK"), "{shown}");
        p.insert("s3.bogus".to_string(), "1".to_string());
        let e = check_props(&u, &p).unwrap_err().to_string();
        assert!(
            e.contains("s3.bogus") && e.contains("s3.endpoint_url"),
            "{e}"
        );
        p.remove("s3.bogus");
        p.remove("s3.credentials.access");
        assert!(check_props(&u, &p).is_err());
    }

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

//! The client of one mounted location: its OpenDAL operator (with timeouts
//! and retries), the traces and metrics of its calls, and the calls that
//! look at the location (`check`, `stat`).

use std::collections::BTreeMap;

use futures::StreamExt;
use opendal::layers::{RetryLayer, TimeoutLayer};
use opendal::options::ListOptions;
use opendal::{ErrorKind, Operator};

use curvine_messages::{FsError, FsResult};

use super::errors::{describe, not_a_directory};
use super::{check_props, dir_key, object, Scheme, Ufs, UfsObject, UfsOptions, UfsUri, UPLOAD_DIR};
use crate::trace::{Span, Tracer};

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
    pub(super) fn span(&self, op: &'static str) -> Option<Span> {
        self.tracer
            .as_ref()?
            .start(crate::trace::current(), 0, "ufs", &self.uri, op)
    }

    /// Runs `call`, the call `op`, as a span of a traced request.
    pub(super) async fn traced<T>(
        &self,
        op: &'static str,
        call: impl std::future::Future<Output = FsResult<T>>,
    ) -> FsResult<T> {
        let span = self.span(op);
        let started = std::time::Instant::now();
        let result = call.await;
        crate::stats::process()
            .histogram(
                "curvine_ufs_request_duration_seconds",
                "Time an under-file-system request took (stat, list, ranged read, write, delete), per scheme and operation.",
                &[("scheme", self.uri.scheme.name()), ("op", op)],
            )
            .observe(started.elapsed());
        if let Some(span) = span {
            span.end(crate::trace::outcome_of(&result));
        }
        result
    }

    pub fn uri(&self) -> &UfsUri {
        &self.uri
    }

    /// Counts a call of operation `op` (metrics).
    pub(super) fn called(&self, op: &'static str) {
        crate::stats::process().add(
            "curvine_ufs_requests_total",
            "Under-file-system operations started, per scheme and operation.",
            &[("scheme", self.uri.scheme.name()), ("op", op)],
            1,
        );
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
}

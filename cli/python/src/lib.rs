//! `curvinefs._native`: the client library for Python. Every call blocks
//! the calling Python thread (with the GIL released) on one tokio runtime
//! per process, so Python threads run their requests at the same time.
//! Errors are `OSError`s with the errno the mount would give (Python turns
//! ENOENT into `FileNotFoundError` and so on), their text naming the path.
//!
//! Reads go through `FileReader` (short-circuit when the block is on this
//! host, every unit's crc checked), writes through `FileWriter`: a file
//! written here is committed, and visible to every client, when `close`
//! returns.

use std::sync::Arc;

use pyo3::exceptions::{PyOSError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyBytes, PyDict};
use tokio::sync::Mutex;

use curvine_client::io::{FileReader, FileWriter, WriteOptions};
use curvine_messages::{Attr, FileKind, FsError};

/// The process's runtime (two workers: the calls wait in Python threads).
/// A process forked from one that had it (a PyTorch DataLoader worker,
/// say) gets a new one: the parent's worker threads do not exist there.
fn runtime() -> Arc<tokio::runtime::Runtime> {
    static RT: std::sync::Mutex<Option<(u32, Arc<tokio::runtime::Runtime>)>> =
        std::sync::Mutex::new(None);
    let pid = std::process::id();
    let mut held = RT.lock().unwrap_or_else(|e| e.into_inner());
    if let Some((owner, rt)) = held.as_ref() {
        if *owner == pid {
            return rt.clone();
        }
    }
    // The parent's runtime cannot be shut down here (its threads are
    // gone): it is left as it is.
    if let Some(old) = held.take() {
        std::mem::forget(old);
    }
    let rt = Arc::new(
        tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("curvinefs")
            .enable_all()
            .build()
            .expect("a tokio runtime for curvinefs"),
    );
    *held = Some((pid, rt.clone()));
    rt
}

/// Runs `f` on the runtime with the GIL released.
fn block<T: Send, F: std::future::Future<Output = Result<T, FsError>> + Send>(
    py: Python<'_>,
    f: F,
) -> PyResult<T> {
    let rt = runtime();
    py.detach(|| rt.block_on(f)).map_err(|e| os_error(e, None))
}

/// Like [`block`], for a call about `path`: its error names the path.
fn block_at<T: Send, F: std::future::Future<Output = Result<T, FsError>> + Send>(
    py: Python<'_>,
    path: &str,
    f: F,
) -> PyResult<T> {
    let rt = runtime();
    py.detach(|| rt.block_on(f))
        .map_err(|e| os_error(e, Some(path)))
}

/// An `OSError` (Python picks the subclass from the errno:
/// `FileNotFoundError` for ENOENT...), naming `path` as its filename.
fn os_error(e: FsError, path: Option<&str>) -> PyErr {
    match path {
        Some(p) => PyOSError::new_err((e.errno(), e.to_string(), p.to_string())),
        None => PyOSError::new_err((e.errno(), e.to_string())),
    }
}

fn kind_name(kind: &FileKind) -> &'static str {
    match kind {
        FileKind::File => "file",
        FileKind::Dir => "directory",
        FileKind::Symlink => "link",
        _ => "other",
    }
}

/// A file's attributes as fsspec's `info` wants them.
fn info<'py>(py: Python<'py>, path: &str, a: &Attr) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    d.set_item("name", path)?;
    d.set_item("size", if a.kind == FileKind::Dir { 0 } else { a.size })?;
    d.set_item("type", kind_name(&a.kind))?;
    d.set_item("mode", a.mode)?;
    d.set_item("uid", a.uid)?;
    d.set_item("gid", a.gid)?;
    d.set_item("nlink", a.nlink)?;
    d.set_item("ino", a.ino)?;
    d.set_item("mtime", a.mtime_ns as f64 / 1e9)?;
    d.set_item("ctime", a.ctime_ns as f64 / 1e9)?;
    d.set_item("atime", a.atime_ns as f64 / 1e9)?;
    if let Some(target) = &a.symlink {
        d.set_item("destination", target)?;
    }
    Ok(d)
}

/// A connection to a cluster; cheap to share between Python threads.
#[pyclass(frozen)]
struct Client {
    inner: curvine_client::Client,
}

#[pymethods]
impl Client {
    /// Connects to the cluster of `cluster` (a node's client port, or a
    /// comma-separated list), or of the config file / `CURVINE_*`
    /// environment when omitted; `options` are config keys (`client.*`).
    #[new]
    #[pyo3(signature = (cluster=None, conf=None, options=None))]
    fn new(
        py: Python<'_>,
        cluster: Option<String>,
        conf: Option<String>,
        options: Option<Vec<(String, String)>>,
    ) -> PyResult<Client> {
        let overrides: Vec<String> = options
            .unwrap_or_default()
            .into_iter()
            .map(|(k, v)| format!("{k}={v}"))
            .collect();
        let mut loader = curvine_conf::Loader::standard(conf.as_deref(), &overrides)
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        if let Some(c) = cluster.filter(|c| !c.is_empty()) {
            loader
                .flag("client.cluster", &c, "cluster=")
                .map_err(|e| PyValueError::new_err(e.to_string()))?;
        }
        let config = loader
            .build()
            .map_err(|e| PyValueError::new_err(e.to_string()))?;
        let conf = curvine_client::client_conf(&config);
        let inner = block(py, curvine_client::Client::connect(&conf))?;
        Ok(Client { inner })
    }

    /// The attributes of `path` (fsspec's `info` dictionary).
    fn stat<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Bound<'py, PyDict>> {
        let c = self.inner.clone();
        let p = path.to_string();
        let a = block_at(py, path, async move { c.stat(&p).await })?;
        info(py, path, &a)
    }

    /// The entries of the directory `path`, each as `stat` gives it.
    fn ls<'py>(&self, py: Python<'py>, path: &str) -> PyResult<Vec<Bound<'py, PyDict>>> {
        let c = self.inner.clone();
        let p = path.to_string();
        let entries = block_at(py, path, async move { c.list_all(&p).await })?;
        entries
            .iter()
            .map(|e| info(py, &curvine_messages::path::child(path, &e.name), &e.attr))
            .collect()
    }

    #[pyo3(signature = (path, parents=false))]
    fn mkdir(&self, py: Python<'_>, path: &str, parents: bool) -> PyResult<()> {
        let c = self.inner.clone();
        let p = path.to_string();
        block_at(
            py,
            path,
            async move { c.mkdir(&p, parents).await.map(|_| ()) },
        )
    }

    /// Removes a file, or with `recursive` a directory and what it holds.
    #[pyo3(signature = (path, recursive=false))]
    fn rm(&self, py: Python<'_>, path: &str, recursive: bool) -> PyResult<()> {
        let c = self.inner.clone();
        let p = path.to_string();
        block_at(py, path, async move {
            c.remove(&p, recursive).await.map(|_| ())
        })
    }

    fn rmdir(&self, py: Python<'_>, path: &str) -> PyResult<()> {
        let c = self.inner.clone();
        let p = path.to_string();
        block_at(py, path, async move { c.rmdir(&p).await.map(|_| ()) })
    }

    /// Renames `src` to `dst` (replacing a file there, as rename(2) does).
    fn rename(&self, py: Python<'_>, src: &str, dst: &str) -> PyResult<()> {
        let c = self.inner.clone();
        let (s, d) = (src.to_string(), dst.to_string());
        block_at(py, src, async move { c.rename(&s, &d).await })
    }

    /// The whole content of `path`, or `[start, end)` of it.
    #[pyo3(signature = (path, start=None, end=None))]
    fn cat<'py>(
        &self,
        py: Python<'py>,
        path: &str,
        start: Option<u64>,
        end: Option<u64>,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let c = self.inner.clone();
        let p = path.to_string();
        let data = block_at(py, path, async move {
            let mut r = FileReader::open(&c, &p).await?;
            let size = r.size();
            let from = start.unwrap_or(0).min(size);
            let to = end.unwrap_or(size).clamp(from, size);
            let mut buf = vec![0u8; (to - from) as usize];
            let n = r.read_full_at(from, &mut buf).await?;
            buf.truncate(n);
            Ok(buf)
        })?;
        Ok(PyBytes::new(py, &data))
    }

    /// Writes `data` as the whole new content of `path` (created if need
    /// be), committed when this returns.
    fn pipe(&self, py: Python<'_>, path: &str, data: &[u8]) -> PyResult<()> {
        let c = self.inner.clone();
        let p = path.to_string();
        let data = data.to_vec();
        block_at(py, path, async move {
            let mut w = FileWriter::open(&c, &p, &WriteOptions::create()).await?;
            w.write(&data).await?;
            w.close().await.map(|_| ())
        })
    }

    fn open_read(&self, py: Python<'_>, path: &str) -> PyResult<Reader> {
        let c = self.inner.clone();
        let p = path.to_string();
        let r = block_at(py, path, async move { FileReader::open(&c, &p).await })?;
        Ok(Reader {
            size: r.size(),
            inner: Arc::new(Mutex::new(Some(r))),
        })
    }

    /// A writer of `path`: `append` continues it, else it is created or
    /// emptied (`replace`: its old content stays until the close).
    #[pyo3(signature = (path, append=false, replace=false))]
    fn open_write(
        &self,
        py: Python<'_>,
        path: &str,
        append: bool,
        replace: bool,
    ) -> PyResult<Writer> {
        let c = self.inner.clone();
        let p = path.to_string();
        let options = WriteOptions {
            create: true,
            truncate: !append && !replace,
            append,
            replace,
            mode: 0o644,
            ..Default::default()
        };
        let w = block_at(
            py,
            path,
            async move { FileWriter::open(&c, &p, &options).await },
        )?;
        Ok(Writer {
            inner: Arc::new(Mutex::new(Some(w))),
        })
    }
}

/// A file open for reading: positional reads of its content as of the open.
#[pyclass(frozen)]
struct Reader {
    #[pyo3(get)]
    size: u64,
    inner: Arc<Mutex<Option<FileReader>>>,
}

#[pymethods]
impl Reader {
    /// Up to `length` bytes from `offset` (fewer only at the end).
    fn pread<'py>(
        &self,
        py: Python<'py>,
        offset: u64,
        length: usize,
    ) -> PyResult<Bound<'py, PyBytes>> {
        let inner = self.inner.clone();
        let len = (length as u64).min(self.size.saturating_sub(offset)) as usize;
        let data = block(py, async move {
            let mut guard = inner.lock().await;
            let r = guard
                .as_mut()
                .ok_or_else(|| FsError::InvalidArgument("the file is closed".into()))?;
            let mut buf = vec![0u8; len];
            let n = r.read_full_at(offset, &mut buf).await?;
            buf.truncate(n);
            Ok(buf)
        })?;
        Ok(PyBytes::new(py, &data))
    }

    fn close(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.inner.clone();
        block(py, async move {
            inner.lock().await.take();
            Ok(())
        })
    }
}

/// A file open for writing; its bytes are committed by `close`.
#[pyclass(frozen)]
struct Writer {
    inner: Arc<Mutex<Option<FileWriter>>>,
}

#[pymethods]
impl Writer {
    fn write(&self, py: Python<'_>, data: &[u8]) -> PyResult<()> {
        let mut rest = data;
        while !rest.is_empty() {
            let n = self.write_some(py, rest)?;
            rest = &rest[n..];
        }
        Ok(())
    }

    /// Writes as much of `data` as the cluster has room for: the number of
    /// bytes written, short of its length when a tier filled up (an
    /// `OSError` with ENOSPC when none went in). The bytes written stay.
    fn write_some(&self, py: Python<'_>, data: &[u8]) -> PyResult<usize> {
        let inner = self.inner.clone();
        let data = data.to_vec();
        block(py, async move {
            let mut guard = inner.lock().await;
            let w = guard
                .as_mut()
                .ok_or_else(|| FsError::InvalidArgument("the file is closed".into()))?;
            w.write_some(&data).await
        })
    }

    /// Commits what was written; the file's new size.
    fn close(&self, py: Python<'_>) -> PyResult<u64> {
        let inner = self.inner.clone();
        block(py, async move {
            match inner.lock().await.take() {
                Some(w) => w.close().await.map(|a| a.size),
                None => Ok(0),
            }
        })
    }

    /// Drops what was written (the file keeps its old content).
    fn abort(&self, py: Python<'_>) -> PyResult<()> {
        let inner = self.inner.clone();
        block(py, async move {
            match inner.lock().await.take() {
                Some(w) => w.abort().await.map(|_| ()),
                None => Ok(()),
            }
        })
    }
}

#[pymodule]
fn _native(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<Client>()?;
    m.add_class::<Reader>()?;
    m.add_class::<Writer>()?;
    Ok(())
}

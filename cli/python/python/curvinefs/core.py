"""The fsspec file system over the native client (``curvinefs._native``)."""

import errno
import io
import os
import re

from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

from . import _native

# curvine://HOST:PORT/path names the cluster; a first segment without a
# port is part of the path.
_AUTHORITY = re.compile(r"^curvine://([^/:]+:\d+)(/.*)?$")


def _pump(reader, write, callback=None):
    """Passes a native reader's bytes to ``write`` in 4 MiB pieces."""
    offset = 0
    while offset < reader.size:
        chunk = reader.pread(offset, 4 << 20)
        if not chunk:
            break
        write(chunk)
        offset += len(chunk)
        if callback is not None:
            callback.relative_update(len(chunk))


class CurvineFileSystem(AbstractFileSystem):
    """A curvine cluster as an fsspec file system.

    Parameters
    ----------
    cluster: a node's client port ("host:port", or several, comma
        separated); by default the cluster of the config file.
    conf: a config file (default: ``CURVINE_CONF``, then built-in defaults).
    options: more config keys, e.g. ``{"client.short_circuit": "false"}``.
    """

    protocol = ("curvine",)
    root_marker = "/"
    # One connection per (cluster, conf, options) in a process, shared by
    # its threads (the native client is thread-safe).
    cachable = True

    def __init__(self, cluster=None, conf=None, options=None, **kwargs):
        super().__init__(**kwargs)
        self.cluster = cluster
        self._conf = conf
        self._opts = [(str(k), str(v)) for k, v in (options or {}).items()]
        self._client = _native.Client(cluster, conf, self._opts)
        self._client_pid = os.getpid()

    @property
    def client(self):
        """The native client; a forked process (a DataLoader worker)
        connects anew, as the parent's connections are not its own."""
        if self._client_pid != os.getpid():
            self._client = _native.Client(self.cluster, self._conf, self._opts)
            self._client_pid = os.getpid()
        return self._client

    # -- paths ---------------------------------------------------------

    @classmethod
    def _strip_protocol(cls, path):
        if isinstance(path, list):
            return [cls._strip_protocol(p) for p in path]
        path = str(path)
        m = _AUTHORITY.match(path)
        if m:
            path = m.group(2) or "/"
        elif path.startswith("curvine://"):
            path = path[len("curvine://"):]
        path = "/" + path.lstrip("/")
        return path.rstrip("/") or "/"

    @staticmethod
    def _get_kwargs_from_urls(path):
        m = _AUTHORITY.match(str(path))
        return {"cluster": m.group(1)} if m else {}

    def unstrip_protocol(self, name):
        if self.cluster and "," not in self.cluster:
            return f"curvine://{self.cluster}{name}"
        return f"curvine://{name}"

    # -- metadata ------------------------------------------------------

    def info(self, path, **kwargs):
        return self.client.stat(self._strip_protocol(path))

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path)
        st = self.client.stat(path)
        entries = self.client.ls(path) if st["type"] == "directory" else [st]
        entries.sort(key=lambda e: e["name"])
        return entries if detail else [e["name"] for e in entries]

    def mkdir(self, path, create_parents=True, **kwargs):
        self.client.mkdir(self._strip_protocol(path), create_parents)

    def makedirs(self, path, exist_ok=False):
        try:
            self.client.mkdir(self._strip_protocol(path), True)
        except FileExistsError:
            if not exist_ok:
                raise

    def rmdir(self, path):
        self.client.rmdir(self._strip_protocol(path))

    def rm_file(self, path):
        self.client.rm(self._strip_protocol(path), False)

    def _rm(self, path):
        self.rm_file(path)

    def rm(self, path, recursive=False, maxdepth=None):
        paths = path if isinstance(path, list) else [path]
        for p in paths:
            p = self._strip_protocol(p)
            if recursive and maxdepth is None:
                self.client.rm(p, True)
            elif self.isdir(p):
                if not recursive:
                    raise IsADirectoryError(errno.EISDIR, f"{p} is a directory")
                super().rm(p, recursive=True, maxdepth=maxdepth)
            else:
                self.client.rm(p, False)

    def mv(self, path1, path2, recursive=False, maxdepth=None, **kwargs):
        """Renames (one request, atomic), for files and directories alike."""
        self.client.rename(self._strip_protocol(path1), self._strip_protocol(path2))

    def modified(self, path):
        import datetime

        return datetime.datetime.fromtimestamp(self.info(path)["mtime"], datetime.timezone.utc)

    def created(self, path):
        import datetime

        return datetime.datetime.fromtimestamp(self.info(path)["ctime"], datetime.timezone.utc)

    # -- data ------------------------------------------------------------

    def cat_file(self, path, start=None, end=None, **kwargs):
        path = self._strip_protocol(path)
        if (start is not None and start < 0) or (end is not None and end < 0):
            size = self.client.stat(path)["size"]
            start = size + start if start is not None and start < 0 else start
            end = size + end if end is not None and end < 0 else end
        return self.client.cat(path, start, end)

    def pipe_file(self, path, value, mode="overwrite", **kwargs):
        path = self._strip_protocol(path)
        if mode == "create" and self.exists(path):
            raise FileExistsError(errno.EEXIST, f"{path} exists")
        self._with_parents(path, lambda: self.client.pipe(path, bytes(value)))

    def put_file(self, lpath, rpath, callback=None, mode="overwrite", **kwargs):
        rpath = self._strip_protocol(rpath)
        if os.path.isdir(lpath):
            self.makedirs(rpath, exist_ok=True)
            return
        size = os.path.getsize(lpath)
        if callback is not None:
            callback.set_size(size)
        w = self._open_write(rpath, False, True)
        try:
            with open(lpath, "rb") as f:
                while True:
                    chunk = f.read(4 << 20)
                    if not chunk:
                        break
                    w.write(chunk)
                    if callback is not None:
                        callback.relative_update(len(chunk))
        except BaseException:
            w.abort()
            raise
        w.close()

    def get_file(self, rpath, lpath, callback=None, outfile=None, **kwargs):
        rpath = self._strip_protocol(rpath)
        if self.isdir(rpath):
            os.makedirs(lpath, exist_ok=True)
            return
        r = self.client.open_read(rpath)
        if callback is not None:
            callback.set_size(r.size)
        try:
            out = outfile if outfile is not None else open(lpath, "wb")
            try:
                _pump(r, out.write, callback)
            finally:
                if outfile is None:
                    out.close()
        finally:
            r.close()

    def _with_parents(self, path, make):
        """``make()``, which creates ``path``; when its directory is missing,
        makes it (with its parents, as object stores and HDFS do) and tries
        again."""
        try:
            return make()
        except FileNotFoundError:
            parent = path.rsplit("/", 1)[0] or "/"
            if self.exists(parent):
                raise
            self.makedirs(parent, exist_ok=True)
            return make()

    def _open_write(self, path, append, truncate):
        return self._with_parents(path, lambda: self.client.open_write(path, append, truncate))

    def cp_file(self, path1, path2, **kwargs):
        """Copies a file's bytes (through this process: the cluster has no
        server-side copy); the copy replaces ``path2`` whole at its end."""
        path1, path2 = self._strip_protocol(path1), self._strip_protocol(path2)
        if self.isdir(path1):
            self.makedirs(path2, exist_ok=True)
            return
        r = self.client.open_read(path1)
        try:
            w = self._open_write(path2, False, True)
            try:
                _pump(r, w.write)
            except BaseException:
                w.abort()
                raise
            w.close()
        finally:
            r.close()

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        return CurvineFile(self, self._strip_protocol(path), mode, block_size=block_size,
                           autocommit=autocommit, cache_options=cache_options, **kwargs)

    def touch(self, path, truncate=True, **kwargs):
        path = self._strip_protocol(path)
        if truncate or not self.exists(path):
            self._with_parents(path, lambda: self.client.pipe(path, b""))


class CurvineFile(AbstractBufferedFile):
    """A file of the cluster: reads are positional reads of its content as
    of the open (fsspec's cache in front); writes are buffered and sent in
    order, and committed by ``close``. ``"ab"`` appends; ``"wb"`` replaces
    the content (readers see the old one until the close)."""

    def __init__(self, fs, path, mode="rb", block_size=None, autocommit=True,
                 cache_options=None, **kwargs):
        if mode not in ("rb", "wb", "ab", "xb"):
            raise ValueError(f"unsupported mode {mode!r} (rb, wb, ab, xb)")
        self._reader = None
        self._writer = None
        if mode == "rb":
            self._reader = fs.client.open_read(path)
            kwargs["size"] = self._reader.size
        elif mode == "xb" and fs.exists(path):
            raise FileExistsError(errno.EEXIST, f"{path} exists")
        super().__init__(fs, path, mode=mode, block_size=block_size or 4 << 20,
                         autocommit=autocommit, cache_options=cache_options, **kwargs)

    def _fetch_range(self, start, end):
        return self._reader.pread(start, end - start)

    def _initiate_upload(self):
        self._writer = self.fs._open_write(self.path, self.mode == "ab", self.mode != "ab")

    def _upload_chunk(self, final=False):
        if self._writer is None:
            self._initiate_upload()
        data = self.buffer.getvalue()
        if not final:
            self._send(data)
            return True
        # The close commits what was written even when the last write
        # found no room (ENOSPC, raised after it): the file keeps every
        # byte whose write succeeded, as a full local disk does.
        try:
            self._send(data)
        finally:
            writer, self._writer = self._writer, None
            writer.close()
        return True

    def _send(self, data):
        """Writes all of ``data``; when the cluster has room for only part
        of it, what went in leaves the buffer before ENOSPC is raised, so
        that a later flush does not write it twice."""
        done = 0
        try:
            while done < len(data):
                done += self._writer.write_some(data[done:])
        finally:
            if done < len(data):
                self.offset += done
                self.buffer = io.BytesIO()
                self.buffer.write(data[done:])

    def discard(self):
        if self._writer is not None:
            self._writer.abort()
            self._writer = None
        super().discard()

    def close(self):
        try:
            super().close()
        finally:
            if self._reader is not None:
                self._reader.close()
                self._reader = None

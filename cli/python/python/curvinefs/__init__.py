"""curvinefs: an fsspec file system for curvine clusters.

    import fsspec
    fs = fsspec.filesystem("curvine", cluster="10.0.0.1:8995")
    with fs.open("/data/part-0.parquet", "rb") as f:
        ...
    pandas.read_csv("curvine://10.0.0.1:8995/data/table.csv")

URLs are ``curvine://HOST:PORT/path`` (the node's client port) or
``curvine:///path`` (the cluster of the config file, ``CURVINE_CONF`` or
the ``CURVINE_CLIENT_CLUSTER`` environment variable). Reads of blocks on
this host are short-circuit; a file written through ``open(..., "wb")``
is committed, and seen by every client, when it is closed.
"""

import fsspec

from .core import CurvineFile, CurvineFileSystem

__all__ = ["CurvineFileSystem", "CurvineFile"]

fsspec.register_implementation("curvine", CurvineFileSystem, clobber=True)

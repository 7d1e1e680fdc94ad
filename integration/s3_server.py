"""Runs moto_server, the test S3 server, with one fix to its signature check.

AWS canonicalises a request's query string before checking its SigV4
signature: every key and value is URI-encoded ('/' becomes %2F). moto's
check takes the query as sent, so a client that sends `prefix=a/` unencoded
(as Rust S3 clients do, and AWS and MinIO accept) fails with
SignatureDoesNotMatch there. This wrapper canonicalises the query the way
AWS does before moto compares signatures; nothing else changes.
Usage: python3 s3_server.py [moto_server arguments]
"""
import sys
from urllib.parse import quote, unquote

import botocore.auth


def _canonical_query_string_url(self, parts):
    if not parts.query:
        return ""
    pairs = []
    for pair in parts.query.split("&"):
        key, _, value = pair.partition("=")
        pairs.append((quote(unquote(key), safe="-_.~"), quote(unquote(value), safe="-_.~")))
    return "&".join(f"{k}={v}" for k, v in sorted(pairs))


botocore.auth.SigV4Auth._canonical_query_string_url = _canonical_query_string_url

from moto.server import main  # noqa: E402

if __name__ == "__main__":
    main(sys.argv[1:])

"""The client for a store URL: a store server's over HTTP (weight_sync.agent.fetch) or an S3 bucket's
(weight_sync.agent.s3_fetch), one interface."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import aiohttp

from weight_sync.agent.fetch import StoreClient

if TYPE_CHECKING:
    from weight_sync.agent.s3_fetch import S3StoreClient


def open_store(
    url: str, session: aiohttp.ClientSession, download_dir: Path, parallel: int = 4, token: str | None = None
) -> StoreClient | S3StoreClient:
    """The client for a store URL: an S3 bucket (s3://BUCKET/PREFIX, weight_sync/agent/s3_fetch.py; endpoint and
    credentials from the AWS_* variables, every request signed) or a store server over HTTP (with the fleet
    read credential `token`)."""
    if url.startswith("s3://"):
        from weight_sync.agent.s3_fetch import S3StoreClient  # obstore only where a bucket is used

        return S3StoreClient(url, download_dir, parallel)
    return StoreClient(url, session, download_dir, parallel, token=token)

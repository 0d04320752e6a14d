"""moto's S3 server in this process: the S3 endpoint of the tests that need one.

``ThreadedMotoServer`` on 127.0.0.1 and a free port (moto 5's in-process server). clp-s reaches it
with path-style URLs ``http://127.0.0.1:<port>/<bucket>/<key>``; leave ``region_code`` unset for
this endpoint, since CLP would prepend the region to the IP address. moto does not check
signatures, so any credentials are accepted.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from typing import Any

import boto3
import pytest
from botocore.config import Config
from moto.server import ThreadedMotoServer

ACCESS_KEY_ID = "AKIATESTCOORDINATOR"
SECRET_ACCESS_KEY = "test/secret+key"


@pytest.fixture(scope="module")
def s3_endpoint() -> Iterator[str]:
    """``http://127.0.0.1:<port>`` of a moto S3 server, started once per test module."""
    # moto logs every request through werkzeug even with verbose=False.
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    try:
        host, port = server.get_host_and_port()
        yield f"http://{host}:{port}"
    finally:
        server.stop()


def s3_client(endpoint_url: str) -> Any:
    """A boto3 S3 client for the moto server (path-style, explicit test credentials)."""
    return boto3.session.Session().client(
        "s3",
        endpoint_url=endpoint_url,
        region_name="us-east-1",
        aws_access_key_id=ACCESS_KEY_ID,
        aws_secret_access_key=SECRET_ACCESS_KEY,
        config=Config(s3={"addressing_style": "path"}),
    )

"""`retain` of a save dir in a bucket (moto's S3 server, the real boto3 client): the same plan as on disk where
the times agree, object URLs in `--print0`, and the bucket left as it was (no write request).

On object storage the age rule reads the objects' last-modified times, which are the upload's: every iteration
just uploaded is "recent", so the unfinished `iter_0000003` of the torch_dist sample is kept as in flight, as a
save being written to the bucket right now would be.
"""

from __future__ import annotations

import json

from typer.testing import CliRunner

from ckptinspect.cli.app import app
from conftest import SAMPLES
from s3_server import S3Server, s3_server, upload  # noqa: F401 - the fixture


def test_retain_of_a_bucket_plans_as_on_disk(s3_server: S3Server) -> None:  # noqa: F811
    upload(s3_server, SAMPLES / "torch_dist", "retain/save")
    url = s3_server.url("retain/save")
    before = {o["Key"]: o["ETag"] for o in s3_server.client.list_objects_v2(
        Bucket=s3_server.bucket, Prefix="retain/save/")["Contents"]}
    r = CliRunner().invoke(app, ["retain", url, "--keep-last", "1", "-o", "json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)
    assert doc["delete"] == ["iter_0000001"]
    assert doc["delete_paths"] == [f"{url}/iter_0000001"]
    assert {k["name"]: k["reasons"] for k in doc["keep"]} == {
        "iter_0000002": ["tracked", "resume-pick", "newest-complete", "keep-last"],
        "iter_0000003": ["in-flight"]}
    ck522 = [f for f in doc["findings"] if f["code"] == "CK522"]
    assert [f["details"]["why"] for f in ck522] == ["recent-writes"]
    assert doc["storage"]["requests_by_op"].get("put", 0) == 0
    p0 = CliRunner().invoke(app, ["retain", url, "--keep-last", "1", "--print0"])
    assert p0.exit_code == 0 and p0.stdout == f"{url}/iter_0000001\0"
    after = {o["Key"]: o["ETag"] for o in s3_server.client.list_objects_v2(
        Bucket=s3_server.bucket, Prefix="retain/save/")["Contents"]}
    assert after == before

"""`watch` of a save dir in a bucket (moto's S3 server, the real boto3 client): every poll lists afresh, so an
object uploaded between two polls is seen by the second — the final marker of an unfinished iteration arriving
makes it complete and audited — and watching writes nothing to the bucket."""

from __future__ import annotations

import ckptinspect
from ckptinspect.commands.watch import EventKind
from conftest import SAMPLES
from s3_server import S3Server, s3_server, upload  # noqa: F401 - the fixture


def test_watch_of_a_bucket_sees_the_marker_arrive(s3_server: S3Server) -> None:  # noqa: F811
    upload(s3_server, SAMPLES / "torch_dist", "watch/save")
    url = s3_server.url("watch/save")
    polls = [0]

    def between_polls(_seconds: float) -> None:
        polls[0] += 1
        if polls[0] == 1:  # the save finishes iteration 3 in the bucket
            s3_server.client.upload_file(str(SAMPLES / "torch_dist" / "iter_0000001" / "metadata.json"),
                                         s3_server.bucket, "watch/save/iter_0000003/metadata.json")

    before = {o["Key"] for o in s3_server.client.list_objects_v2(Bucket=s3_server.bucket,
                                                                  Prefix="watch/save/")["Contents"]}
    from ckptinspect.commands.watch import WatchOptions, follow
    from ckptinspect.io import location

    ckptinspect.ls(url)  # the session of a URL, as the CLI opens it
    events = list(follow(location(url), url, WatchOptions(interval=0, max_polls=3), sleep=between_polls))
    seen = [(e.kind, e.name, e.status.value if e.status else None) for e in events]
    assert (EventKind.IN_FLIGHT, "iter_0000003", "incomplete") in seen, seen
    assert seen.index((EventKind.IN_FLIGHT, "iter_0000003", "incomplete")) < seen.index(
        (EventKind.COMPLETE, "iter_0000003", "complete")), seen
    assert sum(1 for k, n, _ in seen if k is EventKind.AUDITED and n == "iter_0000003") == 1
    after = {o["Key"] for o in s3_server.client.list_objects_v2(Bucket=s3_server.bucket,
                                                                 Prefix="watch/save/")["Contents"]}
    assert after == before | {"watch/save/iter_0000003/metadata.json"}
    from ckptinspect.io.session import session

    assert session().stats.snapshot().to_dict()["requests_by_op"].get("put", 0) == 0

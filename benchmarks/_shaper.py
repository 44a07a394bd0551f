"""A TCP proxy that caps each connection's download rate: a model of object storage, where one connection gets a
bounded share of the bandwidth (tens to ~100 MB/s for S3) and clients get more by opening more connections.

    python benchmarks/_shaper.py LISTEN_PORT UPSTREAM_PORT MIB_PER_S

Used by `bench_object_storage.py --link-mibps N` in front of the moto server, in its own process, for both
verifiers alike. Bytes are forwarded unchanged (no HTTP parsing); server-to-client bytes of every connection are
paced to MIB_PER_S, client-to-server bytes are not.
"""

from __future__ import annotations

import asyncio
import sys
import time

PIECE = 64 << 10


async def _pump(reader: asyncio.StreamReader, writer: asyncio.StreamWriter, rate: float | None) -> None:
    start, sent = time.monotonic(), 0
    try:
        while data := await reader.read(PIECE):
            writer.write(data)
            await writer.drain()
            if rate is not None:
                sent += len(data)
                ahead = sent / rate - (time.monotonic() - start)
                if ahead > 0:
                    await asyncio.sleep(ahead)
    except (ConnectionError, asyncio.CancelledError):
        pass
    finally:
        writer.close()


async def main(listen: int, upstream: int, mibps: float) -> None:
    rate = mibps * (1 << 20)

    async def handle(cr: asyncio.StreamReader, cw: asyncio.StreamWriter) -> None:
        try:
            ur, uw = await asyncio.open_connection("127.0.0.1", upstream)
        except OSError:
            cw.close()
            return
        await asyncio.gather(_pump(cr, uw, None), _pump(ur, cw, rate))

    server = await asyncio.start_server(handle, "127.0.0.1", listen)
    async with server:
        await server.serve_forever()


if __name__ == "__main__":
    asyncio.run(main(int(sys.argv[1]), int(sys.argv[2]), float(sys.argv[3])))

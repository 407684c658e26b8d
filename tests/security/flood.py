"""``python -m tests.security.flood URL COUNT AT_ONCE``: COUNT raw clients connect to URL with
garbage tokens, AT_ONCE of them in flight at a time. Prints ``under way`` once AT_ONCE are
done, then one JSON line: how many were done when it said so, how many got in (``admitted``)."""

from __future__ import annotations

import asyncio
import collections
import json
import sys

SHAPES = ("garbage-{}", "eyJhbGciOiJSUzI1NiJ9.{}.c2ln", "")  # text, a JWT of nothing, no token at all


async def garbage_connect(host: str, port: int, token: str, gate: asyncio.Semaphore) -> str:
    """One raw client presenting ``token``: what the server answered (``PONG``: let in)."""
    async with gate:
        try:
            reader, writer = await asyncio.open_connection(host, port)
        except OSError as err:
            return f"connect {type(err).__name__}"
        try:
            await asyncio.wait_for(reader.readline(), 10)  # INFO
            connect = {"auth_token": token, "verbose": False, "pedantic": False, "protocol": 1}
            writer.write(f"CONNECT {json.dumps(connect)}\r\nPING\r\n".encode())
            await writer.drain()
            answer = await asyncio.wait_for(reader.readline(), 10)
            return answer.decode(errors="replace").strip()[:40] or "closed"
        except (OSError, asyncio.IncompleteReadError, TimeoutError) as err:
            return type(err).__name__
        finally:
            writer.close()


async def main(url: str, count: int, at_once: int) -> None:
    host, port = url.removeprefix("nats://").rsplit(":", 1)
    gate = asyncio.Semaphore(at_once)
    flood = [asyncio.ensure_future(garbage_connect(host, int(port), SHAPES[i % 3].format(i), gate))
             for i in range(count)]
    while sum(task.done() for task in flood) < at_once:
        await asyncio.sleep(0.01)
    done_before = sum(task.done() for task in flood)
    print("under way", flush=True)
    answers = collections.Counter(await asyncio.gather(*flood))
    print(json.dumps({"done_before": done_before, "admitted": answers["PONG"], "answers": answers}), flush=True)


if __name__ == "__main__":
    asyncio.run(main(sys.argv[1], int(sys.argv[2]), int(sys.argv[3])))

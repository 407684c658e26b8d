"""Typed bus vs raw nats-py on the same nats-server, alternating, in one run.

  python -m bench.bus [--messages 100000] [--js-messages 20000] [--rounds 2]

Figures: core publish->handler throughput, request/reply latency, JetStream
durable pull consume with explicit ack; each typed figure as a ratio to raw.
"""

from __future__ import annotations

import argparse
import asyncio
import time

import nats
from gpushare_common import events
from gpushare_common.bus import AckPolicy, Bus
from gpushare_common.settings import NatsSettings
from gpushare_common.subjects import Subjects
from nats.js import api

from bench.report import Row, emit, median, percentile
from tests.support.nats import NatsServer

EVENT = events.SpotEvent(node="n1", pod="spot/borrower-1", container="main", state="using",
                         devices=("spot-GPU-0",))


async def core_raw(url: str, subject: str, count: int) -> float:
    sub_nc, pub_nc = await nats.connect(url), await nats.connect(url)
    done = asyncio.Event()
    seen = 0

    async def on_msg(msg: nats.aio.msg.Msg) -> None:
        nonlocal seen
        seen += 1
        if seen == count:
            done.set()

    await sub_nc.subscribe(subject, cb=on_msg, pending_msgs_limit=count + 1)
    await sub_nc.flush()
    payload = events.encode(EVENT)
    start = time.perf_counter()
    for _ in range(count):
        await pub_nc.publish(subject, payload)
    await pub_nc.flush()
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - start
    await sub_nc.close()
    await pub_nc.close()
    return count / elapsed


async def core_typed(settings: NatsSettings, subject: str, count: int) -> float:
    sub_bus, pub_bus = Bus(settings, "bench-sub"), Bus(settings, "bench-pub")
    await sub_bus.connect()
    await pub_bus.connect()
    done = asyncio.Event()
    seen = 0

    async def handler(event: events.AnyEvent) -> None:
        nonlocal seen
        seen += 1
        if seen == count:
            done.set()

    sub = await sub_bus.subscribe(subject, handler)
    sub._pending_msgs_limit = count + 1
    await sub_bus.flush()
    start = time.perf_counter()
    for _ in range(count):
        await pub_bus.publish(subject, EVENT)
    await pub_bus.client.flush()
    await asyncio.wait_for(done.wait(), 120)
    elapsed = time.perf_counter() - start
    await sub_bus.drain()
    await pub_bus.drain()
    return count / elapsed


async def request_latency(settings: NatsSettings, subject: str, count: int) -> tuple[list[float], list[float]]:
    server_bus, client_bus = Bus(settings, "bench-srv"), Bus(settings, "bench-cli")
    await server_bus.connect()
    await client_bus.connect()
    reply = events.KmodReply(node="n1", op="stats", status=0)

    async def responder(event: events.AnyEvent) -> events.Event:
        return reply

    await server_bus.serve(subject, responder)
    await server_bus.flush()
    command = events.KmodCommand(node="n1", op="stats")
    raw_payload = events.encode(command)
    raw, typed = [], []
    for _ in range(count):
        t0 = time.perf_counter()
        await client_bus.client.request(subject, raw_payload, timeout=2)
        t1 = time.perf_counter()
        await client_bus.request(subject, command)
        t2 = time.perf_counter()
        raw.append((t1 - t0) * 1000)
        typed.append((t2 - t1) * 1000)
    await server_bus.drain()
    await client_bus.drain()
    return raw, typed


async def fill_stream(settings: NatsSettings, subject: str, count: int) -> None:
    bus = Bus(settings, "bench-fill")
    await bus.connect()
    await bus.ensure_layout()  # this bench installs its own stream (a cluster's installer does it there)
    await bus.wait_for_stream()
    payload = events.encode(EVENT)
    for _ in range(count):
        await bus.client.publish(subject, payload)
    await bus.client.flush()
    while (await bus.client.jetstream().stream_info(settings.stream)).state.messages < count:
        await asyncio.sleep(0.05)
    await bus.drain()


async def js_raw(settings: NatsSettings, subject: str, count: int) -> float:
    nc = await nats.connect(settings.url)
    js = nc.jetstream()
    config = api.ConsumerConfig(ack_policy=api.AckPolicy.EXPLICIT, max_deliver=5, ack_wait=30)
    sub = await js.pull_subscribe(subject, durable="raw", stream=settings.stream, config=config)
    seen = 0
    start = time.perf_counter()
    while seen < count:
        for msg in await sub.fetch(256, timeout=5):
            await msg.ack()
            seen += 1
    elapsed = time.perf_counter() - start
    await nc.close()
    return count / elapsed


async def js_typed(settings: NatsSettings, subject: str, count: int) -> float:
    bus = Bus(settings, "bench-js")
    await bus.connect()
    stop = asyncio.Event()
    seen = 0

    async def handler(event: events.AnyEvent) -> None:
        nonlocal seen
        seen += 1
        if seen == count:
            stop.set()

    start = time.perf_counter()
    await bus.consume(subject, "typed", handler, AckPolicy(), stop)
    elapsed = time.perf_counter() - start
    await bus.drain()
    return count / elapsed


async def run(args: argparse.Namespace) -> list[Row]:
    server = NatsServer().start()
    try:
        raw_core, typed_core, raw_js, typed_js = [], [], [], []
        for round_no in range(args.rounds):
            bench = f"bench{round_no}"
            settings = NatsSettings(url=server.url, prefix=f"{bench}.v1", stream=bench.upper(),
                                    stream_max_bytes=1 << 30)
            subject = Subjects(settings.prefix).event("n1", "spot")
            raw_core.append(await core_raw(server.url, subject + "raw", args.messages))
            typed_core.append(await core_typed(settings, subject + "typed", args.messages))
            await fill_stream(settings, subject, args.js_messages)
            raw_js.append(await js_raw(settings, subject, args.js_messages))
            typed_js.append(await js_typed(settings, subject, args.js_messages))
            print(f"round {round_no + 1}/{args.rounds}: core raw {raw_core[-1]:,.0f}/s typed "
                  f"{typed_core[-1]:,.0f}/s; js raw {raw_js[-1]:,.0f}/s typed {typed_js[-1]:,.0f}/s",
                  flush=True)
        settings = NatsSettings(url=server.url, prefix="benchrr.v1", stream="BENCHRR")
        subject = Subjects(settings.prefix).kmod_cmd("n1", "release")
        raw_rr, typed_rr = await request_latency(settings, subject, args.requests)
    finally:
        server.cleanup()
    core_ratio = median(typed_core) / median(raw_core)
    js_ratio = median(typed_js) / median(raw_js)
    return [
        Row("bus", "core pub/sub raw nats-py", median(raw_core), "msg/s"),
        Row("bus", "core pub/sub typed", median(typed_core), "msg/s"),
        Row("bus", "core typed/raw", core_ratio, "ratio", ">= 0.80", core_ratio >= 0.80),
        Row("bus", "js consume+ack raw nats-py", median(raw_js), "msg/s"),
        Row("bus", "js consume+ack typed", median(typed_js), "msg/s"),
        Row("bus", "js typed/raw", js_ratio, "ratio", ">= 0.50", js_ratio >= 0.50),
        Row("bus", "request/reply raw p50", percentile(raw_rr, 50), "ms"),
        Row("bus", "request/reply typed p50", percentile(typed_rr, 50), "ms"),
        Row("bus", "request/reply typed p99", percentile(typed_rr, 99), "ms"),
    ]


def main() -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.bus")
    parser.add_argument("--messages", type=int, default=100_000)
    parser.add_argument("--js-messages", type=int, default=20_000)
    parser.add_argument("--requests", type=int, default=2_000)
    parser.add_argument("--rounds", type=int, default=2)
    emit(asyncio.run(run(parser.parse_args())))


if __name__ == "__main__":
    main()

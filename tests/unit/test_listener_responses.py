"""The Kafka listener's response writer: a client that goes away is not a bug to log."""

from __future__ import annotations

import logging

import trio
import trio.testing

from broker.protocol.kafka_listener import KafkaListener


def test_a_client_gone_mid_response_is_logged_without_a_traceback(caplog):
    async def main() -> bool:
        server_side, client_side = trio.testing.memory_stream_pair()
        await client_side.aclose()  # the client hung up before its answer
        send, receive = trio.open_memory_channel[bytes | None](4)
        with trio.CancelScope() as scope:
            async with send:
                await send.send(b"\x00\x00\x00\x04abcd")
            await KafkaListener._write_responses(server_side, receive, "127.0.0.1:1", scope)
        return scope.cancel_called

    with caplog.at_level(logging.DEBUG, logger="broker"):
        cancelled = trio.run(main)
    assert cancelled  # the connection is closed
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING or r.exc_info]
    assert any("lost" in r.getMessage() for r in caplog.records)

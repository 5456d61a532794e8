"""A client that resets its connection (RST) while its requests are in flight ends only that
connection: the controller's RPC server keeps serving everyone else (regression: the reset
escaped as an ExceptionGroup and stopped the whole server)."""

from __future__ import annotations

import socket
import struct

import trio

from kraft.rpc.client import ControllerClient
from kraft.rpc.framing import encode_frame
from kraft.rpc.server import RpcServer


async def _slow_handler(api: str, body: dict, ctx: object) -> dict:
    await trio.sleep(0.2)  # the answer comes after the client is gone
    return {"ok": True}


def test_a_reset_connection_does_not_stop_the_server() -> None:
    async def main() -> None:
        async with trio.open_nursery() as nursery:
            server = RpcServer("127.0.0.1", 0, _slow_handler)
            port = await nursery.start(server.serve)
            for _ in range(5):
                sock = socket.create_connection(("127.0.0.1", port))
                for i in range(3):
                    sock.sendall(
                        encode_frame(
                            {"api": "ListTopics", "version": 0, "body": {}, "client_id": "rst"}
                        )
                    )
                await trio.sleep(0.05)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
                sock.close()  # RST while three answers are pending
            await trio.sleep(0.5)  # the server writes into the reset connections
            client = ControllerClient([("127.0.0.1", port)])
            with trio.fail_after(10):
                assert await client.call("ListTopics", {}) == {"ok": True}
            await client.aclose()
            nursery.cancel_scope.cancel()

    trio.run(main)

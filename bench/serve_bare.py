"""The least a Python HTTP server can do per predict request: the floor ``bench/serve_bench.py --bare``
sets beside ``kiln serve``, so its ratio to the in-process runner reads against what any Python front
end on the same cores reaches, not against zero.

uvloop + httptools, one keep-alive connection handler, ``json.loads`` of the body into a float32 array,
the same runner kiln serve uses, ``json.dumps`` of the answer. None of what a server owes its clients:
no limits, checks, deadlines, metrics, versions, error answers or drain. ``workers`` processes share the
port with SO_REUSEPORT, as kiln serve's do.

    python bench/serve_bare.py MODEL.tflite PORT WORKERS BACKEND
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import sys

import httptools
import numpy as np
import uvloop


def serve(model_path: str, sock: socket.socket, backend: str) -> None:
    from kiln.runtime import served

    model = served.open(model_path, backend)
    signature = model.signature()
    runner = model.new_runner()
    name = next(iter(signature.inputs))

    class Connection(asyncio.Protocol):
        def connection_made(self, transport):
            self.transport = transport
            self.parser = httptools.HttpRequestParser(self)
            self.body = []

        def data_received(self, data):
            self.parser.feed_data(data)

        def on_body(self, body):
            self.body.append(body)

        def on_message_complete(self):
            rows = np.asarray(json.loads(b"".join(self.body))["instances"], np.float32)
            self.body = []
            outputs = runner.run(signature.key, {name: rows})
            answer = json.dumps({"predictions": next(iter(outputs.values())).tolist()}).encode()
            self.transport.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s"
                                 % (len(answer), answer))

    loop = uvloop.new_event_loop()
    loop.run_until_complete(loop.create_server(Connection, sock=sock))
    loop.run_forever()


def main() -> None:
    model_path, port, workers, backend = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    children = []
    for _ in range(workers):
        sock = socket.socket()
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        sock.bind(("127.0.0.1", port))
        sock.listen(1024)
        pid = os.fork()
        if pid == 0:
            serve(model_path, sock, backend)
            os._exit(0)
        sock.close()
        children.append(pid)
    for pid in children:
        os.waitpid(pid, 0)


if __name__ == "__main__":
    main()

"""mlxcel.sendbuf finds a connection's socket by its ASGI addresses and caps its send
buffer (the bound on a streaming response's unread bytes)."""

from __future__ import annotations

import socket

from mlxcel.sendbuf import STREAM_SNDBUF, bound_unread, connection_fd


def test_the_connection_is_found_with_text_ports_and_its_send_buffer_capped():
    with socket.socket() as listener:
        listener.bind(("127.0.0.1", 0))
        listener.listen()
        with socket.create_connection(listener.getsockname()) as client:
            accepted, _ = listener.accept()
            with accepted:
                host, port = client.getsockname()
                scope = {"client": [host, str(port)],  # as Granian gives them
                         "server": [listener.getsockname()[0],
                                    str(listener.getsockname()[1])]}
                assert connection_fd(scope["client"], scope["server"]) == accepted.fileno()
                assert bound_unread(scope)
                after = accepted.getsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF)
    assert after <= 2 * STREAM_SNDBUF  # Linux reports twice the value set


def test_an_unknown_connection_is_left_alone():
    assert connection_fd(("127.0.0.1", 1), ("127.0.0.1", 2)) is None
    assert not bound_unread({"client": None, "server": None})

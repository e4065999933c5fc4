"""The platform's embedded Redis as its local processes reach it: over the server's socket file, not loopback TCP
(a round trip there costs less; docs/architecture.md). The local gateway, and with it every process instance it
starts, gets the socket's URL; the URL for containers and Ray nodes stays TCP."""

from __future__ import annotations

from stellaris.platform.local import Platform


def test_the_local_gateway_reaches_the_embedded_redis_over_its_socket_file() -> None:
    with Platform(redis_url=None, gateway_url=None, gateway_token=None) as platform:
        cache = platform.cache
        assert cache is not None and cache.server is not None and cache.server.socket_path is not None
        sock = str(cache.server.socket_path)
        assert cache.local_url.startswith("unix://") and "@127.0.0.1:" in cache.url
        ours = cache.client.client_id()
        clients = cache.client.client_list()  # the gateway connected before it said it was ready (its cache pings)
        theirs = [c for c in clients if int(c["id"]) != ours]
        assert theirs, "the local gateway never connected to the embedded Redis"
        assert all(c["laddr"].startswith(f"{sock}:") for c in clients), [(c["addr"], c["laddr"]) for c in clients]

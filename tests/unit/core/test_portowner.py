"""Who listens on a port: the parts that read a registry's config and docker-proxy's argv."""

from __future__ import annotations

import os
import socket
from pathlib import Path

from builder.core import portowner


def test_a_registry_listener_names_its_storage_from_its_config(tmp_path: Path) -> None:
    config = tmp_path / "config.yml"
    config.write_text("version: 0.1\nstorage:\n  filesystem:\n    rootdirectory: /var/lib/reg\n")
    found = portowner.Listener(0, os.getpid(), ["/usr/bin/docker-registry", "serve", str(config)])
    assert found.storage() == "/var/lib/reg" and found.container_hint() is None
    assert found.describe().startswith(f"pid {os.getpid()} (`/usr/bin/docker-registry serve")
    assert portowner.Listener(0, None, []).describe().startswith("a process of user")


def test_docker_proxy_points_at_the_container() -> None:
    proxy = portowner.Listener(0, 1, ["/usr/bin/docker-proxy", "-proto", "tcp", "-host-ip",
                                      "0.0.0.0", "-host-port", "5000", "-container-ip",
                                      "172.17.0.2", "-container-port", "5000"])
    assert proxy.container_hint() == ("a Docker container publishes it (172.17.0.2:5000): "
                                      "`docker ps --filter publish=5000`")


def test_a_listening_socket_of_this_process_is_found_and_a_free_port_skips_it() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        found = portowner.listener(f"127.0.0.1:{port}")
        assert found is not None and found.pid == os.getpid() and found.uid == os.getuid()
        assert portowner.free_port("127.0.0.1", port) != port

"""Connecting to Ray: on this machine, or to a cluster's head at ``--address``.

Kept apart from the sweep's trials so that fleet profiling (:mod:`specrl.sweep.fleet`)
imports no training code: a GPU node with torch and transformers only runs it. Ray is
imported inside the functions (the ``[sweep]`` extra), so importing this module does not.
"""

from __future__ import annotations

import logging
import socket
from collections.abc import Iterator
from contextlib import contextmanager

from specrl.errors import SpecrlError

CONNECT_TIMEOUT_S = 10.0
"""How long ``--address`` waits for the head node to accept a connection."""


def check_address(address: str) -> None:
    """Refuse, within :data:`CONNECT_TIMEOUT_S`, an ``address`` where nothing listens (Ray
    itself would retry for minutes). ``auto`` is left to Ray, which answers at once."""
    if address == "auto":
        return
    host, colon, port = address.removeprefix("ray://").rpartition(":")
    if not colon or not host or not port.isdigit():
        raise SpecrlError(
            f"--address {address}: expected HOST:PORT of the head node (`ray start --head` "
            "prints it; port 6379 by default), ray://HOST:10001, or auto"
        )
    try:
        with socket.create_connection((host, int(port)), timeout=CONNECT_TIMEOUT_S):
            pass
    except OSError as err:
        raise SpecrlError(
            f"--address {address}: no Ray cluster answers there ({err.strerror or err}); start "
            "one with `ray start --head` on the head node, or leave --address out to run on "
            "this machine"
        ) from None


def import_ray():
    """The ``ray`` module, or an error naming the extra that installs it."""
    try:
        import ray
    except ModuleNotFoundError:
        raise SpecrlError(
            "this runs on Ray, which is not installed: pip install 'specrl[sweep]'"
        ) from None
    return ray


@contextmanager
def ray_session(address: str | None) -> Iterator:
    """Ray, connected: the session this process has already (used, and left running), else
    one started or joined here and shut down on leaving. The dashboard is off, the workers'
    output stays in their logs, and Ray's temporary files go to the system temp folder (Ray's
    default, ``$RAY_TMPDIR`` or ``/tmp/ray``)."""
    ray = import_ray()
    if ray.is_initialized():
        yield ray
        return
    if address is not None:
        check_address(address)
    try:
        ray.init(
            address=address,
            include_dashboard=False,
            log_to_driver=False,
            logging_level=logging.WARNING,
        )
    except (ConnectionError, RuntimeError, TimeoutError) as err:
        where = f"at {address}" if address else "on this machine"
        raise SpecrlError(f"Ray could not start {where}: {last_line(err)}") from None
    try:
        yield ray
    finally:
        ray.shutdown()


def last_line(error) -> str:
    """The last line of an error's text: a Ray error's own message under its traceback."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__

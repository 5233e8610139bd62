"""Connecting to Ray: on this machine, or to a cluster's head at ``--address``.

Kept apart from the sweep's trials so that fleet profiling (:mod:`specrl.sweep.fleet`)
imports no training code: a GPU node with torch and transformers only runs it. Ray is
imported inside the functions (the ``[sweep]`` extra), so importing this module does not.
"""

from __future__ import annotations

import logging
import socket
import threading
from collections.abc import Iterator
from contextlib import contextmanager

from specrl.errors import SpecrlError

CONNECT_TIMEOUT_S = 10.0
"""How long ``--address`` waits for the head node to accept a connection."""
JOIN_TIMEOUT_S = 20.0
"""How long joining the cluster at ``--address`` may take once it accepted one."""
TOKEN_HELP = (
    "the cluster may want its authentication token (Ray's token auth, on by default): set "
    "RAY_AUTH_MODE=token and give the head's token in ~/.ray/auth_token or RAY_AUTH_TOKEN "
    "(https://docs.ray.io/en/latest/ray-security/token-auth.html)"
)


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
    start_ray(ray, address)
    try:
        yield ray
    finally:
        ray.shutdown()


def last_line(error) -> str:
    """The last line of an error's text: a Ray error's own message under its traceback."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return lines[-1] if lines else type(error).__name__


def start_ray(ray, address: str | None) -> bool:
    """Connect to Ray (the dashboard off, the workers' output left in their logs); False
    where this process is connected already (that session is used, and left running)."""
    if ray.is_initialized():
        return False
    settings = dict(include_dashboard=False, log_to_driver=False, logging_level=logging.WARNING)
    try:
        if address is None:
            ray.init(**settings)
        else:
            _connect(ray, address, settings)
    except (ConnectionError, RuntimeError, TimeoutError) as err:
        if _refused_token(err):
            raise SpecrlError(f"--address {address}: {TOKEN_HELP}") from None
        where = f"at {address}" if address else "on this machine"
        raise SpecrlError(f"Ray could not start {where}: {last_line(err)}") from None
    return True


def _refused_token(err: BaseException | None) -> bool:
    """Whether the cluster refused this process's authentication token (Ray's error, or one
    it raised from it)."""
    while err is not None:
        if "InvalidAuthToken" in str(err) or type(err).__name__ == "AuthenticationError":
            return True
        err = err.__cause__ or err.__context__
    return False


def _connect(ray, address: str, settings: dict) -> None:
    """``ray.init`` at ``address``, given up after :data:`JOIN_TIMEOUT_S`: at a port that
    answers but is no Ray head (the dashboard's, a web server's) Ray retries for minutes.
    In a thread, since a call into Ray cannot be interrupted; one given up is left behind."""
    outcome = {}

    def join() -> None:
        try:
            ray.init(address=address, **settings)
        except BaseException as err:  # raised again in the caller's thread
            outcome["error"] = err

    thread = threading.Thread(target=join, name="ray-connect", daemon=True)
    thread.start()
    thread.join(JOIN_TIMEOUT_S)
    if thread.is_alive():
        raise SpecrlError(
            f"--address {address}: something listens there, but no Ray head let this "
            f"process join in {JOIN_TIMEOUT_S:.0f} s. Give the head's GCS address (`ray start "
            "--head` prints it; port 6379 by default, not the dashboard's 8265); if it is, "
            f"{TOKEN_HELP}"
        )
    if "error" in outcome:
        raise outcome["error"]

"""Repository-level pytest configuration: quiet TensorFlow, make `tests` importable, and pick
what kiln's default Interpreter runs on for the whole session.

``--kiln-backend`` (default ``litert``) sets the default Interpreter's backend, so one suite
checks each: ``litert`` as installed (LiteRT's kernels for builtin partitions, kiln's
delegate for the rest), ``kiln`` as without ai-edge-litert (kiln's NumPy delegate), ``ref``
as BUILTIN_REF (kiln's reference kernels alone). A test about one
backend's own behaviour asks for it with the `litert_default` or `kiln_default` fixture.

TF Serving's default ports 127.0.0.1:8500 and 8501 are held for the whole session (as on a
machine that serves models), so a test that needs them free fails everywhere, not only there.
"""

import os
import socket
import zlib

import pytest

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")

BACKENDS = ("litert", "kiln", "ref")
_REGISTERED: list = []  # the default delegate factories kiln registers, before --kiln-backend


def pytest_addoption(parser):
    parser.addoption("--kiln-backend", choices=BACKENDS, default="litert",
                     help="what kiln's default Interpreter runs on: litert (as installed), kiln (as "
                          "without ai-edge-litert) or ref (the reference kernels, as BUILTIN_REF)")


def pytest_configure(config):
    from kiln.delegates import litert
    from kiln.runtime import delegate

    _REGISTERED[:] = delegate._DEFAULT_DELEGATES
    backend = config.getoption("--kiln-backend")
    if backend == "kiln":  # the defaults as without ai-edge-litert (LiteRtDelegate itself stays usable)
        delegate._DEFAULT_DELEGATES[:] = [f for f in _REGISTERED if f is not litert.default_litert_delegate]
    elif backend == "ref":
        delegate._DEFAULT_DELEGATES.clear()


@pytest.hookimpl(tryfirst=True)
def pytest_collection_modifyitems(config, items):
    """Sweeps too long for `make test` run a share of their cases there and the rest in the
    slow lane: a module that sets ``FAST_LANE_SHARE = n`` keeps, per test function, its first
    case and one case in n (by a stable hash of the case's id), and marks the others slow, so
    the two lanes together run the whole sweep once and every function runs in both."""
    seen = set()
    for item in items:
        share = getattr(item.module, "FAST_LANE_SHARE", None) if hasattr(item, "module") else None
        if not share:
            continue
        function = (item.module.__name__, getattr(item, "originalname", item.name))
        first = function not in seen
        seen.add(function)
        if not first and zlib.crc32(item.nodeid.encode()) % share:
            item.add_marker(pytest.mark.slow)


@pytest.fixture(scope="session")
def default_backend(request) -> str:
    """The session's ``--kiln-backend``."""
    return request.config.getoption("--kiln-backend")


def _default_delegates(monkeypatch, litert_installed: bool) -> None:
    from kiln.delegates import litert
    from kiln.runtime import delegate

    factories = [f for f in _REGISTERED if litert_installed or f is not litert.default_litert_delegate]
    monkeypatch.setattr(delegate, "_DEFAULT_DELEGATES", factories)


@pytest.fixture
def litert_default(monkeypatch):
    """kiln's default delegates as installed, whatever ``--kiln-backend`` says: LiteRT first."""
    _default_delegates(monkeypatch, True)


@pytest.fixture
def kiln_default(monkeypatch):
    """kiln's default delegates as without ai-edge-litert: the NumPy delegate alone."""
    _default_delegates(monkeypatch, False)


@pytest.fixture
def kiln_kernels(request, default_backend):
    """The default Interpreter runs kiln's own kernels: its delegates as without
    ai-edge-litert, or the reference kernels alone under ``--kiln-backend=ref``. For the
    directories that pin kiln's kernels against LiteRT (tests/ops, tests/quant)."""
    if default_backend != "ref":
        request.getfixturevalue("kiln_default")


#: TF Serving's default ports (gRPC, REST): `kiln serve`'s defaults, which no test may depend on.
TF_SERVING_PORTS = (8500, 8501)


@pytest.fixture(scope="session", autouse=True)
def tf_serving_ports_held():
    """Listen on 127.0.0.1:8500 and 8501 for the whole session (a port another process holds
    already is as good). Tests take ephemeral ports. Each xdist worker holds them with
    SO_REUSEPORT, which every socket sharing a port must set, so they stay held until the last
    worker ends and nobody else (kiln serve's check included) can bind them meanwhile."""
    held = []
    for port in TF_SERVING_PORTS:
        sock = socket.socket()
        if hasattr(socket, "SO_REUSEPORT"):
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        try:
            sock.bind(("127.0.0.1", port))
            sock.listen(1)
            held.append(sock)
        except OSError:
            sock.close()
    yield TF_SERVING_PORTS
    for sock in held:
        sock.close()

"""One memory budget per worker: the bytes of requests it holds at once, REST and gRPC alike.

REST bodies are counted by the HTTP layer as they are announced or arrive (``bodies``, on the
event loop); what a request decodes — the tensors of a large JSON body, a gRPC message and its
tensors — is claimed here before it is allocated (``held``, any thread), so a request that would
pass the budget is refused before its memory is taken: 413 / RESOURCE_EXHAUSTED when it could
never fit, 503 / UNAVAILABLE when others hold the room now. When a burst is over the worker
collects what it left and gives the freed memory back to the system (glibc's ``malloc_trim``).
"""

from __future__ import annotations

import contextvars
import ctypes
import ctypes.util
import gc
import threading
import time

from .status import TooLarge, Unavailable

#: The claim of the request being decoded on this thread: ``claim(nbytes, what)`` (None: not counted).
CLAIM: contextvars.ContextVar = contextvars.ContextVar("kiln_serve_claim", default=None)
#: Bytes freed since the last trim after which a worker returns memory to the system.
TRIM_AFTER = 16 << 20


class MemoryBudget:
    def __init__(self, limit: int):
        self.limit = limit
        self.bodies = 0  # REST bodies (the HTTP layer's, on the event loop)
        self.held = 0    # claimed tensors and gRPC messages
        self._lock = threading.Lock()
        self._freed = 0

    def claim(self, size: int, what: str, own: int = 0) -> None:
        """Count ``size`` more bytes for a request that holds ``own`` already, or refuse: `TooLarge`
        when the request could never fit (413, RESOURCE_EXHAUSTED), `Unavailable` when others hold
        the room now (503)."""
        with self._lock:
            if self.bodies + self.held + size <= self.limit:
                self.held += size
                return
            held = self.bodies + self.held
        text = (f"OOM when allocating {what} ({size} bytes) for this request: the server's memory budget for "
                f"requests is {self.limit} bytes")
        if own + size > self.limit:
            raise TooLarge(f"{text}, and the request holds {own} already")
        raise Unavailable(f"{text}, of which {held} are held now; retry later")

    def give(self, size: int, claimed: bool = True) -> None:
        """``size`` bytes freed (claimed ones, or a REST body's, which the HTTP layer counts)."""
        with self._lock:
            if claimed:
                self.held -= size
            self._freed += size
            trim = self._freed >= TRIM_AFTER and not self.held
            if trim:
                self._freed = 0
        if trim:
            threading.Thread(target=_trim, daemon=True, name="kiln-trim").start()

    def ticket(self, own: int = 0) -> "Ticket":
        """A request's claims; ``own``: what it holds already (its body)."""
        return Ticket(self, own)


class Ticket:
    """What one request claimed; `close` gives it back."""

    __slots__ = ("budget", "size", "own")

    def __init__(self, budget: MemoryBudget, own: int):
        self.budget, self.size, self.own = budget, 0, own

    def claim(self, size: int, what: str) -> None:
        self.budget.claim(size, what, self.own + self.size)
        self.size += size

    def close(self) -> None:
        size, self.size = self.size, 0
        if size:
            self.budget.give(size)


def _libc():
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6")
        return libc if hasattr(libc, "malloc_trim") and hasattr(libc, "mallopt") else None
    except OSError:  # pragma: no cover - not glibc
        return None


_LIBC = _libc()


def return_large_allocations() -> None:
    """Call once per worker: allocations of 1 MiB or more always get pages of their own from the
    system and give them back when freed (glibc otherwise raises that threshold after each large
    free, up to 32 MiB, and keeps what big requests freed)."""
    if _LIBC is not None:
        _LIBC.mallopt(-3, 1 << 20)  # M_MMAP_THRESHOLD


def _trim() -> None:
    """After a burst: collect the cycles big requests left (a runner dropped after a big request keeps
    its interpreters, sized for it, until the collector frees their cycles), then give freed heap
    pages back. A moment later, and again twice: the last request's runner is dropped just after it
    is answered, and a large answer is freed once the client has read it."""
    for pause in (0.2, 1.0, 3.0):
        time.sleep(pause)
        gc.collect()
        if _LIBC is not None:
            _LIBC.malloc_trim(0)

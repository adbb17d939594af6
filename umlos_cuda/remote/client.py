"""The object-store client: one store per bucket, and objects read by byte ranges under a stated retry budget.

What goes in: an :class:`~.urls.ObjectUrl`, a key, byte ranges, a :class:`RetryBudget`. What comes out: a
client store (obstore's, the bindings of Rust's ``object_store``: s3://, gs://, az:// and file:// through one
library; chosen by bench/bench_object_clients.py), :class:`RemoteObject` handles whose ETag and size were
recorded when they were opened, and the bytes of their ranges.

Credentials come from the client library's standard chain (``AWS_*`` variables, instance metadata, ...;
``GOOGLE_*``, ``AZURE_*``): nothing here reads, prints or records them, and a message names an object by
its URL only.

The rules:

* **Every ranged GET is checked against what was recorded.** The request carries ``If-Match`` with the ETag
  seen when the object was opened, and the reply's ETag and object size are compared with it too (a store that
  ignores ``If-Match`` is still caught); the bytes must be exactly the range asked for. A changed object is
  REMOTE_OBJECT_CHANGED at once, never retried and never cached.
* **Retries are this module's, with a stated budget.** The client library's own retries are off
  (``max_retries`` 0), so what is retried, how often and how long is :class:`RetryBudget`'s: timeouts, 5xx
  replies (503 SlowDown included), connection resets and short bodies are tried ``attempts`` times in all,
  with exponential backoff and jitter between tries, each try under ``timeout_s``; then REMOTE_REQUEST_FAILED
  names the object, the attempts and the last error. A refusal (403, bad credentials) is not retried.
* **A missing object is FileNotFoundError**, as files/reader.py lets it through: what it means is the
  caller's to say (no token store there; a store missing one of its files).
"""

from __future__ import annotations

import os
import random
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, TypeVar

from .. import checks, errors
from ..errors import UmlosError
from .urls import ObjectUrl

T = TypeVar("T")


def remote_error(code: str, message: str) -> UmlosError:
    return UmlosError(code, message, operator=errors.REMOTE_OPERATOR)


def _budget_error(message: str) -> UmlosError:
    return remote_error(errors.INVALID_ARGUMENT, message)


@dataclass(frozen=True)
class RetryBudget:
    """How a request is retried: ``attempts`` tries in all (the first included), ``first_delay_s`` before the
    second, doubling up to ``max_delay_s`` (each delay drawn in ``[d/2, d]``: jitter, so that ranks that failed
    together do not retry together), each try under ``timeout_s``. The default tries 6 times over at most
    0.2 + 0.4 + 0.8 + 1.6 + 3.2 = 6.2 s of waiting, each try 30 s at most."""

    attempts: int = 6
    first_delay_s: float = 0.2
    max_delay_s: float = 5.0
    timeout_s: float = 30.0

    def __post_init__(self) -> None:
        checks.integer(self.attempts, "RetryBudget attempts", 1, 100, fail=_budget_error)
        for name in ("first_delay_s", "max_delay_s", "timeout_s"):
            checks.number(getattr(self, name), f"RetryBudget {name}", at_least=0, below=3601, fail=_budget_error,
                          message="{name} must be a number of seconds in [0, 3600], got {value!r}")

    def delay(self, failures: int) -> float:
        """The wait after the ``failures``-th failed try (1 for the first)."""
        ceiling = min(self.max_delay_s, self.first_delay_s * 2 ** (failures - 1))
        return ceiling * (0.5 + 0.5 * random.random())


#: The prefix of each scheme's standard environment variables.
_ENV_PREFIX = {"s3": "AWS", "gs": "GOOGLE", "az": "AZURE", "abfs": "AZURE"}
_stores: dict[tuple[str, float], Any] = {}
_stores_lock = threading.Lock()


def client_store(url: ObjectUrl, budget: RetryBudget) -> Any:
    """The client library's store of ``url``'s bucket (one per bucket and timeout, shared by the threads of
    a process), configured from the standard environment; REMOTE_UNAVAILABLE without obstore, or for a URL or
    configuration it refuses."""
    key = (url.root(), float(budget.timeout_s))
    with _stores_lock:
        store = _stores.get(key)
        if store is None:
            store = _stores[key] = _open_store(url, budget)
    return store


def _open_store(url: ObjectUrl, budget: RetryBudget) -> Any:
    try:
        from obstore.store import from_url
    except ImportError:
        raise remote_error(errors.REMOTE_UNAVAILABLE, f"reading {url} needs the obstore package: "
                           "pip install 'umlos-cuda[remote]'") from None
    options: dict[str, Any] = {"retry_config": {"max_retries": 0}}
    if url.scheme != "file":
        timeout = timedelta(seconds=budget.timeout_s)
        client: dict[str, Any] = {"timeout": timeout, "connect_timeout": timeout}
        # Given client options replace those the library reads from the environment, of which only this one
        # applies here: plain HTTP (a local S3-compatible server), which the standard variable allows.
        if os.environ.get(f"{_ENV_PREFIX[url.scheme]}_ALLOW_HTTP", "").lower() in ("1", "true"):
            client["allow_http"] = True
        options["client_options"] = client
    try:
        return from_url(url.root(), **options)
    except Exception as exc:  # obstore raises its own types (and ValueError) for a URL or setting it refuses
        raise remote_error(errors.REMOTE_UNAVAILABLE, f"cannot open {url}: {_one_line(exc)}") from None


@dataclass(frozen=True)
class ObjectInfo:
    """What :meth:`RemoteObject.open` recorded: the object's size and ETag (None where the store has none)."""

    size: int
    etag: str | None


class RemoteObject:
    """One object, its size and ETag recorded when opened (:meth:`open`), read by byte ranges (module
    docstring). ``name`` is its URL; ``on_fetch(nbytes)``, when set, is told every body received."""

    def __init__(self, url: ObjectUrl, key: str, info: ObjectInfo, budget: RetryBudget) -> None:
        self.url, self.key, self.info, self.budget = url, key, info, budget
        self.name = url.name(key)
        self._store = client_store(url, budget)

    @classmethod
    def open(cls, url: ObjectUrl, key: str, budget: RetryBudget) -> RemoteObject:
        """The object ``key`` of ``url``'s bucket, its size and ETag read now (a HEAD under the budget);
        FileNotFoundError when there is none."""
        import obstore

        store = client_store(url, budget)
        meta = retrying(lambda: obstore.head(store, key), url.name(key), budget)
        return cls(url, key, ObjectInfo(int(meta["size"]), meta.get("e_tag")), budget)

    @property
    def size(self) -> int:
        return self.info.size

    def read(self, start: int, stop: int) -> bytes:
        """Bytes ``[start, stop)`` of the object, checked against what was recorded (module docstring)."""
        if not 0 <= start <= stop <= self.size:
            raise remote_error(errors.INVALID_ARGUMENT, f"bytes [{start}, {stop}) are not inside {self.name}, "
                               f"which holds {self.size:,}")
        if start == stop:
            return b""
        return retrying(lambda: self._get(start, stop), self.name, self.budget)

    def _get(self, start: int, stop: int) -> bytes:
        import obstore

        options: dict[str, Any] = {"range": (start, stop)}
        if self.info.etag is not None:
            options["if_match"] = self.info.etag
        result = obstore.get(self._store, self.key, options=options)
        meta = result.meta
        if int(meta["size"]) != self.size or (self.info.etag is not None and meta.get("e_tag") != self.info.etag):
            raise self.changed(f"it is {int(meta['size']):,} bytes with ETag {meta.get('e_tag')}")
        data = bytes(result.bytes())
        if len(data) != stop - start:
            raise _Transient(f"{len(data):,} bytes came for the {stop - start:,} of bytes [{start}, {stop})")
        return data

    def changed(self, now: str) -> UmlosError:
        """REMOTE_OBJECT_CHANGED for this object, ``now`` saying what it is now."""
        return remote_error(errors.REMOTE_OBJECT_CHANGED, f"{self.name} changed since it was opened (it was "
                            f"{self.size:,} bytes with ETag {self.info.etag}; {now}): it was rewritten in place, "
                            "and nothing of it was cached; open the store again to read what it holds now")


class _Transient(Exception):
    """A try that may succeed if made again (a short body)."""


def retrying(call: Callable[[], T], name: str, budget: RetryBudget, *, verb: str = "reading") -> T:
    """``call()`` under ``budget`` (module docstring): its value, FileNotFoundError for a missing object,
    REMOTE_OBJECT_CHANGED for a failed ``If-Match``, REMOTE_REQUEST_FAILED for a refusal or once the budget is
    spent (``verb`` says what the request was doing: reading, writing, removing). Only idempotent requests are
    retried here (GET, HEAD, a whole PUT, DELETE)."""
    import obstore.exceptions as failures

    for attempt in range(1, budget.attempts + 1):
        try:
            return call()
        except UmlosError:
            raise
        except (failures.NotFoundError, FileNotFoundError):  # obstore raises the built-in one for a 404
            raise FileNotFoundError(name) from None
        except failures.PreconditionError:
            raise remote_error(errors.REMOTE_OBJECT_CHANGED, f"{name} changed since it was opened (its ETag no "
                               "longer matches): it was rewritten in place, and nothing of it was cached; open the "
                               "store again to read what it holds now") from None
        except (failures.PermissionDeniedError, failures.UnauthenticatedError) as exc:
            raise remote_error(errors.REMOTE_REQUEST_FAILED, f"the object store refused {name}: {_one_line(exc)}; "
                               "check the credentials the client finds (its standard chain) and the bucket's "
                               "permissions") from None
        except (failures.BaseError, _Transient, OSError, TimeoutError) as exc:
            if attempt == budget.attempts:
                raise remote_error(errors.REMOTE_REQUEST_FAILED, f"{verb} {name} failed {attempt} times (a budget "
                                   f"of {budget.attempts} tries, each under {budget.timeout_s:g} s); the last: "
                                   f"{_one_line(exc)}; the store is unreachable, throttling or failing: try again "
                                   "later, or give a larger RetryBudget") from None
            time.sleep(budget.delay(attempt))
    raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises


def list_objects(url: ObjectUrl, below: str, name: str, budget: RetryBudget, *, most: int | None = None,
                 bad_key: Callable[[str], UmlosError] | None = None) -> list[tuple[str, ObjectInfo]]:
    """``(key, info)`` of every object of ``url``'s bucket whose key starts with ``below`` (every object when it is
    empty), listed under ``budget`` as ``name`` (a listing cut off by a failure starts again); with ``most``, the
    listing stops at ``most + 1`` objects (one more says there are more than ``most``). ``bad_key(message)``: the
    error for a key the client will not name (an empty or '..' part), raised at once, never retried; without
    it, such a listing fails as any other does."""
    import obstore
    from obstore.exceptions import InvalidPathError

    store = client_store(url, budget)
    found: list[tuple[str, ObjectInfo]] = []

    def listed() -> None:
        found.clear()
        try:
            for chunk in obstore.list(store, prefix=below or None, chunk_size=1000):
                for meta in chunk:
                    found.append((meta["path"], ObjectInfo(int(meta["size"]), meta.get("e_tag"))))
                    if most is not None and len(found) > most:
                        return
        except InvalidPathError as exc:
            if bad_key is None:
                raise
            raise bad_key(" ".join(str(exc).split())[:300]) from None

    retrying(listed, name, budget, verb="listing")
    return found


def _one_line(exc: BaseException) -> str:
    text = " ".join(str(exc).split()) or type(exc).__name__
    return text if len(text) <= 300 else text[:300] + " ..."

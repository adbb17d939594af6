"""Run a ``torch.distributed`` program so that no rank can abort at exit.

Why this exists (measured with torch 2.13 CPU and gloo; docs/integrations.md,
"Shutting down"): a gloo process group runs worker threads
(``pt_gloo_runloop``) that finish each collective's work object *after* the
caller's ``wait()`` has returned. That object's thread-local state holds a
Python object, so releasing it takes the GIL. If the main thread has already
begun interpreter finalization, CPython ends the worker with
``pthread_exit``; the unwind crosses a ``noexcept`` C++ destructor and the
process dies with ``terminate called without an active exception``
(SIGABRT), and torchrun reports the run as failed although the work was done.

``destroy_process_group()`` avoids this only when it drops the last reference
to the gloo backend, whose destructor joins the worker threads. It does not
when a ``DistributedDataParallel`` model was built: the process group then
stays alive (its threads are still there after ``destroy_process_group()``
and ``gc.collect()``) until the interpreter is torn down, and the race stays.

So :func:`run_distributed` ends every rank the same way: all ranks meet at a
barrier (nobody leaves while a peer still communicates), the process group is
destroyed, the ``atexit`` handlers run and the standard streams are flushed,
and the process ends with ``os._exit``, which never finalizes the
interpreter, so no worker thread can be caught by it.
"""

from __future__ import annotations

import atexit
import contextlib
import os
import sys
import traceback
from collections.abc import Callable
from datetime import timedelta
from typing import Any, NoReturn


def run_distributed(
    main: Callable[[], Any],
    *,
    backend: str = "gloo",
    timeout: timedelta | None = None,
    **init_kwargs: Any,
) -> NoReturn:
    """Initialise the process group, call ``main()``, shut down cleanly and exit.

    Use it as the entry point of a script started by ``torchrun`` (or any
    launcher that sets ``RANK``, ``WORLD_SIZE``, ``MASTER_ADDR`` and
    ``MASTER_PORT``)::

        def main():
            model = DistributedDataParallel(...)
            ...

        if __name__ == "__main__":
            run_distributed(main)

    ``main()`` returns ``None`` or an exit code (an ``int``; ``sys.exit(...)``
    inside it works too). On success every rank meets at a barrier, the process
    group is destroyed, and the process exits with that code. If ``main()``
    raises, the traceback is printed and the rank exits with status 1 without
    the barrier (its peers may be waiting in a collective that will not come;
    the launcher stops them). Either way the process ends with ``os._exit``
    after running the ``atexit`` handlers and flushing stdout and stderr: see
    the module docstring for why interpreter finalization must not run.

    Args:
        main: the program; it runs after ``init_process_group``.
        backend: ``init_process_group``'s backend (``"gloo"`` on CPU).
        timeout: the process group's timeout for collectives (and the final
            barrier); ``None`` keeps PyTorch's default.
        init_kwargs: passed on to ``torch.distributed.init_process_group``.
    """
    import torch.distributed as dist

    if timeout is not None:
        init_kwargs["timeout"] = timeout
    dist.init_process_group(backend, **init_kwargs)
    code = _call(main)
    if code == 0:
        code = _call(_shutdown)
    _exit(code)


def _shutdown() -> None:
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()


def _call(function: Callable[[], Any]) -> int:
    """``function()``'s exit status: its return value (None is 0), a
    ``SystemExit``'s code, or 1 after printing the traceback of any other exception."""
    try:
        return _status(function())
    except SystemExit as exc:
        if exc.code is not None and not isinstance(exc.code, int):
            print(exc.code, file=sys.stderr)
        return _status(exc.code)
    except BaseException:  # every failure becomes an exit status
        traceback.print_exc()
        return 1


def _status(value: Any) -> int:
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int):
        return 1
    return value & 0xFF


def _exit(code: int) -> NoReturn:
    """Run the ``atexit`` handlers, flush stdout and stderr, and end the process
    without interpreter finalization."""
    try:
        atexit._run_exitfuncs()  # what interpreter shutdown would have run first
    except BaseException:  # a failing handler must not keep the process alive
        traceback.print_exc()
        code = code or 1
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(OSError, ValueError, AttributeError):
            stream.flush()
    os._exit(code)

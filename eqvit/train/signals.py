"""Stop signals during training: SIGINT (Ctrl-C), SIGTERM and SIGHUP all stop a run the same way.

Batch schedulers, ``timeout``, systemd and torchrun stop a job with SIGTERM; a closed terminal sends
SIGHUP. Inside :func:`stop_signals` each of them raises :class:`Interrupted` (a ``KeyboardInterrupt``)
at the next Python instruction, so the engine saves a checkpoint exactly as it does on Ctrl-C, and
the CLI exits with the shell's code for that signal (128 + its number: 130, 143, 129).

:func:`shielded` holds signals back during work that must not be cut in half (an optimiser update,
a checkpoint write): a signal that arrives inside is raised when the block ends, or dropped with
``drop=True`` (the save that answers a first signal is not interrupted by a second one).
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class Interrupted(KeyboardInterrupt):
    """A stop signal arrived; ``signum`` says which, ``exit_code`` is the shell's 128 + signum.

    ``checkpoint`` is the file the engine wrote in answer (``None`` when none was written).
    """

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = int(signum)
        self.checkpoint: str | None = None

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_code(self) -> int:
        return 128 + self.signum


class _State:
    installed = False  # inside stop_signals
    stopping = False  # an Interrupted was raised: the run is stopping, later signals are dropped
    shield = 0  # nesting depth of shielded
    pending: int | None = None  # a signal that arrived inside a shield


def _handler(signum: int, frame) -> None:
    if _State.stopping:
        return  # the first signal's checkpoint is being written: a second one does not cut it short
    if _State.shield:
        if _State.pending is None:
            _State.pending = signum
        return
    _State.stopping = True
    raise Interrupted(signum)


def _main_thread() -> bool:
    return threading.current_thread() is threading.main_thread()


@contextlib.contextmanager
def stop_signals(exit_after: bool = False) -> Iterator[None]:
    """Turn SIGINT, SIGTERM and SIGHUP into :class:`Interrupted` inside the block (main thread only;
    elsewhere, and for a signal the process ignores, nothing changes). Re-entrant.

    The previous handlers come back when the block ends; with ``exit_after`` (the process exits after the
    block) a block that ends after a stop signal leaves the three ignored instead, so that a second
    signal cannot turn the orderly exit into a death by signal.
    """
    if not _main_thread() or _State.installed:
        yield
        return
    previous = {}
    for signum in STOP_SIGNALS:
        # a job started with nohup or in the background ignores SIGHUP / SIGINT on purpose: keep that
        if signal.getsignal(signum) is not signal.SIG_IGN:
            previous[signum] = signal.signal(signum, _handler)
    _State.installed = True
    try:
        yield
    finally:
        stopped = _State.stopping
        _State.installed, _State.stopping, _State.pending = False, False, None
        for signum, handler in previous.items():
            signal.signal(signum, signal.SIG_IGN if stopped and exit_after else handler)


@contextlib.contextmanager
def shielded(drop: bool = False) -> Iterator[None]:
    """Hold stop signals back inside the block; one that arrived is raised as :class:`Interrupted` when the
    block ends normally (``drop``: forgotten instead). Works only inside :func:`stop_signals`."""
    _State.shield += 1
    try:
        yield
    except BaseException:
        _State.shield -= 1
        if _State.shield == 0:
            _State.pending = None  # the error stops the run; the held signal would only hide it
        raise
    _State.shield -= 1
    if _State.shield == 0 and _State.pending is not None:
        signum, _State.pending = _State.pending, None
        if not drop:
            _State.stopping = True
            raise Interrupted(signum)

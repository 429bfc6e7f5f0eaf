"""The suite's Python processes collect cyclic garbage less often: a rank of a test job takes about 30% less CPU.

``conftest.py`` puts this folder first on ``PYTHONPATH`` for the whole run, so every Python the tests start (a rank
under ``mpirun``, ``mpiexec`` or ``srun``, an import-order scenario, a CLI call, an xdist worker) imports this module
at startup (``site`` imports ``sitecustomize`` from ``sys.path``). A rank importing torch and Lightning spends about
a third of its CPU in the cyclic garbage collector: full collections while the heap grows during the imports, and one
more over the whole module graph at exit (``benchmarks/lean_interpreter.py``; figures in docs/benchmarks.md).
On the suite's 2-core machine, with the real jobs' ranks side by side, that CPU is the suite's time.

What changes, and only in the tests' processes: the first generation is collected every 100,000 allocations instead
of 700 (memory is reclaimed by reference counting as always; cycles wait a little longer), and the objects still alive
at exit are frozen once every ``atexit`` handler of the program has run, so finalization does not traverse them (their
memory goes back with the process, as after ``os._exit``; Python never promised ``__del__`` for objects alive at exit).
Nothing the tests assert depends on either. Run the suite with ``LMPI_TEST_PLAIN_GC=1`` to leave this module out.

Below Python 3.12 it also works around a CPython bug (gh-112275) that hangs the tests' data loader workers now and
then: a child forked while another thread holds the interpreter's thread-state lock waits on it forever, and gloo's
threads take that lock, without the GIL, each time they make a thread state (as they let go of a collective's
tensors). Taking and releasing the lock just before each fork (``sys._current_frames()`` does) waits out a thread
caught inside; another may still take it in the microseconds before the fork, so the hang becomes rarer, not
impossible. Users get the fix from docs/troubleshooting.md instead: this module is the suite's alone.

A ``sitecustomize`` found later on ``sys.path`` (a distribution's own) still runs, after this one.
"""

import atexit
import gc
import importlib.machinery
import importlib.util
import os
import sys

gc.set_threshold(100_000, 50, 100)
atexit.register(gc.freeze)  # registered first, so it runs last: after every handler the program registers
if sys.version_info < (3, 12):
    os.register_at_fork(before=sys._current_frames)  # registered first, so it runs last: the nearest to the fork


def _run_the_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    rest = [entry for entry in sys.path if os.path.abspath(entry or os.curdir) != here]
    spec = importlib.machinery.PathFinder.find_spec(__name__, rest)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)


_run_the_next_sitecustomize()

"""mpviz.multiprocessing: a drop-in for ``multiprocessing`` that shares tensors, like torch's.

Everything of the stdlib module is here under the same names. What mpviz adds or changes:

* tensors and storages travel as shared-memory handles through every channel multiprocessing
  pickles on (:mod:`~mpviz.multiprocessing.reductions`);
* ``Queue.put`` shares the tensor before it returns (:mod:`~mpviz.multiprocessing.queues`);
  it and ``Pipe``'s ``send`` say what a pickling error means (``_codec.explain_pickling_error``);
* an ``Event`` whose ``set()`` does not hang when a waiter was killed inside ``wait()``
  (:mod:`~mpviz.multiprocessing.synchronize`);
* ``Process``/``Pool`` refuse, before starting, functions a spawned child could not import
  (:mod:`~mpviz.multiprocessing.checks`);
* torch's ``spawn``/``start_processes`` with error propagation (:mod:`~mpviz.multiprocessing.spawn`);
* the sharing strategies (``get_all_sharing_strategies``, ``get_sharing_strategy``,
  ``set_sharing_strategy``), and ``set_shm_manager(False)`` to watch ``file_system`` leak.
"""
import multiprocessing as _stdlib
from multiprocessing import *  # noqa: F401,F403 - the drop-in promise

from ..sharing import get_all_sharing_strategies, get_sharing_strategy, set_sharing_strategy
from ..sharing.shm_manager import enable as set_shm_manager
from .checks import MissingMainGuardError, UnpicklableFunctionError
from .context import DefaultContext, PendingTasksWarning, Process, default_context as _default
from .spawn import (ProcessContext, ProcessException, ProcessExitedException, ProcessRaisedException,
                    SpawnContext, spawn, start_processes)

__all__ = list(_stdlib.__all__) + [
    "get_all_sharing_strategies", "get_sharing_strategy", "set_sharing_strategy", "set_shm_manager",
    "UnpicklableFunctionError", "MissingMainGuardError", "PendingTasksWarning",
    "spawn", "start_processes", "ProcessContext", "SpawnContext", "ProcessException",
    "ProcessRaisedException", "ProcessExitedException",
]

# The factories, bound to mpviz's default context (which shares the stdlib's start method).
Queue = _default.Queue
JoinableQueue = _default.JoinableQueue
Pool = _default.Pool
Pipe = _default.Pipe
Event = _default.Event
get_context = _default.get_context
get_start_method = _default.get_start_method
set_start_method = _default.set_start_method

# Tensors and storages travel as handles through multiprocessing's pickler: .reductions registers
# the reducers (init_reductions), loaded by the first tensor sent (storage.reduce_on_first_send),
# not here, so that spawned children which never send a tensor start without NumPy.

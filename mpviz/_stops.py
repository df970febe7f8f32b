"""The slot the stepper plugs into: ``pause``, None until this process is stepped.

Each operation a learner can step through calls, just before it runs::

    if _stops.pause: _stops.pause("lock.acquire", lid)

(the recorder's hooks in hooks.py, locks.py and messages.py; mpviz's own Queue in
multiprocessing/queues.py; mapping a received storage in multiprocessing/reductions.py). While
nothing is stepped that line costs one attribute read. ``mpviz/stepper/gate.py`` fills the slot
when it steps a process (``gate.activate``), and a spawned child of a stepped run asks for it
through autostart's ``ON_BOOT``. So the arrow points one way: the stepper imports this module,
and nothing that it stops imports the stepper (tests/test_module_knots.py checks it). A leaf of
its own, neither recorder nor stepper. mpviz's Queue passes itself, not an id (its id is
computed only while recording): the stepper names it (``stepper.patches.object_id``).
"""
pause = None        # None, or gate._pause(op, obj=None, **info): wait for the learner's "go"

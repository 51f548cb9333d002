"""Python's cyclic garbage collector around what a doit process keeps until it ends: the graph and doit's tasks.

An up-to-date build at 200 recipes makes about a million objects that live until the process ends, and 100 of garbage.
The collector ran while they were made: a young collection every 700 allocations and a full one each time the heap
had grown by a quarter, each traversing everything made so far: 40% of that build's time. It is paused while the
graph is planned; what exists once doit has loaded the tasks is frozen (gc.freeze), left out of later collections;
whatever is made after that is collected as usual.
"""

import contextlib
import gc


@contextlib.contextmanager
def making_long_lived():
    """Collection paused while the body makes objects the process keeps; they are frozen after it."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        keep_all()
        if was_enabled:
            gc.enable()


def keep_all():
    """Everything that exists now is kept until the process ends (or release()): no collection traverses it again."""
    gc.freeze()


def release():
    """What keep_all() froze is collected again: a process that plans again (tune's rounds) drops its old graph."""
    gc.unfreeze()

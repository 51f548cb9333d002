"""The kernel's high-water mark of resident memory (Linux's VmHWM), reset where a piece of work starts: what that
work held resident, without what the process held before it. Imports nothing heavy: the stage worker asks it
around every stage."""

import contextlib
import resource


def reset():
    with contextlib.suppress(OSError), open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")  # Linux: the high-water mark becomes the current RSS


def mb():
    """This process's peak since the last reset(), in MB."""
    try:
        with open("/proc/self/status") as status:
            return next(int(line.split()[1]) for line in status if line.startswith("VmHWM:")) / 1024
    except (OSError, StopIteration):  # not Linux: the process's maximum, which may include its parent's
        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


@contextlib.contextmanager
def measured():
    """{"peak_rss_mb": ...} filled as the block ends: this process's peak in it, or a process it started and waited
    for in it (onnxruntime-genai's builder, a first run) where that one's peak was higher than any such process's
    before."""
    reset()
    children = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    found = {}
    try:
        yield found
    finally:
        grown = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
        found["peak_rss_mb"] = round(max(mb(), grown / 1024 if grown > children else 0), 1)

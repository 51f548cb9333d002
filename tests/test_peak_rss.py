"""worker/peak_rss.py: a stage's peak resident memory, its own or a process it waited for."""

import subprocess
import sys

from mobilebuild.worker import peak_rss


def test_the_peak_is_the_blocks_own_not_what_the_process_held_before():
    held = bytearray(200 * 2**20)
    held[::4096] = b"x" * len(held[::4096])  # resident
    del held
    with peak_rss.measured() as small:
        pass
    with peak_rss.measured() as large:
        block = bytearray(100 * 2**20)
        block[::4096] = b"x" * len(block[::4096])
        del block
    assert large["peak_rss_mb"] > small["peak_rss_mb"] + 80


def test_a_process_the_block_waited_for_counts_when_it_held_more():
    grow = "b = bytearray(300 * 2**20); b[::4096] = b'x' * len(b[::4096])"
    with peak_rss.measured() as found:
        subprocess.run([sys.executable, "-c", grow], check=True)
    assert found["peak_rss_mb"] > 300

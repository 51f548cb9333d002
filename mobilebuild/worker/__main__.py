"""`python -m mobilebuild.worker FD`: a stage worker serving the build that started it (build/worker_pool.py)."""

import sys

from mobilebuild.worker.serve import exit_now, serve

serve(int(sys.argv[1]))
exit_now()

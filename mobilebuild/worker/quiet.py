"""Silencing the libraries a stage drives. ExecuTorch, coremltools, torch.export and torch.onnx talk a lot (root-logger
lines, progress bars, printed graphs, deprecation warnings); users read our one-line messages and findings instead.
Failures still raise: only what is logged, warned and printed goes."""

import contextlib
import io
import logging
import warnings as _warnings


@contextlib.contextmanager
def quiet(logs=logging.CRITICAL, warnings=True, output=True):
    """`logs`: logging is disabled at this level and below (None: left alone); `warnings`: warnings are ignored;
    `output`: what is printed to stdout and stderr is swallowed."""
    previous = logging.root.manager.disable
    if logs is not None:
        logging.disable(logs)
    try:
        with contextlib.ExitStack() as silenced:
            if warnings:
                silenced.enter_context(_warnings.catch_warnings())
                _warnings.simplefilter("ignore")
            if output:
                silenced.enter_context(contextlib.redirect_stdout(io.StringIO()))
                silenced.enter_context(contextlib.redirect_stderr(io.StringIO()))
            yield
    finally:
        if logs is not None:
            logging.disable(previous)

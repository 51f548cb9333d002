"""Run `doit` here: builds every recipe under recipes/ into artifacts/. The tasks live in mobilebuild.tasks."""

from mobilebuild.tasks import *  # noqa: F401,F403

"""The doit process's graph is planned with the cyclic collector paused, then frozen out of later collections."""

import gc

from conftest import tiny_recipe

from mobilebuild import tasks
from mobilebuild.engine import collector


def test_a_planned_graph_is_frozen_and_collection_goes_on(project):
    project.write_recipe(tiny_recipe())
    tasks.plan_again()
    try:
        nodes, invalid = tasks.project_graph(str(project.root))
        assert nodes and not invalid
        assert gc.isenabled()
        assert gc.get_freeze_count() > 0
    finally:
        tasks.plan_again()
    assert gc.get_freeze_count() == 0


def test_pausing_keeps_a_disabled_collector_disabled():
    gc.disable()
    try:
        with collector.making_long_lived():
            assert not gc.isenabled()
        assert not gc.isenabled()
    finally:
        gc.enable()
        collector.release()

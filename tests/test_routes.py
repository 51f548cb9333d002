"""A route is the single registry entry for a target: a project adds a backend with one route, one stage (its contract
and module) and one runtime module, all in its own files, and every part of the build follows (the recipe grammar,
the task group, the chain, verification, the benchmark, the manifest, the graph's colours)."""

import json
import subprocess
import sys
import textwrap

import pytest
from conftest import tiny_recipe

from mobilebuild.plan import routes, stages

# The toy backend ships the fused model, or its eager int8 quantization, as traced TorchScript loaded by
# torch.jit.load: a real stage and a real runtime. Its route brings a per-layer diagnosis, a pre-flight check and a
# report family of its own, all from the project's dodo.py.
TOY_STAGE = textwrap.dedent('''
    from dataclasses import dataclass


    @dataclass(frozen=True)
    class ToyConfig:
        inputs: list
        note: str
        model: dict  # a stage that takes the fused model rebuilds it from the model source and fusion
        fuse: object
        precision: str = "fp32"
        engine: str | None = None  # int8: the quantize stage's engine and how it quantized
        quantization: dict | None = None
        mode: str = "trace"


    def plan(chain):
        """The toy stage's node in a target's chain: after the fused (and, for int8, quantized) model."""
        int8 = chain.precision == "int8"
        config = ToyConfig(inputs=chain.recipe.inputs, note=chain.settings.get("note", "plain"), model=chain.source,
                           fuse=chain.recipe.fuse, precision=chain.precision,
                           engine=chain.route.engine if int8 else None, quantization=chain.quantization)
        return chain.shipped("toy", config, chain.model_inputs(), files=chain.source_files)


    def run(inputs, config, output):
        from mobilebuild.routes.torchscript.worker import script

        print(f"   toy note: {config.note}")
        script.run(inputs, config, output)
''')

TOY_RUNTIME = textwrap.dedent('''
    import torch


    def load(path, config):
        if config.engine:
            torch.backends.quantized.engine = config.engine
        return torch.jit.load(str(path), map_location="cpu")


    def inspect(path, config):
        return {"loaded_by": "toyruntime"}
''')

TOY_DODO = textwrap.dedent('''
    from mobilebuild.plan import stages
    from mobilebuild.plan.routes import Checks, Int8, Route, Runtime, Section, register
    from mobilebuild.routes.torchscript.plan import eager_layers  # the quantize stage's model, layer by layer
    from toystage import ToyConfig, plan


    def toy_check(check):
        check.add("advice", f"the toy runtime greets {check.target.id}", "toy")


    stages.register(stages.Stage("toy", ToyConfig, {"model": ("fuse",), "quantized": ("quantize",)},
                                 "The toy backend's TorchScript files.", "#123456", module="toystage", plan=plan))
    register(Route("toy", "toyrt", ("fp32", "int8"), ("toy",), ".toy", "a toy backend",
                   Runtime("toyrt", "Toy Runtime", module="toyruntime",
                           structure=lambda facts: f"loaded by {facts.get('loaded_by')}"),
                   int8=Int8("eager", engine="qnnpack", observers=("histogram", "minmax")), section=Section("toy"),
                   default=True, checks=Checks(preflight=toy_check, layers=eager_layers)))

    from mobilebuild.tasks import *  # noqa: E402,F401,F403
''')


@pytest.fixture
def toy_project(project):
    (project.root / "toystage.py").write_text(TOY_STAGE)
    (project.root / "toyruntime.py").write_text(TOY_RUNTIME)
    (project.root / "dodo.py").write_text(TOY_DODO)
    # the `doit graph` command, as a repository of models registers it (docs/commands.md)
    plugins = '[tool.doit.plugins.command]\ngraph = "mobilebuild.engine.commands:Graph"\n'
    (project.root / "pyproject.toml").write_text(plugins)
    project.write_recipe(tiny_recipe(targets=[{"backend": "xnnpack"}, {"backend": "toy", "toy": {"note": "hello"}},
                                              {"backend": "toy", "precision": "int8", "name": "toy-int8"}]))
    return project


def mobilebuild(project, *args):
    return subprocess.run([sys.executable, "-m", "mobilebuild.cli", *args], cwd=project.root, capture_output=True,
                          text=True, timeout=900)


@pytest.mark.slow
def test_a_route_added_by_a_project_builds_verifies_and_benchmarks(toy_project):
    listing = toy_project.run("list", "--all")
    assert "toy:tiny-toy" in listing.stdout, listing.stderr
    built = toy_project.run()
    assert built.returncode == 0, built.stdout + built.stderr
    assert "toy note: hello" in built.stdout
    assert toy_project.artifact("tiny/tiny-toy.toy").is_file()

    verification = json.loads(toy_project.artifact("tiny/verify-toy.json").read_text())
    assert verification["status"] == "passed", verification
    assert verification["metrics"]["sqnr_db"] > 40
    assert verification["artifact"] == {"loaded_by": "toyruntime"}
    benchmark = json.loads(toy_project.artifact("tiny/bench-toy.json").read_text())
    assert benchmark["status"] == "ran" and benchmark["runtime"] == "toyrt"

    manifest = json.loads(toy_project.artifact("tiny/manifest.json").read_text())
    toy = next(target for target in manifest["targets"] if target["target"] == "toy")
    assert (toy["backend"], toy["runtime"], toy["status"]) == ("toy", "toyrt", "passed")
    assert "loaded by toyruntime" in toy_project.artifact("report.md").read_text()

    graphed = toy_project.run("graph", "-o", "graph.dot")
    assert graphed.returncode == 0, graphed.stderr
    assert '"toy:tiny-toy" [fillcolor="#123456"]' in (toy_project.root / "graph.dot").read_text()
    assert toy_project.doit() == []  # up to date: nothing runs again

    # its own per-layer diagnosis, report family, pre-flight check and tuning, with the package untouched
    layers = json.loads(toy_project.artifact("tiny/layers-toy-int8.json").read_text())
    assert layers["method"] in ("eager", "fx") and layers["layers"], layers
    report = toy_project.artifact("report.md").read_text()
    assert "Toy Runtime" in report
    checked = mobilebuild(toy_project, "check", "recipes/tiny.yaml", "--json")
    assert checked.returncode == 0, checked.stdout + checked.stderr
    findings = {target["target"]: target["findings"] for target in json.loads(checked.stdout)["targets"]}
    assert {"target": "toy", "kind": "advice", "detail": "the toy runtime greets toy", "where": "toy"} \
        in findings["toy"], findings
    tuned = mobilebuild(toy_project, "tune", "recipes/tiny.yaml", "--target", "toy-int8", "--goal", "sqnr_db=5")
    assert tuned.returncode == 0, tuned.stdout + tuned.stderr
    assert "toy-int8" in tuned.stdout


def test_without_its_route_a_backend_is_not_in_the_grammar(project):
    project.write_recipe(tiny_recipe(targets=[{"backend": "xnnpack"}, {"backend": "toy"}]))
    result = project.run("invalid")
    assert result.returncode != 0
    assert 'recipes/tiny.yaml: targets[1].backend: expected one of "xnnpack"' in result.stderr
    assert 'got "toy"' in result.stderr


@pytest.mark.parametrize("route", routes.all_routes(), ids=lambda route: route.key)
def test_every_route_names_stages_that_exist_and_chain(route):
    previous = "fuse"
    for name in route.stages:
        stage = stages.get(name)
        assert stage.planner() is not None
        assert any(previous in allowed for allowed in stage.inputs.values()), (previous, name)
        previous = name


def test_a_chain_that_breaks_a_contract_is_refused():
    with pytest.raises(AssertionError, match="stage optimize cannot take 'scripted' from fuse"):
        stages.get("optimize").check_inputs({"scripted": "fuse"})
    with pytest.raises(AssertionError, match="stage lower takes no input 'quantized'"):
        stages.get("lower").check_inputs({"model": "fuse", "quantized": "quantize"})
    stages.get("verify").check_inputs({"artifact": "lower", "checkpoint": "prune"})

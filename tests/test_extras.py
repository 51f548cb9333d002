"""Route families as extras of mobilebuild (pyproject.toml): a target of a family whose packages are not installed
fails in one line naming the extra to install while the recipe's other targets build; `mobilebuild check` says which
families are installed; each built-in family's packages come with its extra."""

import json
import re
import textwrap
from importlib import metadata

import pytest
from conftest import tiny_recipe
from test_routes import TOY_RUNTIME, TOY_STAGE

import mobilebuild.routes  # noqa: F401 - the built-in families
from mobilebuild.plan import routes, toolchain
from mobilebuild.preflight import command


def test_a_family_missing_a_package_is_named_with_its_extra():
    litert = routes.get("xnnpack", "litert").runs_in
    found = {**toolchain.installed(), "ai-edge-litert": None}
    line = routes.not_installed(litert.packages, found)
    assert line == "LiteRT is not installed here (ai-edge-litert missing): pip install 'mobilebuild[litert]'"
    assert routes.not_installed(litert.packages, toolchain.installed()) is None
    assert routes.not_installed(("timm",), {"timm": None}) == ("timm is not installed here: pip install "
                                                               "'mobilebuild[hub]'")
    assert routes.installed_families(found)["LiteRT"] == line
    # torchao is ExecuTorch's too: the line names the node's own family, whichever it shares packages with
    bare = {name: None for name in routes.distributions()}
    executorch = routes.get("xnnpack", "executorch").runs_in
    assert routes.not_installed(litert.packages, bare).startswith("LiteRT is not installed here (litert-torch, ")
    assert routes.not_installed((*executorch.packages, "timm"), bare).startswith("ExecuTorch is not installed here")
    assert routes.installed_families(found)["ONNX Runtime"] is None


def _requirements(distribution, extra=None):
    """The distributions `distribution` requires (with `extra`: that extra's own), by name."""
    found = set()
    for line in metadata.requires(distribution) or []:
        requirement, _, marker = line.partition(";")
        on_extra = re.search(r"extra\s*==\s*[\"']([^\"']+)[\"']", marker)
        if (on_extra.group(1) if on_extra else None) == extra:
            found.add(re.match(r"[A-Za-z0-9._-]+", requirement.strip()).group(0))
    return found


def _closure(names):
    """`names` and everything they require, as installed here (a requirement for another platform is not)."""
    seen, pending = set(), list(names)
    while pending:
        try:
            name = metadata.distribution(pending.pop()).metadata["Name"].lower().replace("_", "-")
        except metadata.PackageNotFoundError:
            continue
        if name not in seen:
            seen.add(name)
            pending += _requirements(name)
    return seen


@pytest.mark.parametrize("family", sorted({route.runs_in.extra for route in routes.all_routes()} - {None}))
def test_each_familys_extra_installs_every_package_that_keys_its_nodes(family):
    """pyproject.toml's extra and the family's Runtime.packages cannot drift apart: installing the extra alone
    installs what the family's nodes need (read from the installed metadata, transitively)."""
    listed = _requirements("mobilebuild", family)
    assert listed, f"no extra {family!r} in mobilebuild's metadata"
    packages = {name for route in routes.all_routes() if route.runs_in.extra == family
                for name in route.runs_in.packages}
    assert packages - _closure(listed) == set()


def test_the_core_install_holds_no_familys_packages_and_all_holds_every_extra():
    core = _closure(_requirements("mobilebuild"))
    families = {route.runs_in.extra: route.runs_in.packages for route in routes.all_routes() if route.runs_in.extra}
    assert {extra: packages[0] for extra, packages in families.items() if packages[0] in core} == {}
    (everything,) = [line for line in metadata.requires("mobilebuild") if re.search(r'extra\s*==\s*"all"', line)]
    assert set(re.search(r"mobilebuild\[([^]]+)\]", everything).group(1).split(",")) == {*families, "hub", "dask"}


def test_checks_header_says_which_families_are_installed():
    report = {"recipe": "r", "file": "recipes/r.yaml", "versions": {"torch": "2.12.1"},
              "families": {"PyTorch Mobile": None, "LiteRT": "LiteRT is not installed here (ai-edge-litert missing): "
                                                            "pip install 'mobilebuild[litert]'"},
              "model": {"findings": [], "notes": [], "cached": True, "seconds": 0}}
    lines = command.header(report)
    assert lines[1] == ("route families installed: PyTorch Mobile; not installed: LiteRT is not installed here "
                        "(ai-edge-litert missing): pip install 'mobilebuild[litert]'")


# A project's own family (test_routes.py's toy stage and runtime) whose runtime's package is not installed here
UNINSTALLED_DODO = textwrap.dedent('''
    from mobilebuild.plan import stages
    from mobilebuild.plan.routes import Route, Runtime, register
    from toystage import ToyConfig, plan

    stages.register(stages.Stage("toy", ToyConfig, {"model": ("fuse",)}, "The toy backend's TorchScript files.",
                                 "#123456", module="toystage", plan=plan))
    register(Route("faraway", "farrt", ("fp32",), ("toy",), ".toy", "a family not installed here",
                   Runtime("farrt", "Faraway Runtime", module="toyruntime", packages=("mobilebuild-no-such-runtime",),
                           extra="faraway")))

    from mobilebuild.tasks import *  # noqa: E402,F401,F403
''')


@pytest.mark.slow
def test_a_target_of_a_family_not_installed_fails_in_one_line_and_the_others_build(project):
    (project.root / "toystage.py").write_text(TOY_STAGE)
    (project.root / "toyruntime.py").write_text(TOY_RUNTIME)
    (project.root / "dodo.py").write_text(UNINSTALLED_DODO)
    project.write_recipe(tiny_recipe(targets=[{"backend": "xnnpack"}, {"backend": "faraway"}]))
    built = project.run()
    output = built.stdout + built.stderr
    assert built.returncode != 0
    line = ("Faraway Runtime is not installed here (mobilebuild-no-such-runtime missing): pip install "
            "'mobilebuild[faraway]'")
    assert sum(line in text for text in output.splitlines()) >= 1 and "Traceback" not in output
    assert json.loads(project.artifact("tiny/verify-xnnpack.json").read_text())["status"] == "passed"
    assert not project.artifact("tiny/tiny-faraway.toy").exists()
    manifest = json.loads(project.artifact("tiny/manifest.json").read_text())
    failed = {target["target"]: target for target in manifest["targets"]}["faraway"]
    assert "mobilebuild[faraway]" in json.dumps(failed)

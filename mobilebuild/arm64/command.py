"""`mobilebuild arm64 setup|status`: make the emulated aarch64 environment, or say what there is."""

from mobilebuild.arm64 import setup
from mobilebuild.errors import MobileBuildError
from mobilebuild.plan import arm64

USAGE = "usage: mobilebuild arm64 setup|status"


def arm64_command(args, registered):
    """`registered`: routes.arm64_runtimes(), the runtimes whose artifacts run on emulated ARM CPUs."""
    if args not in (["setup"], ["status"]):
        print(USAGE)
        return 2
    if args == ["setup"]:
        try:
            found = setup.setup(registered)
        except MobileBuildError as exc:
            print(f"mobilebuild arm64 setup: {exc}")
            return 1
    else:
        found = arm64.current()
        if found is None:
            print(f"no aarch64 environment in {arm64.home()}: `{arm64.SETUP_COMMAND}` makes one; builds plan no ARM "
                  "nodes until then")
            return 1
    for line in describe(found):
        print(line)
    return 0


def describe(found):
    counted = f"plugin {found['counter']}" if found.get("counter") else "not counted (no C compiler at setup)"
    yield f"aarch64 environment {found['key']} in {found['path']}"
    yield f"  QEMU {found['qemu']}, Python {found['python']}, instructions: {counted}"
    wheels = found["wheels"]
    yield "  runtimes: " + ", ".join(
        f"{name} ({', '.join(wheel + ' ' + wheels[wheel] for wheel in runtime['wheels'])})"
        for name, runtime in found["runtimes"].items())
    for name in (name for name in arm64.CPUS if name in found["cpus"]):
        cpu = found["cpus"][name]
        default = " (default)" if name in arm64.DEFAULT_CPUS else ""
        yield f"  {name}{default}: -cpu {cpu['qemu']}; {arm64.CPUS[name].generation}"

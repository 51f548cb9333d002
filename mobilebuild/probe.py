"""What an interpreter has: its Python and package versions and, when asked, the facts of its torch build that decide
what PyTorch Mobile targets it can make. One probe for this interpreter (`facts`) and for a target's `toolchain`
interpreter (`python -m mobilebuild.probe REQUEST`, run by plan/toolchain.py). torch is imported only when its build
is asked for: reading versions must stay fast."""

import json
import platform
import sys
from importlib import metadata


def facts(distributions, gpu_ops=None):
    """{"python", each distribution's version or None} and, given `gpu_ops` ({backend: (namespace, op)}), the torch
    build under "torch_build"."""
    found = {"python": platform.python_version()}
    for dist in distributions:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = None
    if gpu_ops is not None:
        found["torch_build"] = torch_build(gpu_ops)
    return found


def torch_build(gpu_ops):
    """The torch version, whether XNNPACK is compiled in, the quantized engines, and which GPU export ops exist."""
    import torch
    import torch.backends.xnnpack

    return {"version": torch.__version__, "xnnpack": bool(torch.backends.xnnpack.enabled),
            "engines": list(torch.backends.quantized.supported_engines),
            "gpu": {name: hasattr(getattr(torch.ops, namespace), op) for name, (namespace, op) in gpu_ops.items()}}


if __name__ == "__main__":
    request = json.loads(sys.argv[1])
    print(json.dumps(facts(request["distributions"], request.get("gpu_ops"))))

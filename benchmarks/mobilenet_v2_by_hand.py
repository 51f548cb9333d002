"""recipes/mobilenet_v2.yaml built by hand in one process, the way the PyTorch Mobile performance recipe writes
it: the baseline of cold_build.py. It deliberately uses nothing from mobilebuild.

    python benchmarks/mobilenet_v2_by_hand.py OUT_DIR   ->  OUT_DIR/mobilenet_v2-{xnnpack,qnnpack}.ptl

Prints one `step <name> <seconds>` line per step.
"""

import sys
import time
from pathlib import Path

STARTED = time.perf_counter()

import torch  # noqa: E402  (timed: the graph's run pays for this import too)
import torchvision  # noqa: E402
from torch.ao import quantization as tq  # noqa: E402
from torch.utils import bundled_inputs  # noqa: E402
from torch.utils.mobile_optimizer import optimize_for_mobile  # noqa: E402

# The recipe's numbers, and the defaults mobilebuild applies to it.
SHAPE = (1, 3, 224, 224)
SEED = 0
BATCHNORM_BATCHES, BATCHNORM_BATCH = 4, 8
CALIBRATION_BATCHES, CALIBRATION_SEED = 8, 0
ENGINE = "qnnpack"


def randn(seed, batch=SHAPE[0]):
    generator = torch.Generator().manual_seed(seed)
    tensor = torch.randn((batch, *SHAPE[1:]), generator=generator)
    return tensor.contiguous(memory_format=torch.channels_last)


class ChannelsLastInput(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, x):
        return self.model(x.contiguous(memory_format=torch.channels_last))


def reestimate_batchnorm(model):
    """A random model's default statistics (mean 0, var 1) give outputs of a silly scale: recompute them as a
    cumulative average over seeded random batches."""
    norms = [m for m in model.modules() if isinstance(m, torch.nn.modules.batchnorm._BatchNorm)]
    for norm in norms:
        norm.reset_running_stats()
        norm.momentum = None
    model.train()
    with torch.no_grad():
        for index in range(BATCHNORM_BATCHES):
            model(randn(SEED + 1 + index, batch=BATCHNORM_BATCH))
    for norm in norms:
        norm.momentum = 0.1
    return model.eval()


def ship(model, path):
    scripted = torch.jit.script(ChannelsLastInput(model).eval())
    optimized = optimize_for_mobile(scripted, backend="CPU")
    bundled_inputs.augment_model_with_bundled_inputs(optimized, [(bundled_inputs.bundle_randn(*SHAPE),)])
    optimized._save_for_lite_interpreter(str(path))


def main(out):
    out.mkdir(parents=True, exist_ok=True)
    steps = [("import torch", time.perf_counter() - STARTED)]

    def step(name, since):
        steps.append((name, time.perf_counter() - since))
        return time.perf_counter()

    now = time.perf_counter()
    # mobilebuild's stages compute with one thread (build/worker_pool.py: batch-norm statistics round with the
    # thread count); so must this script, or its outputs would differ
    torch.set_num_threads(1)
    torch.manual_seed(SEED)
    model = torchvision.models.quantization.mobilenet_v2(weights=None, quantize=False).eval()
    reestimate_batchnorm(model)
    now = step("model + batch-norm statistics", now)
    model.fuse_model()  # the same Conv-BN(-ReLU) groups as the recipe's `fuse: auto`
    now = step("fuse", now)
    ship(model, out / "mobilenet_v2-xnnpack.ptl")
    now = step("fp32: script, optimize, save", now)

    torch.backends.quantized.engine = ENGINE
    model.qconfig = tq.get_default_qconfig(ENGINE)
    tq.prepare(model, inplace=True)
    with torch.no_grad():
        for index in range(CALIBRATION_BATCHES):
            model(randn(CALIBRATION_SEED + index))
    tq.convert(model, inplace=True)
    now = step("int8: prepare, calibrate, convert", now)
    ship(model, out / "mobilenet_v2-qnnpack.ptl")
    step("int8: script, optimize, save", now)

    for name, seconds in steps:
        print(f"step {name} {seconds:.3f}")


if __name__ == "__main__":
    main(Path(sys.argv[1]))

"""Int8 outputs under QEMU user-mode emulation, per `-cpu` setting, against the x86 host (see docs/arm64_sme.md).

The host (torch, litert-torch, onnxruntime) builds tiny fully-int8 single-operator LiteRT models and, with --mnv2, an
int8 MobileNetV2 for LiteRT and ONNX Runtime (random weights). Each model runs on the host, then under
`qemu-aarch64 -cpu CPU` with an aarch64 Python (sysroot) and aarch64 wheels (site). With aarch64 binutils on PATH it
also checks SME's SMOPA (int8 to int32 outer product) against the architecture's definition.

    .venv/bin/python benchmarks/sme_repro.py [--sysroot SYSROOT] [--site SITE] [--mnv2]
        [--qemu PATH/qemu-aarch64] [--cpus "max;max,sme=off"] [--work DIR]

The sysroot and site default to the environment `mobilebuild arm64 setup` made.
"""

import argparse
import glob
import os
import shutil
import subprocess
import sys
import tempfile

import numpy as np

CPUS = ["cortex-a53", "cortex-a76", "max", "max,sme=off", "max,sve=off", "max,sme-default-vector-length=64"]
# LiteRT's builtin kernels (no XNNPACK delegate); they round differently on x86, so they are compared with themselves
# under cortex-a53.
BUILTIN = ["cortex-a53 (no XNNPACK)", "max (no XNNPACK)"]
SMOPA_CPUS = ["max,sme-default-vector-length=16", "max", "max,sme-default-vector-length=64"]


def build(work, mnv2):
    """Host only: writes NAME.tflite / NAME.onnx and NAME.in.npy (4 float inputs) into work."""
    import litert_torch
    import torch
    from litert_torch.quantize.pt2e_quantizer import PT2EQuantizer, get_symmetric_quantization_config
    from litert_torch.quantize.quant_config import QuantConfig
    from torchao.quantization.pt2e.quantize_pt2e import convert_pt2e, prepare_pt2e

    torch.manual_seed(0)
    models = {
        "conv1x1": (torch.nn.Conv2d(32, 64, 1), (1, 32, 8, 8)),
        "conv3x3": (torch.nn.Conv2d(16, 32, 3, padding=1), (1, 16, 8, 8)),
        "dwconv3x3": (torch.nn.Conv2d(32, 32, 3, padding=1, groups=32), (1, 32, 8, 8)),
        "fc": (torch.nn.Sequential(torch.nn.Linear(64, 48)), (1, 64)),
    }
    if mnv2:
        import torchvision

        m = torchvision.models.mobilenet_v2(weights=None)
        for bn in m.modules():  # random weights: re-estimate batch-norm statistics so activations stay sane
            if isinstance(bn, torch.nn.BatchNorm2d):
                bn.reset_running_stats(), setattr(bn, "momentum", None)
        with torch.no_grad():
            m.train()(torch.randn(16, 3, 224, 224))
        models["mnv2"] = (m, (1, 3, 224, 224))
    for name, (m, shape) in models.items():
        m.eval()
        x = torch.randn(*shape)
        calib = [torch.randn(*shape) for _ in range(8)]
        np.save(f"{work}/{name}.in.npy", np.random.RandomState(1).randn(4, *shape).astype(np.float32))
        q = PT2EQuantizer().set_global(get_symmetric_quantization_config(is_per_channel=True))
        prepared = prepare_pt2e(torch.export.export(m, (x,)).module(), q)
        for c in calib:
            prepared(c)
        quantized = convert_pt2e(prepared, fold_quantize=False)
        edge = litert_torch.convert(quantized, (x,), quant_config=QuantConfig(pt2e_quantizer=q))
        edge.export(f"{work}/{name}.tflite")
        if name == "mnv2":
            build_ort_int8(m, x, calib, work)


def build_ort_int8(m, x, calib, work):
    import torch
    from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_static

    class Reader(CalibrationDataReader):
        def __init__(self):
            self.it = iter([{"x": c.numpy()} for c in calib])

        def get_next(self):
            return next(self.it, None)

    torch.onnx.export(m, (x,), f"{work}/mnv2_fp32.onnx_", input_names=["x"], dynamo=False, opset_version=17)
    quantize_static(f"{work}/mnv2_fp32.onnx_", f"{work}/mnv2_ort.onnx", Reader(), quant_format=QuantFormat.QDQ,
                    per_channel=True, activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)  # as mobilebuild
    shutil.copy(f"{work}/mnv2.in.npy", f"{work}/mnv2_ort.in.npy")


def run(work, tag, builtin=False):
    """Host or emulated: runs every model on its inputs, saves dequantized outputs as NAME.out.TAG.npy."""
    for path in sorted(glob.glob(f"{work}/*.tflite") + ([] if builtin else glob.glob(f"{work}/*.onnx"))):
        name, ext = os.path.splitext(os.path.basename(path))
        xs = np.load(f"{work}/{name}.in.npy")
        if ext == ".onnx":
            import onnxruntime as ort

            opts = ort.SessionOptions()
            opts.intra_op_num_threads = 1
            sess = ort.InferenceSession(path, opts, providers=["CPUExecutionProvider"])
            outs = [sess.run(None, {"x": x})[0] for x in xs]
        else:
            from ai_edge_litert.interpreter import Interpreter, OpResolverType

            kw = {"experimental_op_resolver_type": OpResolverType.BUILTIN_WITHOUT_DEFAULT_DELEGATES} if builtin else {}
            it = Interpreter(model_path=path, num_threads=1, **kw)
            it.allocate_tensors()
            i, o = it.get_input_details()[0], it.get_output_details()[0]
            (si, zi), (so, zo) = i["quantization"], o["quantization"]
            outs = []
            for x in xs:
                it.set_tensor(i["index"], np.clip(np.round(x / si + zi), -128, 127).astype(i["dtype"]))
                it.invoke()
                outs.append((it.get_tensor(o["index"]).astype(np.float32) - zo) * so)
        np.save(f"{work}/{name}.out.{tag}.npy", np.stack(outs))


SMOPA_ASM = """
    .arch armv9-a+sme
    .global smopa_s8
smopa_s8:                        // (int8 a[SVL], int8 b[SVL], int32 out[SVL/4][SVL/4]) -> SVL in bytes
    stp d8, d9, [sp, #-64]!      // smstart zeroes the vector registers: keep d8-d15 (callee-saved)
    stp d10, d11, [sp, #16]
    stp d12, d13, [sp, #32]
    stp d14, d15, [sp, #48]
    smstart
    ptrue p0.b
    zero {za}
    ld1b {z0.b}, p0/z, [x0]
    ld1b {z1.b}, p0/z, [x1]
    smopa za0.s, p0/m, p0/m, z0.b, z1.b
    cntw x9
    mov w12, #0
1:  st1w {za0h.s[w12, 0]}, p0, [x2]
    addvl x2, x2, #1
    add w12, w12, #1
    cmp x12, x9
    b.lt 1b
    rdsvl x0, #1
    smstop
    ldp d10, d11, [sp, #16]
    ldp d12, d13, [sp, #32]
    ldp d14, d15, [sp, #48]
    ldp d8, d9, [sp], #64
    ret
"""


def smopa_run(lib):
    """Emulated: SMOPA ZA0.S, Zn.B, Zm.B with all lanes active is ZA0[i][j] += sum_k Zn[4i+k] * Zm[4j+k]."""
    import ctypes

    a, b = np.random.default_rng(0).integers(-128, 128, (2, 256), dtype=np.int8)
    out = np.zeros(64 * 64, np.int32)
    svl = ctypes.CDLL(lib).smopa_s8(*(ctypes.c_void_p(t.ctypes.data) for t in (a, b, out)))
    n = svl // 4
    got = out[: n * n].reshape(n, n)
    want = a[:svl].reshape(n, 4).astype(np.int32) @ b[:svl].reshape(n, 4).astype(np.int32).T
    bad = got != want
    right = sorted({(int(r) % 2, int(c) % 2) for r, c in zip(*np.nonzero(~bad))})
    print(f"SVL {svl * 8} bits: {bad.sum()}/{bad.size} elements differ; right at (row, col) mod 2 in {right}; "
          f"ZA0[0][1] = {got[0, 1]}, want {want[0, 1]} (want[1][1] = {want[1, 1]})")


def sqnr(ref, out):
    err = ((ref.astype(np.float64) - out) ** 2).sum()
    return "identical" if err == 0 else f"{10 * np.log10((ref.astype(np.float64) ** 2).sum() / err):.1f} dB"


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--sysroot", help="default: the setup's sysroot, as the Cortex-A53 sees it")
    p.add_argument("--site", help="default: the setup's aarch64 wheels")
    p.add_argument("--qemu", default="qemu-aarch64", help="the emulator (default: the one on PATH)")
    p.add_argument("--work", help="keep models and outputs here (default: a temporary folder)")
    p.add_argument("--mnv2", action="store_true", help="also MobileNetV2 int8 (LiteRT and ONNX Runtime)")
    p.add_argument("--cpus", default=";".join(CPUS + BUILTIN), help="';'-separated -cpu strings")
    p.add_argument("--run", nargs=2, metavar=("WORK", "TAG"), help=argparse.SUPPRESS)
    p.add_argument("--builtin", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--smopa-run", metavar="LIB", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.run:
        return run(*a.run, builtin=a.builtin)
    if a.smopa_run:
        return smopa_run(a.smopa_run)
    from mobilebuild.plan import arm64  # the host side only: the script runs itself under emulation too

    made = arm64.current() or {"path": "."}
    a.sysroot = a.sysroot or os.path.join(made["path"], "cpus", "cortex-a53")
    a.site = a.site or os.path.join(made["path"], "site")

    work = a.work or tempfile.mkdtemp(prefix="sme_repro_")
    os.makedirs(work, exist_ok=True)
    env = dict(os.environ, PYTHONPATH=a.site)
    py = [f"{a.sysroot}/usr/bin/python3.11", os.path.abspath(__file__)]

    def emulate(cpu, *args):
        cmd = [a.qemu, "-L", a.sysroot, "-cpu", cpu, *py, *args]
        r = subprocess.run(cmd, env=env, capture_output=True, text=True)
        return r.stdout.strip() if r.returncode == 0 else f"failed ({r.returncode}): {r.stderr.strip()[-200:]}"

    build(work, a.mnv2)
    run(work, "x86")
    cpus = a.cpus.split(";")
    failed = {}
    for t, cpu in enumerate(cpus):
        builtin = cpu.endswith(" (no XNNPACK)")
        out = emulate(cpu.split()[0], "--run", work, str(t), *(["--builtin"] if builtin else []))
        if out.startswith("failed"):
            failed[cpu] = out
    names = [os.path.basename(f)[: -len(".out.x86.npy")] for f in sorted(glob.glob(f"{work}/*.out.x86.npy"))]
    w = max(map(len, cpus))
    print(f"{'model':10s} {'cpu':{w}s} {'against':24s} {'SQNR':>10s}  top-1 agrees")
    for name in names:
        for t, cpu in enumerate(cpus):
            against = BUILTIN[0] if cpu in BUILTIN and BUILTIN[0] in cpus else "x86"
            ref_path = f"{work}/{name}.out.{cpus.index(against) if against != 'x86' else 'x86'}.npy"
            path = f"{work}/{name}.out.{t}.npy"
            if cpu in BUILTIN and name.endswith("_ort"):  # ONNX Runtime has no XNNPACK to leave out
                continue
            if not os.path.exists(path) or not os.path.exists(ref_path):
                print(f"{name:10s} {cpu:{w}s} {against:24s} {'no output':>10s}")
                continue
            ref, out = np.load(ref_path), np.load(path)
            top1 = (ref.reshape(len(ref), -1).argmax(1) == out.reshape(len(out), -1).argmax(1)).sum()
            print(f"{name:10s} {cpu:{w}s} {against:24s} {sqnr(ref, out):>10s}  {top1}/{len(ref)}")
    for cpu, why in failed.items():
        print(f"{cpu}: {why}")
    if shutil.which("aarch64-linux-gnu-as"):
        with open(f"{work}/smopa.S", "w") as f:
            f.write(SMOPA_ASM)
        subprocess.run(["aarch64-linux-gnu-as", "-o", f"{work}/smopa.o", f"{work}/smopa.S"], check=True)
        subprocess.run(["aarch64-linux-gnu-ld", "-shared", "-o", f"{work}/smopa.so", f"{work}/smopa.o"], check=True)
        for cpu in SMOPA_CPUS:
            print(f"SMOPA check, -cpu {cpu}: {emulate(cpu, '--smopa-run', work + '/smopa.so')}")
    if not a.work:
        shutil.rmtree(work)


if __name__ == "__main__":
    sys.exit(main())

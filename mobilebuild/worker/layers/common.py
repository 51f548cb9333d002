"""What the per-layer comparison methods share: the error each layer adds, summed over the batches (Errors), the
ops that only move data (MOVES), a logged value as a float tensor, and the layers quantize.exclude keeps float."""

import math

import torch

from mobilebuild.worker import capture_root, metrics
from mobilebuild.worker.stages import exclusion

# Nodes that only move or view data: never a layer of their own
MOVES = {"view", "reshape", "flatten", "permute", "transpose", "squeeze", "unsqueeze", "contiguous", "clone",
         "getitem", "dropout", "_assert_tensor_metadata", "expand", "alias", "detach", "to", "unflatten", "select",
         "slice", "split", "split_with_sizes", "unbind", "narrow", "t", "movedim", "Reshape", "Flatten", "Transpose",
         "Squeeze", "Unsqueeze", "Identity", "Shape", "Gather", "Cast", "Constant", "Slice", "Split", "Expand"}


class Errors:
    """Per layer: the float signal's energy and the error's, summed over every batch, over the values the float model
    has finite. One it has inf or NaN (an attention mask's -inf added to the scores, which int8 makes a large finite
    number) has no error to measure: it is left out and counted. One that is finite in the float model and inf or NaN
    in the int8 one makes the layer's SQNR meaningless: the layer is listed as not comparable, with why, rather than
    given a number."""

    def __init__(self):
        # (name, op) -> [signal, noise, values compared, of them inf or NaN in int8, float values inf or NaN, extra,
        #                the nodes that gave those]
        self.found = {}
        self.skipped = {}  # (name, op) -> why it cannot be compared

    def add(self, name, op, reference, output, part=None, **extra):
        """`part`: the node of the layer that gave these values, named where int8 gives inf or NaN."""
        # the same values: ONNX's and the float graph's may differ in shape by a view
        if reference.numel() != output.numel() or reference.dtype != output.dtype or not reference.is_floating_point():
            return
        reference = reference.detach().double().flatten()
        output = output.detach().double().flatten()
        entry = self.found.setdefault((name, op), [0.0, 0.0, 0, 0, 0, extra, []])
        finite = torch.isfinite(reference)
        reference, output = reference[finite], output[finite]
        broken = ~torch.isfinite(output)
        entry[2] += reference.numel()
        entry[3] += int(broken.sum().item())
        if broken.any() and part and part not in entry[6]:
            entry[6].append(part)
        entry[4] += int((~finite).sum().item())
        entry[0] += reference.pow(2).sum().item()
        entry[1] += (reference[~broken] - output[~broken]).pow(2).sum().item()

    def skip(self, name, op, why):
        """A layer that cannot be compared (a part of it that cannot run), and why (one line): it has no SQNR, not
        one of its other parts only."""
        self.skipped.setdefault((name, op), why)

    def results(self):
        """(the layers with an SQNR, worst first; the layers that have none, each with why)."""
        rows, uncompared = [], []
        for (name, op), (signal, noise, compared, broken, masked, extra, parts) in self.found.items():
            if (name, op) in self.skipped:
                continue
            if broken:
                why = (f"int8 gives inf or NaN for {broken} of its {compared} values where float's are finite"
                       + (f" (in {', '.join(parts)})" if parts else ""))
            elif noise == 0.0:  # exact: it adds no error (a dequantization, a float module, a mask)
                continue
            elif signal == 0.0:
                why = "the float model's output is all zeros: no signal to measure the error against"
            else:
                value = 10.0 * math.log10(signal / noise)
                row = {"name": name, "op": op, "sqnr_db": round(min(value, metrics.SQNR_CEILING_DB), 2), **extra}
                rows.append(row | ({"float_inf_or_nan_values": masked} if masked else {}))
                continue
            uncompared.append({"name": name, "op": op, "reason": why})
        uncompared += [{"name": name, "op": op, "reason": why} for (name, op), why in self.skipped.items()]
        for row in rows + uncompared:  # a layer named as the user's model names it
            row["name"] = capture_root.user_text(row["name"])
        return (sorted(rows, key=lambda row: (row["sqnr_db"], row["name"], row["op"])),
                sorted(uncompared, key=lambda row: (row["name"], row["op"])))


def dequantized(value):
    """A logged value as a float tensor (the first tensor of a tuple), or None."""
    if isinstance(value, (tuple, list)):
        value = next((item for item in value if isinstance(item, torch.Tensor)), None)
    if not isinstance(value, torch.Tensor):
        return None
    return value.dequantize() if value.is_quantized else value


def exclusions(model, quantization):
    """The modules quantize.exclude keeps float (its `exclude` entries resolved on `model`), or ()."""
    entries = (quantization or {}).get("exclude")
    if not entries:
        return ()
    return exclusion.resolve(model, entries)

"""An LM head tied to the embedding, stored once in an ONNX model.

torch.onnx's exporter writes a tied head as a Transpose of the embedding's initializer, then its optimizer folds that
Transpose into a second, transposed initializer: SmolLM2-135M's fp32 `.onnx` held 651 MB for 538 MB of weights.
`share` puts the Transpose back: the MatMul whose weight is exactly the transpose of a Gather's table reads the
table through a Transpose node, and the copy goes. ONNX Runtime folds that Transpose again when it opens the model
(its constant folding), so the model runs as before; only the file is smaller. A quantized head (MatMulNBits, an
int8 MatMul) has weights of its own and is left alone."""

import numpy
from onnx import helper, numpy_helper


def share(model):
    """Tie each MatMul weight that is a Gather table's transpose back to the table, in place (onnx.ModelProto);
    return the names of the initializers it dropped."""
    graph = model.graph
    initializers = {tensor.name: tensor for tensor in graph.initializer}
    tables = sorted({node.input[0] for node in graph.node if node.op_type == "Gather"
                     and node.input[0] in initializers and len(initializers[node.input[0]].dims) == 2})
    dropped, transposes = [], []
    for node in graph.node:
        weight = initializers.get(node.input[1]) if node.op_type == "MatMul" else None
        table = next((initializers[name] for name in tables if weight is not None
                      and _transposed(weight, initializers[name])), None)
        if table is None:
            continue
        transposed = f"{table.name}_transposed"
        if transposed not in {t.output[0] for t in transposes}:
            transposes.append(helper.make_node("Transpose", [table.name], [transposed], name=transposed, perm=[1, 0]))
        dropped.append(weight.name)
        node.input[1] = transposed
    still_read = {name for node in graph.node for name in node.input}
    for name in dropped:
        if name not in still_read:
            graph.initializer.remove(initializers[name])
    for transpose in reversed(transposes):
        graph.node.insert(0, transpose)
    return dropped


def _transposed(weight, table):
    """Whether the initializer `weight` holds exactly the transpose of `table`."""
    return (list(weight.dims) == list(reversed(table.dims))
            and numpy.array_equal(numpy_helper.to_array(weight), numpy_helper.to_array(table).T))

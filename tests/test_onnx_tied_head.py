"""An LM head tied to the embedding, stored once in lm_onnx's model (routes/onnx/worker/tied_head.py): the exporter
wrote it a second time, transposed; the stage's model reads the embedding's table through a Transpose and gives the
same logits."""

import numpy
import onnx
import torch
from onnx import TensorProto, helper, numpy_helper
from test_generation import random_lm

from mobilebuild.plan import generation
from mobilebuild.plan.chain import model_source
from mobilebuild.routes.onnx.worker import tied_head

VOCAB, HIDDEN = 32, 8


def embedding_and_head(head):
    """A model: ids -> Gather(table) -> MatMul(head) -> logits, `head` an initializer [HIDDEN, VOCAB]."""
    table = numpy.random.default_rng(0).standard_normal((VOCAB, HIDDEN)).astype(numpy.float32)
    graph = helper.make_graph(
        [helper.make_node("Gather", ["table", "ids"], ["hidden"]), helper.make_node("MatMul", ["hidden", "head"],
                                                                                      ["logits"])],
        "lm", [helper.make_tensor_value_info("ids", TensorProto.INT64, [1, 4])],
        [helper.make_tensor_value_info("logits", TensorProto.FLOAT, [1, 4, VOCAB])],
        [numpy_helper.from_array(table, "table"), numpy_helper.from_array(head(table), "head")])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def logits(model):
    import onnxruntime

    session = onnxruntime.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, {"ids": numpy.array([[1, 5, 9, 31]])})[0]


def test_a_head_that_is_the_tables_transpose_reads_the_table_and_gives_the_same_logits():
    model = embedding_and_head(lambda table: table.T.copy())
    before = logits(model)
    assert tied_head.share(model) == ["head"]
    assert [tensor.name for tensor in model.graph.initializer] == ["table"]
    assert model.graph.node[0].op_type == "Transpose"
    onnx.checker.check_model(model)
    assert numpy.array_equal(logits(model), before)


def test_a_head_of_its_own_is_left_alone():
    model = embedding_and_head(lambda table: table.T + 1e-3)
    assert tied_head.share(model) == [] and len(model.graph.initializer) == 2


def test_the_stages_model_of_a_tied_llama_holds_its_embedding_once_and_decodes_as_eager(tmp_path):
    """A tiny tied Llama from a checkpoint, as a build restores it (its head then a parameter of its own over the
    same storage, which the exporter writes again, transposed): the stage's fp32 model holds one table, its logits
    eager's."""
    from mobilebuild.routes.onnx.worker import lm_onnx
    from mobilebuild.routes.onnx.worker import runtime as ort_runtime
    from mobilebuild.worker import lm, metrics

    config = {"model_type": "llama", "vocab_size": 4096, "hidden_size": 64, "intermediate_size": 128,
              "num_hidden_layers": 1, "num_attention_heads": 2, "num_key_value_heads": 1,
              "max_position_embeddings": 64, "tie_word_embeddings": True}
    model, checkpoint, output = random_lm(config), tmp_path / "checkpoint.pt", tmp_path / "model.onnx"
    torch.save(model.state_dict(), checkpoint)
    source = model_source({"transformers": "AutoModelForCausalLM", "config": config}, [{"name": "input_ids"}],
                          generative=True)
    settings = generation.LMExportConfig(model=source, precision="fp32", max_context=32)
    lm_onnx.export_float(lm.causal_lm(source, checkpoint), 32, tmp_path / "exported.onnx")
    exported = onnx.load(tmp_path / "exported.onnx")
    assert sum(numpy.prod(tensor.dims) == 4096 * 64 for tensor in exported.graph.initializer) == 2  # as exported
    lm_onnx.run({"checkpoint": checkpoint}, settings, output)
    built = onnx.load(output)
    assert sum(numpy.prod(tensor.dims) == 4096 * 64 for tensor in built.graph.initializer) == 1
    prompt = torch.arange(1, 9).view(1, 8)
    with torch.no_grad():
        expected = model(prompt).logits
    assert metrics.sqnr_db(expected, ort_runtime.generator(output, settings).forward(prompt, 0)) > 100

"""genai_builder: onnxruntime-genai's model builder as its command line runs it, with the LM head found by identity.

onnxruntime-genai 0.18.0's builder walks every module and takes each nn.Linear whose out_features is the vocabulary's
size for the LM head (builders/base.py, `Model.has_lm_head`). A model whose vocabulary is as large as a projection's
output (a byte-level vocabulary of 256 beside a hidden size of 256) then gets its projections written as LM heads
too: 3 to 7 dB against eager in fp32, measured. Here a loaded model's `lm_head` is the head and no other layer is;
a model without one is the builder's as it ships.

    python -m mobilebuild.routes.onnx.worker.genai_builder <the builder's arguments>
"""

import runpy
import sys

BUILDER = "onnxruntime_genai.models.builder"


def main(argv):
    import onnxruntime_genai.models  # noqa: F401  puts the builder's folder on sys.path, whose modules import so
    import torch
    from builders import base  # the module the builder's own imports load

    builders_test = base.Model.has_lm_head

    def has_lm_head(self, module):
        head = getattr(self.weights, "lm_head", None)
        return module is head if isinstance(head, torch.nn.Module) else builders_test(self, module)

    base.Model.has_lm_head = has_lm_head
    sys.argv = [BUILDER, *argv]
    runpy.run_module(BUILDER, run_name="__main__", alter_sys=True)


if __name__ == "__main__":
    main(sys.argv[1:])

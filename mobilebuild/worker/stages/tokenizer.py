"""tokenizer: the recipe's tokenizer file, checked to be one its library reads, copied byte for byte beside the
recipe's language model artifacts: the file an app's runner loads with them (ExecuTorch's LLM runner takes a
tokenizer.json or a SentencePiece model as it is)."""

import shutil

from mobilebuild.worker.tokenizer import Tokenizer


def run(inputs, config, output):
    found = Tokenizer(inputs["source"])
    shutil.copyfile(inputs["source"], output)
    print(f"   {found.format} tokenizer, {found.vocab_size} tokens")

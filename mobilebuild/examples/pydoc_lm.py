"""A small Llama-architecture language model trained in the build on text that ships with Python: the help topics
of `pydoc_data.topics` (the text `help("FOR")` prints). Byte-level tokens (token id = byte), so no tokenizer is
needed; the last tenth of the text is held out for the verification's prompts and perplexity. Deterministic:
seeded, one thread, a fixed number of steps.
"""

import torch

VOCABULARY = 256  # bytes
HELDOUT = 0.1  # the last tenth of the text: never trained on
WINDOW = 128  # tokens per training sequence: the recipe's max_context, so every cache position is trained


def _text():
    from pydoc_data.topics import topics

    return "\n".join(topics[name] for name in sorted(topics)).encode("utf-8")


def _split():
    data = torch.frombuffer(bytearray(_text()), dtype=torch.uint8).to(torch.int64)
    cut = int(len(data) * (1 - HELDOUT))
    return data[:cut], data[cut:]


def heldout():
    """The held-out bytes as token ids (generate.text)."""
    return _split()[1][:8192]


def heldout_text():
    """The held-out text as text (generate.text with a generate.tokenizer)."""
    return _split()[1][:8192].to(torch.uint8).numpy().tobytes().decode("utf-8", errors="replace")


def bpe_tokenizer(path, vocab_size=512):
    """Write a byte-level BPE tokenizer.json of `vocab_size` tokens trained by Hugging Face `tokenizers` on the
    training text (never the held-out tenth), as GPT-2's is made: a recipe's generate.tokenizer, made here rather than
    downloaded. Deterministic: the same file for the same text and size."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=["<|endoftext|>"], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    text = _split()[0].to(torch.uint8).numpy().tobytes().decode("utf-8", errors="replace")
    tokenizer.train_from_iterator(text.split("\n\n"), trainer)
    tokenizer.save(str(path))
    return path


def train(model, steps=300, batch=8, learning_rate=3e-3):
    """Next-byte prediction with AdamW on random windows of the training text, the learning rate warmed up then
    annealed (one cycle: a short budget gets further than at a constant rate); returns the model."""
    text = _split()[0]
    generator = torch.Generator().manual_seed(0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
    schedule = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=learning_rate, total_steps=steps, pct_start=0.1)
    model.train()
    for _ in range(steps):
        starts = torch.randint(0, len(text) - WINDOW - 1, (batch,), generator=generator)
        windows = torch.stack([text[start:start + WINDOW + 1] for start in starts.tolist()])
        logits = model(windows[:, :-1])["logits"]  # the build's model takes input_ids by position
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), windows[:, 1:].reshape(-1))
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        schedule.step()
    return model.eval()

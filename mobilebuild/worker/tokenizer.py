"""A language model's tokenizer (generate.tokenizer): a Hugging Face `tokenizers` tokenizer.json, or a SentencePiece
model. It turns held-out text into the token ids verification and the ranking feed the model, and gives the app's
runner its prompts as text of a known length in tokens.
"""

from pathlib import Path

from mobilebuild.errors import MobileBuildError

FIELD = "generate.tokenizer"
PROMPT_TEXT = "the quick brown fox jumps over the lazy dog. "  # repeated: a prompt's text, its length in tokens cut


class Tokenizer:
    """encode(text) -> token ids, decode(ids) -> text, vocab_size: the one interface of both formats."""

    def __init__(self, path):
        self.path = Path(path)
        self.format = "sentencepiece" if self.path.suffix == ".model" else "tokenizers"
        try:
            if self.format == "sentencepiece":
                import sentencepiece

                self._model = sentencepiece.SentencePieceProcessor(model_file=str(self.path))
                self.vocab_size = self._model.get_piece_size()
            else:
                from tokenizers import Tokenizer as HuggingFaceTokenizer

                self._model = HuggingFaceTokenizer.from_file(str(self.path))
                self.vocab_size = self._model.get_vocab_size(with_added_tokens=True)
        except ImportError as exc:
            raise MobileBuildError(f"{exc.name} is not installed here, which reads {self.path.name}: pip install "
                                   f"{exc.name}", field=FIELD) from None
        except Exception as exc:  # the library's parse error: a file that is no tokenizer of its format
            raise MobileBuildError(f"{self.path.name} is not a {self.format} tokenizer it can read: "
                                   f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}",
                                   field=FIELD) from None

    def encode(self, text):
        """Token ids of `text`, no special tokens added: held-out text is a stream, not a chat turn."""
        if self.format == "sentencepiece":
            return list(self._model.encode(text))
        return self._model.encode(text, add_special_tokens=False).ids

    def decode(self, ids):
        return self._model.decode(list(ids))

    def prompt(self, length):
        """Text that this tokenizer encodes as exactly `length` tokens (None where none of the cuts does), for a
        runner that takes text: a piece of a repeated sentence, cut at token boundaries (decoding a cut and encoding
        it again can merge its last tokens: the first cut that keeps the count)."""
        ids = self.encode(PROMPT_TEXT * (length // 4 + 4))
        for start in range(8):
            for cut in range(length, length + 8):
                text = self.decode(ids[start:start + cut])
                if len(self.encode(text)) == length:
                    return text
        return None

    def check(self, model_vocab):
        """One line where the tokenizer makes ids the model has no embedding for."""
        if self.vocab_size > model_vocab:
            raise MobileBuildError(f"{self.path.name} has {self.vocab_size} tokens, the model's vocabulary "
                                   f"{model_vocab}: a tokenizer of another model?", field=FIELD)


def byte_level(path):
    """Write a tokenizer.json whose token ids are the text's UTF-8 bytes (Hugging Face tokenizers' byte-level BPE
    with no merges, each byte as GPT-2's printable stand-in for it), with the decoder that turns them back into
    text: a byte-level model's tokenizer (the bundled example's), and the one the LLM runner gets for a byte-level
    model whose recipe names none."""
    from tokenizers import Tokenizer as HuggingFaceTokenizer
    from tokenizers import decoders, models, pre_tokenizers
    from transformers.convert_slow_tokenizer import bytes_to_unicode

    vocabulary = {character: byte for byte, character in bytes_to_unicode().items()}
    found = HuggingFaceTokenizer(models.BPE(vocab=vocabulary, merges=[]))
    found.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    found.decoder = decoders.ByteLevel()
    found.save(str(path))
    return path


"""Write the serving front door's tokenizers: one per model config, in Hugging Face `tokenizers` format.

    .venv/bin/python scripts/make_tokenizers.py [MODEL ...]   # -> experiments/tokenizers/<model>/tokenizer.json

Byte-level BPE (GPT-2's byte alphabet, so any text encodes), with exactly the model's vocab_size ids:
tiny (256) is the bare byte alphabet; the others' merges are trained on this repository's Markdown and
Python text (the files as they were when each was made; their SHA-256 is in tokenizer_config.json), and
the ids the training leaves over are filler tokens `<|pddlab_N|>`, so every id the model can sample
decodes to something. The weights are random: the text a model writes is noise either way. The files
are committed; this script is how they were made, not something a run calls. Naming models writes only
theirs (a new config gets its tokenizer without retraining the others'); no name writes every model's.
"""

from __future__ import annotations

import hashlib
import json
import sys
import tempfile
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
from workers.model import CONFIGS  # noqa: E402

OUT = REPO / "experiments" / "tokenizers"


def corpus() -> list[Path]:
    files = [REPO / "README.md", *sorted((REPO / "docs").glob("*.md"))]
    for pkg in ("topology", "workers", "experiments", "docker_rt", "vm"):
        files += sorted(p for p in (REPO / pkg).rglob("*.py") if "proto" not in p.parts)
    return files


def build(vocab_size: int, files: list[Path]) -> Tokenizer:
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    alphabet = pre_tokenizers.ByteLevel.alphabet()
    if vocab_size > len(alphabet):
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, initial_alphabet=alphabet, show_progress=False)
        tok.train([str(f) for f in files], trainer)
    else:  # the bare byte alphabet: no merges
        tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(sorted(alphabet))}, merges=[]))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
    start = tok.get_vocab_size()
    if start < vocab_size:  # fillers in the BPE vocabulary itself: no merge leads to them, each decodes
        with tempfile.TemporaryDirectory() as tmp:
            vocab_file, merges_file = tok.model.save(tmp)
            vocab = json.loads(Path(vocab_file).read_text())
            vocab.update({f"<|pddlab_{i}|>": i for i in range(start, vocab_size)})
            Path(vocab_file).write_text(json.dumps(vocab))
            tok.model = models.BPE.from_file(vocab_file, merges_file)
    assert tok.get_vocab_size() == vocab_size, (tok.get_vocab_size(), vocab_size)
    return tok


def main(names: list[str]) -> None:
    files = corpus()
    digest = hashlib.sha256(b"".join(f.read_bytes() for f in files)).hexdigest()
    for name in names or sorted(CONFIGS):
        cfg = CONFIGS[name]
        tok = build(cfg.vocab_size, files)
        d = OUT / name
        d.mkdir(parents=True, exist_ok=True)
        tok.save(str(d / "tokenizer.json"), pretty=False)
        config = {
            "tokenizer_class": "PreTrainedTokenizerFast",
            "model_max_length": cfg.max_seq_len,
            "vocab_size": cfg.vocab_size,
            "pddlab_model": name,
            "pddlab_corpus_sha256": digest if cfg.vocab_size > 256 else None,
        }
        (d / "tokenizer_config.json").write_text(json.dumps(config, indent=2) + "\n")
        print(f"{d}: {tok.get_vocab_size()} ids")


if __name__ == "__main__":
    main(sys.argv[1:])

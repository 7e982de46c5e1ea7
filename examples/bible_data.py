"""The King James Bible as a word-level language-modelling corpus, from Debian's bible-kjv.

The package (installed by scripts/install_deps.sh) ships the text with its reader, ``bible``;
``bible -p /usr/lib "gen1:1-rev22:21"`` prints all 1,189 chapters (823,359 words with the
headings and verse numbers). No download.

Tokens: lower-cased words (``lord``, ``lord's``) and the punctuation marks ``. , ; : ? ! ( )``
each as a token, and ``<eos>`` after every verse; headings and verse numbers are dropped.
Split by chapter: every 20th chapter (the 20th, 40th, ... in canonical order, 59 of them) is
held out for validation, the others train. Vocabulary: the ``vocab_size - 2`` most frequent
training tokens (ties broken alphabetically, so every process builds the same one), then
``<unk>`` (every other token) and ``<eos>``.
"""

import collections
import re
import shutil
import subprocess

import torch

BIBLE = "bible"
LIBRARY_DIR = "/usr/lib"  # where bible-kjv keeps its data files
EVERY = 20  # validation: chapters 20, 40, 60, ... (1-based)
_HEADING = re.compile(r"^(?:[1-3] )?[A-Z][A-Za-z ]+ \d+$")
_VERSE = re.compile(r"^\s+\d+ ")
_TOKEN = re.compile(r"[a-z]+(?:'[a-z]*)?|[.,;:?!()]")


def read_text(bible=BIBLE, library_dir=LIBRARY_DIR):
    """The whole text as ``bible`` prints it. FileNotFoundError naming the package when the
    reader is missing."""
    if shutil.which(bible) is None:
        raise FileNotFoundError(f"'{bible}' not found: install Debian's bible-kjv "
                                "(scripts/install_deps.sh does)")
    return subprocess.run([bible, "-p", library_dir, "gen1:1-rev22:21"], check=True,
                          capture_output=True, text=True).stdout


def chapters(text):
    """[[verse, ...] per chapter]: each verse a list of tokens, in canonical order."""
    result, verse = [], None
    for line in text.splitlines():
        if not line.strip():
            continue
        if _HEADING.match(line):
            result.append([])
            verse = None
            continue
        if not result:
            continue  # anything before the first heading
        if _VERSE.match(line):
            verse = []
            result[-1].append(verse)
            line = _VERSE.sub(" ", line, count=1)
        if verse is not None:
            verse.extend(_TOKEN.findall(line.lower()))
    return result


class Corpus:
    """The train and validation token streams as int64 ids, and the vocabulary.

    Attributes: ``words`` (id -> token), ``train`` and ``valid`` (int64 [N] tensors),
    ``unk`` and ``eos`` (the two special ids)."""

    def __init__(self, vocab_size=10000, text=None):
        if vocab_size < 3:
            raise ValueError(f"vocab_size must be at least 3, got {vocab_size}")
        parts = {"train": [], "valid": []}
        for c, chapter in enumerate(chapters(text if text is not None else read_text()), 1):
            stream = parts["valid" if c % EVERY == 0 else "train"]
            for verse in chapter:
                stream.extend(verse)
                stream.append("<eos>")
        counts = collections.Counter(t for t in parts["train"] if t != "<eos>")
        common = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:vocab_size - 2]
        self.words = [w for w, _ in common] + ["<unk>", "<eos>"]
        ids = {w: i for i, w in enumerate(self.words)}
        self.unk, self.eos = ids["<unk>"], ids["<eos>"]
        self.train = torch.tensor([ids.get(t, self.unk) for t in parts["train"]],
                                  dtype=torch.int64)
        self.valid = torch.tensor([ids.get(t, self.unk) for t in parts["valid"]],
                                  dtype=torch.int64)


def bptt_batch(data, start, bptt):
    """Rows ``start`` to ``start + bptt`` of batchified ``data`` [T, B] as the input, and the
    next token of each as the target: (x, y), both int64 [t, B], t <= bptt (shorter at the
    end of ``data``)."""
    y = data[start + 1:start + 1 + bptt]
    return data[start:start + len(y)], y


def batchify(stream, batch_size):
    """A token stream as ``batch_size`` contiguous rows, [T, batch_size] (the tail that does
    not fill a column is dropped), for truncated backpropagation through time."""
    t = len(stream) // batch_size
    return stream[:t * batch_size].view(batch_size, t).t().contiguous()

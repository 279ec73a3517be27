#!/usr/bin/env python3
"""llama.cpp itself loads hf2q's GGUF files and generates the same tokens
from them as from the converter's files.

Run by CI (.ci/run) with ``--outtypes q8_0``: building ``llama-simple``
alone (static, CPU) takes about 3 CPU-minutes, the checks under a minute
(docs/CONVERT.md gives the measured times). What it does:

1. finds ``llama-simple`` (greedy sampling): in ``--llama-bin DIR`` when
   given (a build of the pinned source, e.g. ``build/bin``), else builds it
   from the pinned llama-cpp-python sdist (the one scripts/make_golden.py
   uses; ``--cache``) with CMake into ``--build-dir`` (CPU, static, only that
   target);
2. for every family of ``--families`` makes a checkpoint folder from the
   committed tiny checkpoint and the committed tiny tokenizer beside it:
   Qwen3.5 MoE (tests/data/golden/qwen35moe_causal_lm/hf and
   tests/data/gguf/qwen35_tokenizer), Gemma 4
   (tests/data/gemma4/gemma4_moe_causal_lm/hf and
   tests/data/gguf/gemma4_tokenizer), the generic family's llama-like
   checkpoints of tests/data/gguf/generic/ that have a tokenizer (Llama 3
   style, Qwen3, Qwen3-MoE);
3. for every ``--outtypes``, writes its GGUF with ``hf2q.convert`` and with
   the converter (a subprocess: torch and transformers needed; the converter
   cannot name the tiny vocabularies' pre-tokenizers from its hash, so it is
   told the name hf2q reads from each tokenizer's regex);
4. runs ``llama-simple -n N PROMPT`` on both files and compares the
   generated text (stdout) and the number of tokens decoded, which must be
   non-zero.

    python scripts/check_llama_cpp.py --llama-bin /path/to/llama.cpp/build/bin
    python scripts/check_llama_cpp.py [--families qwen35moe gemma4] [--outtypes q8_0 bf16 f32] [--jobs 2]

Exit status 0 when every pair agrees; a table of the results either way.
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tarfile
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_golden as mg  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
DATA = REPO / "tests" / "data"

Case = tuple[str, Path, "Path | None", list[str], str]


def cases() -> dict[str, list[Case]]:
    """family -> (name, checkpoint folder, tokenizer folder, the converter's
    extra arguments, the pre-tokenizer name the converter is told: the tiny
    vocabularies are not in its hash table)"""
    out: dict[str, list[Case]] = {
        "qwen35moe": [("qwen35moe", DATA / "golden" / "qwen35moe_causal_lm" / "hf", DATA / "gguf" / "qwen35_tokenizer",
                       ["--no-mtp"], "qwen35")],
        "gemma4": [("gemma4", DATA / "gemma4" / "gemma4_moe_causal_lm" / "hf", DATA / "gguf" / "gemma4_tokenizer", [],
                    "")],
        "generic": [],
    }
    gen = DATA / "gguf" / "generic"
    pre = {"llama3": "llama-bpe", "qwen3": "qwen2", "qwen3_moe": "qwen2"}
    if gen.is_dir():
        for d in sorted(gen.iterdir()):
            # llama.cpp needs a vocabulary: the checkpoints without a tokenizer (mistral) are left out
            if (d / "config.json").is_file() and (d / "tokenizer.json").is_file():
                out["generic"].append((d.name, d, None, [], pre.get(d.name, "")))
    return out


def fetch_sdist(cache: Path) -> None:
    """The pinned llama-cpp-python sdist into ``cache`` (make_golden's
    fetch_converter then only extracts it). pip prepares an sdist's
    metadata while downloading it: in its own isolated build environment
    here, so that scikit-build-core need not be installed (make_golden's
    download, with --no-build-isolation, needs it). Only this package is
    taken as source: ``--no-binary :all:`` would also refuse wheels for that
    environment's build requirements, and pip then compiles CMake from its
    sdist (over ten minutes of a 2-core CI machine)."""
    sdist = cache / f"llama_cpp_python-{mg.LLAMA_CPP_PYTHON}.tar.gz"
    if sdist.is_file() or (cache / f"llama_cpp_python-{mg.LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
                           / "convert_hf_to_gguf.py").is_file():
        return
    cache.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "pip", "download", "--quiet", "--no-deps", "--no-binary", "llama-cpp-python",
                    f"llama-cpp-python=={mg.LLAMA_CPP_PYTHON}", "-d", str(cache)], check=True)


def llama_source(cache: Path) -> Path:
    mg.fetch_converter(cache)  # extracts the converter from the sdist
    root = cache / f"llama_cpp_python-{mg.LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if not (root / "CMakeLists.txt").is_file():
        with tarfile.open(cache / f"llama_cpp_python-{mg.LLAMA_CPP_PYTHON}.tar.gz") as tf:
            prefix = f"llama_cpp_python-{mg.LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
            tf.extractall(cache, members=[m for m in tf.getmembers() if m.name.startswith(prefix)], filter="data")
    return root


def build(src: Path, build_dir: Path, jobs: int) -> Path:
    """``llama-simple`` only (it links ggml and libllama, nothing else): CPU,
    static, no native CPU flags. OpenMP stays on: without it ggml's own
    thread pool spins while it waits, and on a busy 2-core machine one
    16-token generation of a tiny model took 24 s instead of 0.04 s."""
    exe = build_dir / "bin" / "llama-simple"
    if exe.is_file():
        return exe
    t0 = time.perf_counter()
    # -O1: the check compares the tokens two files give under one binary, so the
    # optimisation level cannot change its answer; -O1 compiles faster on CI's 2 cores.
    subprocess.run(["cmake", "-S", str(src), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF",
                    "-DCMAKE_C_FLAGS_RELEASE=-O1 -DNDEBUG", "-DCMAKE_CXX_FLAGS_RELEASE=-O1 -DNDEBUG",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                    "-DLLAMA_BUILD_TOOLS=OFF", "-DBUILD_SHARED_LIBS=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(build_dir), "--target", "llama-simple", "-j", str(jobs)], check=True)
    print(f"built llama-simple in {time.perf_counter() - t0:.0f} s", file=sys.stderr)
    return exe


#: Run the converter in a fresh interpreter; for the tiny Qwen vocabulary,
#: whose hash the converter's table cannot know, name its pre-tokenizer.
_RUN_CONVERTER = """
import sys
conv, pre = sys.argv[1], sys.argv[2]
sys.path[:0] = [conv + "/gguf-py", conv]
import conversion.base as base
if pre:
    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: pre
# Without the sentencepiece package the converter's first vocabulary attempt for Llama fails on
# its import instead of on the missing tokenizer.model: make it fail as it does with the package.
_spm = base.TextModel._create_vocab_sentencepiece
def _create_vocab_sentencepiece(self):
    if not (self.dir_model / "tokenizer.model").is_file():
        raise FileNotFoundError(self.dir_model / "tokenizer.model")
    return _spm(self)
base.TextModel._create_vocab_sentencepiece = _create_vocab_sentencepiece
import convert_hf_to_gguf
sys.argv = ["convert_hf_to_gguf.py", *sys.argv[3:]]
convert_hf_to_gguf.main()
"""


def converter_file(cache: Path, ckpt: Path, outtype: str, out: Path, extra: list[str], pre: str) -> None:
    conv = mg.fetch_converter(cache)
    r = subprocess.run([sys.executable, "-c", _RUN_CONVERTER, str(conv), pre, str(ckpt), "--outtype", outtype,
                        "--outfile", str(out), *extra], capture_output=True, text=True)
    if r.returncode != 0:
        raise RuntimeError(f"the converter failed on {ckpt} ({outtype}):\n{r.stderr[-3000:]}")


def generate(exe: Path, model: Path, prompt: str, n: int) -> tuple[str, int]:
    """The generated text and the number of tokens decoded."""
    r = subprocess.run([str(exe), "-m", str(model), "-n", str(n), prompt], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        raise RuntimeError(f"llama-simple failed on {model.name} (exit {r.returncode}):\n{r.stderr[-3000:]}")
    m = re.search(r"decoded (\d+) tokens", r.stderr)
    return r.stdout, int(m.group(1)) if m else -1


def checkpoint_folder(tmp: Path, name: str, ckpt: Path, tokenizer: Path | None) -> Path:
    """The checkpoint's files with the tokenizer's beside them (the tokenizer's win)."""
    ck = tmp / name
    ck.mkdir()
    for f in ckpt.iterdir():
        if f.is_file():
            (ck / f.name).symlink_to(f.resolve())
    for f in tokenizer.iterdir() if tokenizer else ():
        if (ck / f.name).exists():
            (ck / f.name).unlink()
        (ck / f.name).symlink_to(f.resolve())
    return ck


def main() -> int:
    import hf2q

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "hf2q-golden")
    ap.add_argument("--llama-bin", type=Path, help="a folder holding a built llama-simple (no build then)")
    ap.add_argument("--build-dir", type=Path, default=Path.home() / ".cache" / "hf2q-golden" / "llama-build")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--families", nargs="*", default=["qwen35moe", "gemma4", "generic"])
    ap.add_argument("--outtypes", nargs="*", default=["q8_0", "bf16", "f32"], choices=["q8_0", "f32", "bf16", "f16"])
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--prompt", default="the thing in the ring")
    args = ap.parse_args()
    fetch_sdist(args.cache)
    if args.llama_bin is not None:
        exe = args.llama_bin / "llama-simple"
        if not exe.is_file():
            sys.exit(f"{exe}: no such file (--llama-bin names the folder holding llama-simple)")
    else:
        exe = build(llama_source(args.cache), args.build_dir, args.jobs)
    table = cases()
    failed = 0
    rows = []
    with tempfile.TemporaryDirectory() as tmp_:
        tmp = Path(tmp_)
        for fam in args.families:
            if fam not in table:
                sys.exit(f"unknown family {fam!r} (have {', '.join(table)})")
            for name, ckpt, tokenizer, extra, pre in table[fam]:
                ck = checkpoint_folder(tmp, name, ckpt, tokenizer)
                for ot in args.outtypes:
                    ours, theirs = tmp / f"{name}-{ot}-hf2q.gguf", tmp / f"{name}-{ot}-converter.gguf"
                    try:
                        hf2q.convert(ck, ours, ot, force=True)
                        converter_file(args.cache, ck, ot, theirs, extra, pre)
                        a, na = generate(exe, ours, args.prompt, args.n)
                        b, nb = generate(exe, theirs, args.prompt, args.n)
                    except Exception as e:  # noqa: BLE001 (reported in the table)
                        rows.append((name, ot, "ERROR", str(e).splitlines()[0][:200]))
                        print(e, file=sys.stderr)
                        failed += 1
                        continue
                    ok = a == b and na == nb and na > 0 and a.strip() != ""
                    failed += not ok
                    rows.append((name, ot, "same" if ok else "DIFFER", f"{na} tokens: {a.strip()[:60]!r}"
                                 + ("" if ok else f" vs {nb}: {b.strip()[:60]!r}")))
                    for p in (ours, theirs):
                        p.unlink(missing_ok=True)
    for r in rows:
        print(f"{r[0]:<24} {r[1]:<5} {r[2]:<7} {r[3]}")
    if failed:
        print(f"FAIL: {failed} of {len(rows)} pairs differ (or failed)", file=sys.stderr)
        return 1
    print(f"OK: llama.cpp loads hf2q's files and generates the same tokens as from the converter's ({len(rows)} pairs)")
    return 0


if __name__ == "__main__":
    sys.exit(main())

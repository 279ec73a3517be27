#!/usr/bin/env python3
"""llama.cpp itself loads hf2q's GGUF file and generates the same tokens as
from the converter's file.

Not run in CI (building llama.cpp takes longer than the CI's budget on its
2-core runners). What it does:

1. takes llama.cpp's source from the pinned llama-cpp-python sdist (the one
   scripts/make_golden.py uses; ``--cache``), builds its CPU ``llama-simple``
   example (greedy sampling) with CMake into ``--build-dir``;
2. makes a checkpoint folder from the committed tiny Qwen3.5 MoE
   (tests/data/golden/qwen35moe_causal_lm/hf) and the tiny Qwen3.5 tokenizer
   (tests/data/gguf/qwen35_tokenizer);
3. writes its GGUF with ``hf2q.convert`` and with the converter (in this
   process, torch and transformers needed; the converter cannot name this
   small vocabulary's pre-tokenizer from its hash, so it is told
   ``qwen35``, the name hf2q reads from the tokenizer's regex);
4. runs ``llama-simple -n N PROMPT`` on both files and compares the
   generated text (stdout), which must also be non-empty.

    python scripts/check_llama_cpp.py [--outtype q8_0] [--jobs 2]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import make_golden as mg  # noqa: E402

REPO = Path(__file__).resolve().parent.parent
CKPT = REPO / "tests" / "data" / "golden" / "qwen35moe_causal_lm" / "hf"
TOKENIZER = REPO / "tests" / "data" / "gguf" / "qwen35_tokenizer"


def llama_source(cache: Path) -> Path:
    mg.fetch_converter(cache)  # downloads the sdist if needed
    root = cache / f"llama_cpp_python-{mg.LLAMA_CPP_PYTHON}" / "vendor" / "llama.cpp"
    if not (root / "CMakeLists.txt").is_file():
        with tarfile.open(cache / f"llama_cpp_python-{mg.LLAMA_CPP_PYTHON}.tar.gz") as tf:
            prefix = f"llama_cpp_python-{mg.LLAMA_CPP_PYTHON}/vendor/llama.cpp/"
            tf.extractall(cache, members=[m for m in tf.getmembers() if m.name.startswith(prefix)], filter="data")
    return root


def build(src: Path, build_dir: Path, jobs: int) -> Path:
    exe = build_dir / "bin" / "llama-simple"
    if exe.is_file():
        return exe
    subprocess.run(["cmake", "-S", str(src), "-B", str(build_dir), "-DCMAKE_BUILD_TYPE=Release", "-DGGML_NATIVE=OFF",
                    "-DLLAMA_CURL=OFF", "-DLLAMA_OPENSSL=OFF", "-DLLAMA_BUILD_TESTS=OFF", "-DLLAMA_BUILD_SERVER=OFF",
                    "-DBUILD_SHARED_LIBS=OFF", "-DGGML_OPENMP=OFF"], check=True)
    subprocess.run(["cmake", "--build", str(build_dir), "--target", "llama-simple", "-j", str(jobs)], check=True)
    return exe


def converter_file(cache: Path, ckpt: Path, outtype: str, out: Path) -> None:
    conv = mg.fetch_converter(cache)
    for p in (str(conv / "gguf-py"), str(conv)):
        if p not in sys.path:
            sys.path.insert(0, p)
    import conversion.base as base  # noqa: PLC0415

    base.TextModel.get_vocab_base_pre = lambda self, tokenizer: "qwen35"
    argv = sys.argv
    sys.argv = ["convert_hf_to_gguf.py", str(ckpt), "--outtype", outtype, "--outfile", str(out), "--no-mtp"]
    try:
        import convert_hf_to_gguf  # noqa: PLC0415

        convert_hf_to_gguf.main()
    finally:
        sys.argv = argv


def generate(exe: Path, model: Path, prompt: str, n: int) -> str:
    r = subprocess.run([str(exe), "-m", str(model), "-n", str(n), prompt], capture_output=True, text=True,
                       timeout=300)
    if r.returncode != 0:
        sys.exit(f"llama-simple failed on {model} (exit {r.returncode}):\n{r.stderr[-3000:]}")
    return r.stdout


def main() -> int:
    import hf2q

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cache", type=Path, default=Path.home() / ".cache" / "hf2q-golden")
    ap.add_argument("--build-dir", type=Path, default=Path.home() / ".cache" / "hf2q-golden" / "llama-build")
    ap.add_argument("--jobs", type=int, default=os.cpu_count() or 2)
    ap.add_argument("--outtype", default="q8_0", choices=["q8_0", "f32", "bf16"])
    ap.add_argument("-n", type=int, default=16)
    ap.add_argument("--prompt", default="the thing in the ring")
    args = ap.parse_args()
    exe = build(llama_source(args.cache), args.build_dir, args.jobs)
    with tempfile.TemporaryDirectory() as tmp:
        ck = Path(tmp) / "qwen35-tiny"
        ck.mkdir()
        for f in [*CKPT.iterdir(), *TOKENIZER.iterdir()]:
            (ck / f.name).symlink_to(f.resolve())
        ours, theirs = Path(tmp) / "hf2q.gguf", Path(tmp) / "converter.gguf"
        hf2q.convert(ck, ours, args.outtype)
        converter_file(args.cache, ck, args.outtype, theirs)
        a = generate(exe, ours, args.prompt, args.n)
        b = generate(exe, theirs, args.prompt, args.n)
    print(f"hf2q file:      {a!r}\nconverter file: {b!r}")
    if not a.strip() or a != b:
        print("FAIL: the generations differ (or are empty)", file=sys.stderr)
        return 1
    print("OK: llama.cpp loads hf2q's file and generates the same text as from the converter's")
    return 0


if __name__ == "__main__":
    sys.exit(main())

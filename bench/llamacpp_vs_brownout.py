#!/usr/bin/env python3
"""The quantised route against llama.cpp, side by side on the same GGUF and thread count.

Measures batch-1 decode (tokens/s) and the time to first token of a 512-token prompt (prompt
processing plus the last position's logits) for

  * brownout: `brownout-serve bench model --routes fallback --batches 1` (the fallback route:
    the file's Q4_1/Q8_0 weights repacked at load, int8 activations), RAYON_NUM_THREADS=N;
  * llama.cpp through llama-cpp-python (build it with `CMAKE_ARGS="-DGGML_NATIVE=ON"
    pip install llama-cpp-python`), n_threads = n_threads_batch = N, greedy argmax over the
    logits each step as ours does.

The two take turns, `--rounds` times, the order swapped every round; each ratio is the median
of the per-round ratios (a shared machine drifts by tens of percent over minutes). The last
stdout line is JSON.

  python3 bench/llamacpp_vs_brownout.py [--threads 2] [--rounds 5] [--steps 64]
      [--model ~/.cache/brownout/models/SmolLM2-135M-Instruct.Q4_1.gguf]
      [--brownout target/release/brownout-serve] [--omp-wait-policy passive|active]
      [--python VENV/bin/python] [--isa avx2|scalar]

`--python` runs the script under another interpreter (the venv llama-cpp-python was built in;
default: this one), so several builds can be compared: e.g. one with `-DGGML_NATIVE=ON` and one
restricted to AVX2 (`-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON
-DGGML_F16C=ON -DGGML_AVX512=OFF`). `--isa avx2` sets BROWNOUT_ISA for our side, which masks
AVX-512 in our kernels. The summary names llama.cpp's build (`llama_print_system_info`).
"""

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

PROMPT = 16  # tokens before decoding, as `bench model`


def default_model():
    d = os.environ.get("BROWNOUT_MODEL_DIR") or os.path.expanduser("~/.cache/brownout/models")
    return os.path.join(d, "SmolLM2-135M-Instruct.Q4_1.gguf")


def default_binary():
    t = os.environ.get("CARGO_TARGET_DIR") or os.path.join(
        os.path.dirname(os.path.abspath(__file__)), "..", "target")
    return os.path.join(t, "release", "brownout-serve")


def ours(args):
    """One `bench model` process; returns (decode tokens/s, TTFT ms)."""
    env = dict(os.environ, RAYON_NUM_THREADS=str(args.threads))
    if args.isa:
        env["BROWNOUT_ISA"] = args.isa
    cmd = [args.brownout, "bench", "model", "--model", args.model, "--device", "cpu",
           "--routes", "fallback", "--batches", "1", "--steps", str(args.steps),
           "--ttft-prompt", str(args.prompt), "--json"]
    out = subprocess.run(cmd, env=env, check=True, capture_output=True, text=True).stdout
    rep = json.loads(out)
    get = lambda what: next(r["value"] for r in rep["rows"]
                            if r["route"] == "fallback" and r["what"] == what)
    return get("decode batch 1"), get(f"TTFT {args.prompt}-token prompt"), rep["device"]


class LlamaCpp:
    def __init__(self, args):
        # ggml's OpenMP threads spin at barriers by default; on a shared, oversubscribed machine
        # that collapses llama.cpp (measured: 4 tok/s active against 23 passive, same minute),
        # so the default here is passive. Read by OpenMP when the library loads.
        os.environ.setdefault("OMP_WAIT_POLICY", args.omp_wait_policy)
        import numpy as np
        from llama_cpp import Llama

        self.np = np
        self.args = args
        self.llm = Llama(model_path=args.model, n_ctx=max(1024, args.prompt + 64),
                         n_batch=512, n_ubatch=512, n_threads=args.threads,
                         n_threads_batch=args.threads, verbose=False)
        self.vocab = self.llm.n_vocab()
        try:
            import llama_cpp

            info = llama_cpp.llama_print_system_info()
            self.system_info = info.decode() if isinstance(info, bytes) else str(info)
            self.version = llama_cpp.__version__
        except Exception as e:  # an older or newer binding without these
            self.system_info, self.version = f"unknown ({e})", "unknown"

    def argmax(self):
        logits = self.np.ctypeslib.as_array(self.llm._ctx.get_logits(), shape=(self.vocab,))
        return int(logits.argmax())

    def decode(self):
        """Tokens/s over `steps` greedy steps after a 16-token prompt (one untimed step)."""
        llm = self.llm
        llm.reset()
        llm.eval([(i * 104_729 + 17) % self.vocab for i in range(PROMPT)])
        tok = self.argmax()
        llm.eval([tok])
        tok = self.argmax()
        t0 = time.perf_counter()
        for _ in range(self.args.steps):
            llm.eval([tok])
            tok = self.argmax()
        return self.args.steps / (time.perf_counter() - t0)

    def ttft(self):
        """ms for the whole prompt in one call, as `bench model`'s TTFT."""
        llm = self.llm
        prompt = [(i * 104_729 + 3) % self.vocab for i in range(self.args.prompt)]
        llm.reset()
        t0 = time.perf_counter()
        llm.eval(prompt)
        self.argmax()
        return (time.perf_counter() - t0) * 1e3


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=default_model())
    ap.add_argument("--brownout", default=default_binary())
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--rounds", type=int, default=5)
    ap.add_argument("--steps", type=int, default=64)
    ap.add_argument("--prompt", type=int, default=512)
    ap.add_argument("--omp-wait-policy", default="passive",
                    help="OMP_WAIT_POLICY for llama.cpp unless set in the environment "
                         "(active: spin at barriers, ggml's default)")
    ap.add_argument("--python", default=None,
                    help="interpreter with llama-cpp-python installed (e.g. a venv's "
                         "bin/python); the script re-runs itself under it")
    ap.add_argument("--isa", default=None, choices=["avx2", "scalar"],
                    help="BROWNOUT_ISA for our side (avx2: AVX-512 masked)")
    args = ap.parse_args()
    # A venv's python is a symlink to the base interpreter (same realpath, other site-packages):
    # re-run once, marked in the environment.
    if args.python and os.environ.get("BROWNOUT_LLAMA_BENCH_CHILD") != "1":
        os.environ["BROWNOUT_LLAMA_BENCH_CHILD"] = "1"
        argv = sys.argv[1:]
        i = argv.index("--python") if "--python" in argv else None
        if i is not None:
            del argv[i:i + 2]
        else:
            argv = [a for a in argv if not a.startswith("--python=")]
        os.execv(args.python, [args.python, os.path.abspath(__file__), *argv])
    for path, what in [(args.model, "model (scripts/fetch-model.sh)"),
                       (args.brownout, "brownout-serve (cargo build --release -p brownout-serving)")]:
        if not os.path.exists(path):
            sys.exit(f"missing {what}: {path}")
    try:
        lc = LlamaCpp(args)
    except ImportError as e:
        sys.exit(f"llama-cpp-python is not installed ({e}); "
                 'CMAKE_ARGS="-DGGML_NATIVE=ON" pip install llama-cpp-python')
    print(f"llama-cpp-python {lc.version} ({sys.executable}): {lc.system_info.strip()}",
          flush=True)
    lc.ttft()  # warm-up: page in the weights, size the buffers
    lc.decode()
    rounds = []
    for i in range(args.rounds):
        r = {}
        order = ["ours", "llama"] if i % 2 == 0 else ["llama", "ours"]
        for who in order:
            if who == "ours":
                r["ours_decode"], r["ours_ttft_ms"], device = ours(args)
            else:
                r["llama_decode"] = lc.decode()
                r["llama_ttft_ms"] = lc.ttft()
        r["decode_ratio"] = r["ours_decode"] / r["llama_decode"]
        r["ttft_ratio"] = r["llama_ttft_ms"] / r["ours_ttft_ms"]
        rounds.append(r)
        print(f"round {i + 1}/{args.rounds}: decode ours {r['ours_decode']:.1f} vs llama.cpp "
              f"{r['llama_decode']:.1f} tok/s ({r['decode_ratio']:.2f}x); TTFT {args.prompt} "
              f"ours {r['ours_ttft_ms']:.0f} vs llama.cpp {r['llama_ttft_ms']:.0f} ms "
              f"(speed {r['ttft_ratio']:.2f}x)", flush=True)
    med = lambda k: statistics.median(r[k] for r in rounds)
    summary = {
        "threads": args.threads, "rounds": args.rounds, "steps": args.steps,
        "prompt": args.prompt, "model": os.path.basename(args.model), "brownout_device": device,
        "omp_wait_policy": os.environ.get("OMP_WAIT_POLICY"),
        "brownout_isa": args.isa or os.environ.get("BROWNOUT_ISA") or "best",
        "llama_cpp_python": lc.version, "llama_cpp_system_info": lc.system_info,
        "python": sys.executable,
        "ours_decode_tok_s": med("ours_decode"), "llama_decode_tok_s": med("llama_decode"),
        "decode_ratio_median": med("decode_ratio"),
        "decode_ratio_range": [min(r["decode_ratio"] for r in rounds),
                               max(r["decode_ratio"] for r in rounds)],
        "ours_ttft_ms": med("ours_ttft_ms"), "llama_ttft_ms": med("llama_ttft_ms"),
        "ttft_speed_ratio_median": med("ttft_ratio"),
        "ttft_speed_ratio_range": [min(r["ttft_ratio"] for r in rounds),
                                   max(r["ttft_ratio"] for r in rounds)],
        "rounds_detail": rounds,
    }
    print(f"batch-1 decode, ours / llama.cpp: {summary['decode_ratio_median']:.2f}x (median of "
          f"{args.rounds} paired rounds); TTFT {args.prompt}-token prompt, llama.cpp time / ours: "
          f"{summary['ttft_speed_ratio_median']:.2f}x ({args.threads} threads)")
    print(json.dumps(summary))


if __name__ == "__main__":
    main()

#!/usr/bin/env bash
# GPU check of the CUDA backend (serving/src/model/cuda/) on a machine with an NVIDIA GPU:
# builds in release and runs serving/tests/model_cuda.rs (every kernel against the CPU
# reference, whole forward passes, greedy generation) with BROWNOUT_REQUIRE_CUDA=1, so a test
# that would print SKIPPED fails instead. Output also goes to "$OUT/gpu-check.log" when OUT is set.
#
#   scripts/gpu-check.sh
#
# Needs libcuda (the driver) and libnvrtc.so.13 (CUDA 13 toolkit, or the PyPI wheel
# nvidia-cuda-nvrtc unpacked somewhere; point NVRTC_DIR at the folder holding libnvrtc.so.13).
# Then, when the tests pass and SmolLM2 was fetched (scripts/fetch-model.sh), the model
# benchmark on the GPU (`brownout-serve bench model --device cuda`: the start-up health check on
# both routes, decode batch 1/8/32 with fallback / primary paired at each, TTFT of a 512-token
# prompt, capacity per route), and bench/llamacpp_vs_brownout.py where llama-cpp-python exists.
set -uo pipefail
cd "$(dirname "$0")/.."

main() {
    echo "== gpu-check $(date -u +%FT%TZ) on $(hostname)"
    nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader \
        || echo "nvidia-smi not available"
    if ! ldconfig -p 2>/dev/null | grep -q 'libnvrtc\.so\.13'; then
        for d in ${NVRTC_DIR:-} /usr/local/cuda/lib64 /usr/local/cuda-13*/lib64 \
            /usr/local/cuda/targets/x86_64-linux/lib \
            /usr/local/lib/python3*/dist-packages/nvidia/cu13/lib \
            /usr/lib/python3/dist-packages/nvidia/cu13/lib \
            "$HOME"/.local/lib/python3*/site-packages/nvidia/cu13/lib \
            /var/tmp/nvrtc/wheel/nvidia/cu13/lib; do
            if [ -e "$d/libnvrtc.so.13" ]; then
                export LD_LIBRARY_PATH="$d${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}"
                break
            fi
        done
    fi
    echo "LD_LIBRARY_PATH=${LD_LIBRARY_PATH:-}"
    export BROWNOUT_REQUIRE_CUDA=1
    export RUST_LOG=${RUST_LOG:-info}
    local t0=$SECONDS
    cargo test -p brownout-serving --release --test model_cuda -- --include-ignored --nocapture --test-threads=1
    local rc=$?
    echo "== model_cuda: exit $rc after $((SECONDS - t0)) s"
    [ $rc -eq 0 ] || return $rc
    local gguf="${BROWNOUT_MODEL_DIR:-$HOME/.cache/brownout/models}/SmolLM2-135M-Instruct.Q4_1.gguf"
    if [ -e "$gguf" ]; then
        # The first end-to-end run of the CUDA path: load, place, health check on the GPU, then
        # decode batch 1/8/32 on both routes paired round by round (fallback / primary at every
        # batch size: the fallback runs on the CPU kernels even on a CUDA runner), TTFT of a
        # 512-token prompt, and capacity per route through the real engine (calls/s, flows/s).
        t0=$SECONDS
        cargo run -p brownout-serving --release --bin brownout-serve -- bench model \
            --model smollm2 --device cuda --steps 32 --batches 1,8,32 --ttft-prompt 512 \
            --capacity-secs 20
        rc=$?
        echo "== bench model (cuda): exit $rc after $((SECONDS - t0)) s"
        # The quantised route against llama.cpp on this machine's CPU (same GGUF, same threads),
        # when llama-cpp-python is installed here (CMAKE_ARGS="-DGGML_NATIVE=ON" pip install
        # llama-cpp-python; a machine without network cannot build it, and then this is skipped).
        if python3 -c "import llama_cpp" 2>/dev/null; then
            t0=$SECONDS
            python3 bench/llamacpp_vs_brownout.py --model "$gguf" \
                --brownout "${CARGO_TARGET_DIR:-target}/release/brownout-serve" \
                --threads "${LLAMACPP_THREADS:-2}" --rounds 3 --steps 64
            echo "== llamacpp_vs_brownout: exit $? after $((SECONDS - t0)) s"
        else
            echo "== llamacpp_vs_brownout skipped: llama-cpp-python not installed"
        fi
    else
        echo "== bench model skipped: SmolLM2 not fetched (scripts/fetch-model.sh)"
    fi
    return $rc
}

if [ -n "${OUT:-}" ]; then
    mkdir -p "$OUT"
    main 2>&1 | tee "$OUT/gpu-check.log"
    exit "${PIPESTATUS[0]}"
fi
main

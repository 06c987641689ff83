#!/usr/bin/env bash
# The one run a lent GPU gets (issue 29), within about 8 minutes (the tests at most 130 s, the profile PROFILE_S=150 s, the benchmark BENCH_S=270 s): the CUDA and Triton tests, then
# `python -m benchmarks.gpu` (every row beside the peers and beside our own torch calls, with the GPU
# kernels per call). Writes pytest.log, profile.md (benchmarks.gpu_profile), bench.log and gpu.md under $OUT (default results/gpu).
#
# Needs a python3 with CUDA torch, Triton, pytest and hypothesis (the lent machines' image has them);
# the peers (torch-struct 0.5, pytorch-crf 0.7.2, and conllu/tqdm where missing) travel as wheels in
# .whl/ (`pip download --no-deps ... -d .whl torch-struct==0.5 pytorch-crf==0.7.2`), installed here.
set -uo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT="${OUT:-results/gpu}"
mkdir -p "$OUT"
if compgen -G ".whl/*.whl" >/dev/null; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/*.whl && export PYTHONPATH=/tmp/site
fi
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1 TRITON_DEFAULT_FP_FUSION=1
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | tee "$OUT/gpu.txt"
python3 -c 'import torch, triton; print("torch", torch.__version__, "triton", triton.__version__)' | tee -a "$OUT/gpu.txt"
timeout 130 python3 -m pytest -q -p no:cacheprovider --maxfail 10 --timeout 60 -m "cuda or triton" \
    -k "not compile_for_an_h100_without_one" tests/test_cuda.py tests/test_triton.py tests/test_triton_scan.py tests/test_certified_triton.py \
    tests/test_language.py tests/test_mask.py 2>&1 | tee "$OUT/pytest.log"
timeout "${PROFILE_S:-150}" python3 -m benchmarks.gpu_profile --out "$OUT/profile.md" >/dev/null 2>"$OUT/profile.err"
timeout "${BENCH_S:-270}" python3 -m benchmarks.gpu --repeat "${REPEAT:-9}" --out "$OUT/gpu.md" 2>&1 | tee "$OUT/bench.log"

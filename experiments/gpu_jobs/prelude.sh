# Sourced by the GPU job scripts after `set -uo pipefail` (from the repo root on the GPU machine, wheels carried
# in .whl): installs the wheels, sets the environment, OUT (the script's first argument, else $OUT, else
# /tmp/out; made), writes OUT/gpus.txt and sets HW (h100 or h200, as the first card says; also OUT/hardware.txt).
python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --target /tmp/site .whl/*.whl 2>/dev/null || exit 1
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 NCCL_NVLS_ENABLE=0
OUT=${1:-${OUT:-/tmp/out}}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,memory.total --format=csv,noheader | tee "$OUT/gpus.txt"
case "$(head -1 "$OUT/gpus.txt")" in *H100*) HW=h100 ;; *) HW=h200 ;; esac
echo "$HW" > "$OUT/hardware.txt"

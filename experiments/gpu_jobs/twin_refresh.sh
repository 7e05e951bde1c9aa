#!/usr/bin/env bash
# One device call after a runtime change that moves step times: re-profile the step sections it touches, then
# run the fidelity workloads for real (records + step shapes come back packed), so the simulator can be
# re-scored on CPU against the runtime as it now stands.
#   bash experiments/gpu_jobs/twin_refresh.sh OUT [profile sections, default prefill,mixed,host]
set -uo pipefail
OUT=${1:-${OUT:-/tmp/out}}
SECTIONS=${2:-prefill,mixed,host}
PROFILE_TIMEOUT_S=${PROFILE_TIMEOUT_S:-240} bash experiments/gpu_jobs/profile.sh "$OUT" "profile.sections='$SECTIONS'"
FIDELITY_TIMEOUT_S=${FIDELITY_TIMEOUT_S:-330} bash experiments/gpu_jobs/fidelity.sh "$OUT"

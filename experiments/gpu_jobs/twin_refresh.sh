#!/usr/bin/env bash
# One device call after a runtime change that moves step times: re-profile the step sections it touches, then
# run the fidelity workloads for real on the same machine (records + step shapes come back packed), so the
# simulator can be re-scored on CPU against the runtime as it now stands. Lent H200 machines differ (host launch
# speed by up to 1.3-1.9x, large prefills by 1-3%): measure the profile and the real runs it is scored on together.
# With the defaults (prefill and mixed tables, all seven workloads) a call takes ~460 s of its 600.
#   bash experiments/gpu_jobs/twin_refresh.sh OUT [profile sections, default prefill,mixed]
set -uo pipefail
OUT=${1:-${OUT:-/tmp/out}}
SECTIONS=${2:-prefill,mixed}
PROFILE_TIMEOUT_S=${PROFILE_TIMEOUT_S:-225} bash experiments/gpu_jobs/profile.sh "$OUT" "profile.sections='$SECTIONS'"
FIDELITY_TIMEOUT_S=${FIDELITY_TIMEOUT_S:-335} bash experiments/gpu_jobs/fidelity.sh "$OUT"

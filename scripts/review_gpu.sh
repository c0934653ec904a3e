#!/usr/bin/env bash
# review_gpu.sh: scripts/steps.sh's end of a session on a real GPU host (~40 s on one H200, no compile): a GPU
# script ended by `timeout` in the middle of a step that keeps the GPU busy leaves nothing running.
#   1. child: a script on steps.sh (session_setup, then a step running a CUDA matmul loop for 100 s), ended by
#      `timeout 25` (SIGTERM to its process group; the step runs in a group of its own, timeout's)
#   2. checks, 3 s later: the step's python process, the child's nvidia-smi clock logger and any GPU compute
#      process of the step are gone; the child's clocks.csv holds samples (the real nvidia-smi logged)
#
#   source .gpu/env.sh && scripts/review_gpu.sh        (repository root; writes under $OUT; --help: this text)
# Pass: the last line reads "PASS" (each check prints ok / FAIL before it).
set -uo pipefail
source "$(dirname "$0")/steps.sh"
out="${OUT:-results/review}"; gpu_session "$out/logs" "$@"
child="$out/child"; mkdir -p "$child"
cat > "$out/child.sh" <<'SH'
set -uo pipefail
source "$REPO/scripts/steps.sh"
session_setup "$1/logs"
echo "$CLOCKS_PID" > "$1/logger"
step busy 120 python3 -c '
import os, sys, time
import torch
a = torch.randn(4096, 4096, device="cuda")
torch.cuda.synchronize()
open(sys.argv[1], "w").write(str(os.getpid()))  # on the GPU now
start = time.time()
while time.time() - start < 100:
    a = torch.nn.functional.normalize(a @ a)
    torch.cuda.synchronize()
' "$1/step"
echo "not reached: the step ended by itself"
SH
step child 60 env REPO="$PWD" timeout 25 bash "$out/child.sh" "$child"
sleep 3
fail=0
check() { if eval "$2"; then echo "ok: $1"; else echo "FAIL: $1"; fail=1; fi; }
gone() { local s; { read -r s < "/proc/$1/stat"; } 2>/dev/null || return 0; s=${s##*) }; [[ ${s%% *} == Z ]]; }
step_pid=$(cat "$child/step" 2>/dev/null); logger_pid=$(cat "$child/logger" 2>/dev/null)
check "the step reached the GPU (pid ${step_pid:-none})" '[[ -n $step_pid ]]'
check "the child was cut mid-step" '! grep -q "not reached" "$LOGS/child.log"'
check "the step's process is gone" '[[ -z $step_pid ]] || gone "$step_pid"'
check "the child's clock logger is gone" '[[ -z $logger_pid ]] || gone "$logger_pid"'
apps=$(nvidia-smi --query-compute-apps=pid --format=csv,noheader 2>/dev/null | tr -d ' ')
check "no GPU compute process of the step" '[[ -z $step_pid ]] || ! grep -qx "$step_pid" <<< "$apps"'
check "the child's clocks.csv has samples" '[[ $(grep -c MHz "$child/logs/clocks.csv" 2>/dev/null) -gt 3 ]]'
[[ -n $step_pid ]] && ! gone "$step_pid" && kill -9 "$step_pid"  # never leave it to load the next script's GPU
pack_logs "$out/logs.tgz"
echo "== compute apps after: ${apps:-none}"
if [[ $fail == 0 ]]; then echo PASS; else echo FAIL; exit 1; fi  # its own checks (the child's step is cut on purpose)

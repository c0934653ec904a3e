# steps.sh: the pieces every GPU-host script (scripts/<name>.sh) shares; source it first:
#   set -uo pipefail
#   source "$(dirname "$0")/steps.sh"
#   out="${OUT:-results/NAME}"; gpu_session "$out/logs" "$@"
#   step ...; ...; (the summary lines)
#   steps_exit
#
#   gpu_session DIR ARGS...   the scripts' preamble: help_from_header ARGS (--help: the header, exit 0, nothing
#                             made), then session_setup DIR. A script that reads its own arguments first calls
#                             help_from_header "$@" right after the source line and session_setup DIR later.
#   xdist_flag N              prints "-n N" where pytest-xdist is installed, else nothing (pytest runs serially):
#                             NPROC=$(xdist_flag 8); python3 -m pytest $NPROC ... N is capped at one worker per
#                             10 GB of the first GPU's memory (H200: 14, H100 80 GB: 8; session 35: 14 workers ran
#                             11 tests of suite part 1 out of memory on an H100, all passed at 3; session 37: 8
#                             ran one out of memory there, another worker's cache holding 20 GiB, so conftest now
#                             empties a worker's CUDA cache after a test when it holds more than its share of the
#                             card); SUITE_WORKERS=M gives M workers.
#   help_from_header ARGS...  with --help or -h as the first argument: prints the script's header comment (the
#                             "#" lines after the first line, "# " taken off) and exits 0; else does nothing.
#   session_setup DIR         LOGS=DIR (created); writes DIR/commit.txt (write_commit), DIR/gpu.txt
#                             (index, name, compute capability, driver, max SM clock, memory of each GPU) and starts
#                             DIR/clocks.csv (SM clock, power, temperature of each GPU every second), stopped when
#                             the script exits (a trap) or by pack_logs. The logger is not a job of the script: a
#                             bare `wait` does not wait for it. When the script ends (normally, by a signal, or
#                             SIGKILLed: a watchdog then acts within a second), a step still running is stopped
#                             too (SIGTERM to its process group): nothing the script started outlives it.
#   write_commit FILE         the tree's commit, one line, labelled with its source: .gpu/commit.txt's first line
#                             "+ (from .gpu/commit.txt)" when that file is there and not empty (the caller writes it
#                             before a GPU call: `git log --oneline -1 > .gpu/commit.txt`; .gpu/ is carried and
#                             git-ignored), else `git log --oneline -1` + " (git on this host)" ("unknown (git log gave no
#                             commit)" outside a checkout or without git): the copied tree's
#                             git metadata on a GPU host can be older than the tree (session 11: 813a508 for c8a3a0a).
#   step NAME LIMIT CMD...    runs CMD with a time limit (SIGINT at LIMIT seconds), its output in $LOGS/NAME.log,
#                             and prints "== NAME: rc=RC in Ts" (rc 124: timed out). With STEP_TAIL=N set, it
#                             also prints "== NAME (limit LIMITs)" first and the log's last N lines after. CMD
#                             runs in a process group of its own (timeout's). An rc other than 0 is noted for
#                             steps_exit (from a background step too).
#   step_failed NAME WHAT     notes NAME (WHAT: its rc, "skipped", ...) as not passed, for steps_exit
#   expect_passed COUNT       a script's summary of its step "pytest": "== pytest", the FAILED / ERROR / passed /
#                             failed lines of $LOGS/pytest.log, and step_failed pytest unless it says "COUNT passed"
#                             (tests/test_gpu_scripts*.py check COUNT against the tests the step selects)
#   ab_report DIR [LINES]     a script's summary of its step "speed_ab" (scripts/fa3_fp8_speed_ab.py --out DIR):
#                             "== speed_ab", the per-problem / A/A / ratio / FAILED lines of $LOGS/speed_ab.log (at
#                             most LINES, default 120) and the first 60 lines of DIR/summary.md
#   steps_exit                a GPU script's last command: exit 1 after "== not passed: NAME (WHAT) ..." when a
#                             step was noted, else exit 0. So the script's exit code is its steps', never its
#                             closing summary's (a grep that found nothing exits 1, a tail 0 whatever happened).
#   unpack_before [DIR]       DIR (default .before) holds fa_variants_before (scripts/ab_checkout.sh): unpacked from
#                             DIR.tar.xz (what a GPU call carries: [".gpu", ".before.tar.xz"]) when DIR lacks it;
#                             rc 1 when neither is there (scripts/before_pkg.py).
#   pack_logs ARCHIVE         stops the clock logger, then packs the folder $LOGS into ARCHIVE (tar.gz, the
#                             folder's own name at the top).
print_header() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

help_from_header() {
  if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then print_header; exit 0; fi
}

gpu_session() { local logs=$1; shift; help_from_header "$@"; session_setup "$logs"; }

unpack_before() { python3 "$(dirname "${BASH_SOURCE[0]}")/before_pkg.py" "${1:-.before}" > /dev/null; }

xdist_flag() {
  python3 -c "import xdist" 2>/dev/null || { echo ""; return; }
  local n=${SUITE_WORKERS:-$1} mib
  mib=$(nvidia-smi --query-gpu=memory.total --format=csv,noheader,nounits 2>/dev/null | head -n 1 | tr -d ' \r')
  if [ -z "${SUITE_WORKERS:-}" ] && [[ "$mib" =~ ^[0-9]+$ ]]; then
    local cap=$(( mib / 10000 > 0 ? mib / 10000 : 1 ))
    [ "$n" -gt "$cap" ] && n=$cap
  fi
  echo "-n $n"
}

session_setup() {
  LOGS=$1; mkdir -p "$LOGS"
  STEP_GROUPS=$(mktemp)  # the process group (timeout's pid) of every step started: stop_steps
  STEP_FAILED=$(mktemp)  # "NAME (WHAT)" of every step that did not pass, one a line: step_failed, steps_exit
  write_commit "$LOGS/commit.txt"
  nvidia-smi --query-gpu=index,name,compute_cap,driver_version,clocks.max.sm,memory.total --format=csv \
    > "$LOGS/gpu.txt" 2>&1
  # the logger, and a watchdog that stops it and the running steps within a second of the script's end when the
  # EXIT trap cannot run (the script SIGKILLed alone: `kill -9`, `timeout --foreground -s KILL`)
  CLOCKS_PID=$(nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv -lms 1000 \
    > "$LOGS/clocks.csv" 2>&1 & smi=$!
    (while kill -0 "$$"; do sleep 1; done; stop_steps
     mapfile -d '' argv < "/proc/$smi/cmdline" && [[ " ${argv[*]} " == *" -lms "* ]] && kill "$smi") > /dev/null 2>&1 &
    echo "$smi")
  trap end_session EXIT
}

write_commit() {
  local root given head
  root=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
  given=$(head -n 1 "$root/.gpu/commit.txt" 2>/dev/null)
  if [[ -n $given ]]; then echo "$given (from .gpu/commit.txt)"
  else
    head=$(git -C "$root" log --oneline -1 2>/dev/null | head -n 1)  # empty: no git, or not a checkout
    echo "${head:-unknown (git log gave no commit)} (git on this host)"
  fi > "$1"
}

stop_clocks() { [[ -z ${CLOCKS_PID:-} ]] || kill "$CLOCKS_PID" 2>/dev/null; CLOCKS_PID=""; }

# SIGTERM to the process group of every step still running (a step's timeout leads a group of its own, which
# a signal to the script's group does not reach), then forget them
stop_steps() {
  [[ -n ${STEP_GROUPS:-} && -f $STEP_GROUPS ]] || return 0
  local pid stat comm  # builtins only: a signal to the script's group ends any process started here
  while read -r pid; do
    { read -r stat < "/proc/$pid/stat" && read -r comm < "/proc/$pid/comm"; } 2>/dev/null || continue
    stat=${stat##*) }; stat=${stat#* * }; stat=${stat%% *}  # field 5, the process group
    [[ $stat == "$pid" && $comm == timeout ]] && kill -TERM -- "-$pid" 2>/dev/null
  done < "$STEP_GROUPS"
  rm -f "$STEP_GROUPS"
}

end_session() {  # not cut short by a second signal
  trap '' INT TERM HUP; stop_steps; stop_clocks; [[ -z ${STEP_FAILED:-} ]] || rm -f "$STEP_FAILED"; }

step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  [[ -n ${STEP_TAIL:-} ]] && echo "== $name (limit ${limit}s)"
  # started in the background and waited for: its pid (its process group's) goes to stop_steps, and a signal to
  # the script ends the wait at once (a foreground command would hold the script until it finished)
  # SIGINT at the limit (Python prints where it was), SIGKILL STEP_GRACE s later if that did not end it (a process
  # pool's shutdown can wait forever on workers that took the SIGINT)
  timeout -k "${STEP_GRACE:-10}" -s INT "$limit" "$@" <&0 > "$LOGS/$name.log" 2>&1 &  # (<&0: caller's stdin)
  local pid=$!
  [[ -z ${STEP_GROUPS:-} ]] || echo "$pid" >> "$STEP_GROUPS"
  wait "$pid"; local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0))s"
  (( rc == 0 )) || step_failed "$name" "rc=$rc"
  [[ -z ${STEP_TAIL:-} ]] || tail -n "$STEP_TAIL" "$LOGS/$name.log"; }

# a file, not a variable: a step run in the background (a subshell) is noted too
step_failed() { [[ -z ${STEP_FAILED:-} ]] || echo "$1 ($2)" >> "$STEP_FAILED"; }

expect_passed() {
  echo "== pytest"; grep -E "^(FAILED|ERROR)|passed|failed" "$LOGS/pytest.log" | tail -n 12
  grep -qE "(^|[^0-9])$1 passed" "$LOGS/pytest.log" || step_failed pytest "not $1 passed"
}

ab_report() {
  echo "== speed_ab"; grep -E "^d[0-9]+ N|FAILED|A/A|/new" "$LOGS/speed_ab.log" | head -n "${2:-120}"
  cat "$1/summary.md" 2>/dev/null | head -n 60
}

steps_exit() {
  local failed=""
  [[ -n ${STEP_FAILED:-} && -s $STEP_FAILED ]] && failed=$(paste -sd ' ' "$STEP_FAILED")
  if [[ -n $failed ]]; then echo "== not passed: $failed"; exit 1; fi
  exit 0
}

pack_logs() {
  stop_clocks
  tar -C "$(dirname "$LOGS")" -czf "$1" "$(basename "$LOGS")"
}

# steps.sh: the pieces every GPU-host script (scripts/<name>.sh) shares; source it first:
#   source "$(dirname "$0")/steps.sh"; help_from_header "$@"
#   out="${OUT:-results/NAME}"; session_setup "$out/logs"
#
#   help_from_header ARGS...  with --help or -h as the first argument: prints the script's header comment (the
#                             "#" lines after the first line, "# " taken off) and exits 0; else does nothing.
#   session_setup DIR         LOGS=DIR (created); writes DIR/commit.txt (git log --oneline -1), DIR/gpu.txt
#                             (index, name, compute capability, driver, max SM clock, memory of each GPU) and starts
#                             DIR/clocks.csv (SM clock, power, temperature of each GPU every second), stopped when
#                             the script exits (a trap) or by pack_logs. The logger is not a job of the script: a
#                             bare `wait` does not wait for it.
#   step NAME LIMIT CMD...    runs CMD with a time limit (SIGINT at LIMIT seconds), its output in $LOGS/NAME.log,
#                             and prints "== NAME: rc=RC in Ts" (rc 124: timed out). With STEP_TAIL=N set, it
#                             also prints "== NAME (limit LIMITs)" first and the log's last N lines after.
#   pack_logs ARCHIVE         stops the clock logger, then packs the folder $LOGS into ARCHIVE (tar.gz, the
#                             folder's own name at the top).
print_header() { awk 'NR > 1 && /^#/ { sub(/^# ?/, ""); print; next } NR > 1 { exit }' "$0"; }

help_from_header() {
  if [[ "${1:-}" == "--help" || "${1:-}" == "-h" ]]; then print_header; exit 0; fi
}

session_setup() {
  LOGS=$1; mkdir -p "$LOGS"
  git log --oneline -1 > "$LOGS/commit.txt" 2>&1
  nvidia-smi --query-gpu=index,name,compute_cap,driver_version,clocks.max.sm,memory.total --format=csv \
    > "$LOGS/gpu.txt" 2>&1
  CLOCKS_PID=$(nvidia-smi --query-gpu=timestamp,index,clocks.sm,power.draw,temperature.gpu --format=csv -lms 1000 \
    > "$LOGS/clocks.csv" 2>&1 & echo $!)
  trap stop_clocks EXIT
}

stop_clocks() { [[ -z ${CLOCKS_PID:-} ]] || kill "$CLOCKS_PID" 2>/dev/null; CLOCKS_PID=""; }

step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  [[ -n ${STEP_TAIL:-} ]] && echo "== $name (limit ${limit}s)"
  timeout -s INT "$limit" "$@" > "$LOGS/$name.log" 2>&1; local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0))s"
  [[ -z ${STEP_TAIL:-} ]] || tail -n "$STEP_TAIL" "$LOGS/$name.log"; }

pack_logs() {
  stop_clocks
  tar -C "$(dirname "$LOGS")" -czf "$1" "$(basename "$LOGS")"
}

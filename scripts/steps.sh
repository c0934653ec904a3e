# steps.sh: sourced by the GPU-host scripts (scripts/<name>.sh) after they set LOGS, a folder.
#   step NAME LIMIT CMD...   runs CMD with a time limit (SIGINT at LIMIT seconds), its output in $LOGS/NAME.log,
#                            and prints "== NAME: rc=RC in Ts".
step() { local name=$1 limit=$2; shift 2; local t0=$SECONDS
  timeout -s INT "$limit" "$@" > "$LOGS/$name.log" 2>&1; local rc=$?
  echo "== $name: rc=$rc in $((SECONDS - t0))s"; }

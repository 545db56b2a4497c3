#!/bin/bash
# A runc wrapper for hosts that withhold CAP_SYS_RESOURCE from every process (this project's
# build machines do). A privileged container asks runc for every capability, and runc fails with
# "unable to apply caps: operation not permitted" when one of them is not in its own bounding set.
# This wrapper deletes CAP_SYS_RESOURCE from the OCI bundle's config.json (create, run) or from
# the process file (exec) and then runs the real runc. Everything else passes through untouched.
#
# Installed twice: on the host as Docker's default runtime, and inside each Kind node as
# /usr/sbin/runc, because the node's containerd starts privileged pods (the CSI node plugin) too.
# The installer replaces the REAL_RUNC line below with the path of the real binary.
REAL_RUNC=/usr/sbin/runc.real

strip_caps() {
  local file=$1 filter=$2 tmp
  [ -f "$file" ] || return 0
  tmp=$(mktemp "${file}.XXXXXX") || return 1
  if jq "$filter" "$file" >"$tmp"; then mv "$tmp" "$file"; else rm -f "$tmp"; return 1; fi
}

command="" bundle="" process=""
args=("$@")
for ((i = 0; i < ${#args[@]}; i++)); do
  case "${args[$i]}" in
    create | run | exec) [ -z "$command" ] && command=${args[$i]} ;;
    --bundle | -b) bundle=${args[$((i + 1))]} ;;
    --bundle=*) bundle=${args[$i]#--bundle=} ;;
    --process | -p) process=${args[$((i + 1))]} ;;
    --process=*) process=${args[$i]#--process=} ;;
  esac
done

drop='map(select(. != "CAP_SYS_RESOURCE"))'
case "$command" in
  create | run)
    strip_caps "${bundle:-.}/config.json" \
      "if .process.capabilities then .process.capabilities |= with_entries(.value |= (. // [] | $drop)) else . end" || exit 1
    ;;
  exec)
    [ -n "$process" ] && { strip_caps "$process" \
      "if .capabilities then .capabilities |= with_entries(.value |= (. // [] | $drop)) else . end" || exit 1; }
    ;;
esac
exec "$REAL_RUNC" "$@"

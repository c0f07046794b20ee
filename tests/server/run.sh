#!/usr/bin/env bash
# Runs one server test file (node --test FILE) under setsid, for at most 270 s, and kills every process still in
# that setsid group when it ends: no megactx process a test started can outlive it and keep ctest (which waits
# for every holder of the output pipe) waiting past the test's TIMEOUT.
# Usage: run.sh NODE ARGS...
setsid timeout -k 5 270 "$@" &
pid=$!
trap 'pkill -KILL -s "$pid" 2>/dev/null || true' EXIT
trap 'exit 143' TERM INT
wait "$pid"

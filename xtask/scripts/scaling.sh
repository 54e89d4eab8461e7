#!/usr/bin/env bash
# Issue 29's check on a big host, for a machine that has no Rust toolchain (a borrowed one):
# `calls --threads T` flat out, recorded by `--pid` with the default rings and workers, for each
# T in $THREADS; one line per run: events/s, lost, the daemon's own CPU and CPU per 1M events.
# The same measurement as the issue's table (`--exits return --duration 10`), on whatever CPUs
# the machine has.
#
# Build here first: `cargo xtask build` (the release daemon) and any `cargo xtask test` run
# (which builds `target/fixtures/calls-c`), then on the big host, from the repository root,
# with those two files carried along:
#   xtask/scripts/scaling.sh [OUT_DIR]
# Needs root and BPF; extra daemon arguments in $ARGS (e.g. ARGS="--workers 1").
set -euo pipefail
daemon=${DAEMON:-target/release/fdr-profiled}
calls=${CALLS:-target/fixtures/calls-c}
out=${1:-/tmp/fdr-scaling}
threads=${THREADS:-1 4 8 16}
secs=${SECS:-10}
for f in "$daemon" "$calls"; do
    [[ -x $f ]] || { echo "scaling.sh: $f is missing: build it first (see the top of this script)" >&2; exit 1; }
done
[[ $(id -u) == 0 ]] || { echo "scaling.sh: needs root (BPF)" >&2; exit 1; }
mkdir -p "$out"
echo "# $(nproc) CPUs, kernel $(uname -r), $(date -u +%FT%TZ); ARGS=${ARGS:-}"
echo "threads events events/s lost daemon_cpu_s cpu_ms_per_1M"
# Seconds of CPU (user + system) of this shell's finished children: bash's `times`, run in this
# shell (in a command substitution it would report the subshell's children).
child_cpu() {
    times >"$out/times"
    tail -1 "$out/times" | awk '{ split($1, u, "m"); split($2, s, "m"); print u[1] * 60 + u[2] + s[1] * 60 + s[2] }'
}
for t in $threads; do
    dir="$out/threads-$t"
    rm -rf "$dir"
    "$calls" --threads "$t" --seconds $((secs + 8)) --quiet >/dev/null 2>&1 &
    workload=$!
    sleep 0.3
    child_cpu >"$out/before"
    # shellcheck disable=SC2086
    "$daemon" --pid "$workload" --exits return --duration "$secs" --no-report ${ARGS:-} \
        --out "$dir" >"$dir.out" 2>"$dir.err" || { echo "threads $t: the daemon failed:"; tail -3 "$dir.err"; }
    child_cpu >"$out/after"
    kill "$workload" 2>/dev/null || true
    wait "$workload" 2>/dev/null || true
    events=$(grep -o '"events": *[0-9]*' "$dir/session.json" | head -1 | grep -o '[0-9]*$')
    lost=$(grep -o '"events_lost": *[0-9]*' "$dir/session.json" | head -1 | grep -o '[0-9]*$')
    awk -v t="$t" -v e="$events" -v l="$lost" -v b="$(cat "$out/before")" -v a="$(cat "$out/after")" -v s="$secs" \
        'BEGIN { c = a - b; printf "%d %d %.2fM %d %.2f %.1f\n", t, e, e / s / 1e6, l, c, c * 1e3 / (e / 1e6) }'
    rm -rf "$dir"
done

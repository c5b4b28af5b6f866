#!/usr/bin/env bash
# The side-by-side table of docs/performance.md: Go nsqd and nsqtw measured in one run on one machine.
#
#   benchmarks/report.sh PATH/TO/GO/nsqd [EXTRA nsqtw-bench compare FLAGS...]
#
# Go's bench_writer and bench_reader are taken from beside the Go nsqd. nsqtw runs from this
# checkout (its directory is put first on PYTHONPATH). Prints the machine line, the daemons and
# the Markdown table on stdout; progress goes to stderr. Extra flags come last, so they win
# (--runs=1 --runfor=3s for a quick look).
set -euo pipefail
if [ $# -lt 1 ]; then
    echo "usage: $0 PATH/TO/GO/nsqd [nsqtw-bench compare flags...]" >&2
    exit 2
fi
go_nsqd="$(cd "$(dirname "$1")" && pwd)/$(basename "$1")"
shift
cd "$(dirname "$0")/.."
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}"
exec python -m nsqtw.tools.bench compare --go-nsqd="$go_nsqd" \
    --measures=write,read,round_trip,pub,latency_p99,idle_rss,memory --runs=2 --runfor=10s "$@"

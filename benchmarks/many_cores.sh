#!/usr/bin/env bash
# Go nsqd and nsqtw side by side on a many-core machine with Go's own bench tools, which start one
# goroutine a core (16 publishers or consumers on 16 cores): MPUB write, read (RDY 2500) and one-message
# round trips, each daemon with default flags, alternating, ROUNDS rounds of RUN each. Prints ops/s and
# the cores each daemon's process tree used (from /proc); for nsqtw also each of its processes' cores
# (the core first, by pid) and, halfway through each load, the TCP sockets each process holds beyond
# those it held idle: how the clients' connections were spread over the workers.
#
#   benchmarks/many_cores.sh GO/bin [TWISTD]        # env: RUN=6s ROUNDS=2 NSQTW_FLAGS='--busy-poll=0'
#
# LOADS (default "write read rt") picks the loads, in order, on one fresh daemon per round (a read
# needs a write before it); LOADS=rt measures round trips on daemons that did nothing else.
#
# GO/bin holds Go NSQ v1.3.0's nsqd, bench_writer and bench_reader; TWISTD is the twistd of an install of
# nsqtw (default: the one on PATH). The daemons listen on 127.0.0.1:4150/4151 and keep data in a temp dir.
set -u
BIN=$(realpath -s "${1:?usage: many_cores.sh GO/bin [TWISTD]}"); TW=$(realpath -s "${2:-$(command -v twistd)}")
R=${RUN:-6s}; ROUNDS=${ROUNDS:-2}; D=$(mktemp -d)
echo "nproc $(nproc), $("${TW%/*}/python" --version 2>&1), nsqtw flags '${NSQTW_FLAGS:-}'"
TCK=$(getconf CLK_TCK)
tree() { echo "$1"; for c in $(cat /proc/"$1"/task/*/children 2>/dev/null); do tree "$c"; done; }
# "pid:ticks" (user and system CPU) and "pid:sockets" for each process of the tree, in pid order
ticks() { for p in $(tree "$1" | sort -n); do echo "$p:$(awk '{print $14+$15}' /proc/"$p"/stat 2>/dev/null || echo 0)"; done; }
cpu() { ticks "$1" | awk -F: '{s += $2} END {print s + 0}'; }
socks() { for p in $(tree "$1" | sort -n); do echo "$p:$(ls -l /proc/"$p"/fd 2>/dev/null | grep -c socket)"; done; }
# per pid: (after - before) ticks as cores over $3 seconds, or after - before counts ($3 = 1)
per() { python3 -c "import sys
a = dict(x.split(':') for x in sys.argv[1].split()); b = dict(x.split(':') for x in sys.argv[2].split())
print(' '.join(str(round((int(b[p]) - int(a.get(p, 0))) / float(sys.argv[3]), 2)) for p in sorted(b, key=int)))" "$1" "$2" "$3"; }
wait_ping() { python3 -c "import time, urllib.request as u
for i in range(200):
    try: u.urlopen('http://127.0.0.1:4151/ping', timeout=1); break
    except Exception: time.sleep(0.1)
else: raise SystemExit('no /ping answer')"; }
one() {
  rm -rf "$D"/data; mkdir -p "$D"/data
  if [ "$1" = go ]; then
    env -C "$D"/data "$BIN"/nsqd --tcp-address=127.0.0.1:4150 --http-address=127.0.0.1:4151 --data-path="$D"/data >"$D"/log 2>&1 &
  else
    # shellcheck disable=SC2086
    env -C "$D"/data "$TW" -n --pidfile= nsqtw --tcp-address=127.0.0.1:4150 --http-address=127.0.0.1:4151 \
      --data-path="$D"/data ${NSQTW_FLAGS:-} >"$D"/log 2>&1 &
  fi
  local P=$!; wait_ping || { tail -20 "$D"/log; kill $P; wait $P 2>/dev/null; return; }
  for load in ${LOADS:-write read rt}; do
    case $load in
      write) set -- write bench_writer -topic=bw ;;
      read) set -- read bench_reader -topic=bw ;;
      rt) set -- rt bench_writer -topic=bp -batch-size=1 ;;
      *) echo "unknown load $load"; continue ;;
    esac
    local kind=$1 prog=$2; shift 2
    local c0 t0 c1 t1 ops e0 e1 s0 s1 half; c0=$(cpu $P); e0=$(ticks $P); s0=$(socks $P); t0=$(date +%s.%N)
    "$BIN/$prog" -nsqd-tcp-address=127.0.0.1:4150 -runfor="$R" "$@" >"$D"/bench 2>&1 &
    half=$(python3 -c "print(float('${R%s}') / 2)"); sleep "$half"; s1=$(socks $P)
    wait $!; ops=$(grep -o '[0-9.]*ops/s' "$D"/bench | tail -1)
    c1=$(cpu $P); e1=$(ticks $P); t1=$(date +%s.%N)
    echo "$T $kind $ops daemon-cores $(python3 -c "print(round(($c1 - $c0) / $TCK / ($t1 - $t0), 2))")"
    if [ "$T" = nsqtw ]; then
      echo "  each process's cores: $(per "$e0" "$e1" "$(python3 -c "print($TCK * ($t1 - $t0))")")"
      echo "  each process's sockets beyond idle, halfway: $(per "$s0" "$s1" 1)"
    fi
  done
  kill $P; wait $P 2>/dev/null
}
for _ in $(seq "$ROUNDS"); do for T in go nsqtw; do one $T; done; done
rm -rf "$D"

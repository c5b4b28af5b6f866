#!/usr/bin/env bash
# The NSQ client libraries' own test suites, with their own harnesses, against nsqtw --workers=N (or Go nsqd):
# gnsq 1.0.2, ansq 0.3.0 and pynsq 0.9.1 from their PyPI sdists (ansq's harness and pynsq's tests, which
# the sdists lack, from their repositories: ANSQ_CONFTEST, PYNSQ_TESTS below), go-nsq from the Go module proxy
# or, where the proxy cannot be reached, from GO_NSQ_DIR: a go-nsq source tree with a go.mod whose
# dependencies are local (`replace github.com/golang/snappy => /abs/path`), built offline.
#
#   benchmarks/client_suites.sh WORKERS RUNS [GO/bin]     # e.g. benchmarks/client_suites.sh 2 3
#   benchmarks/client_suites.sh go 1 GO/bin               # the reference: Go nsqd v1.3.0 and nsqlookupd
#
# Each harness starts `nsqd` (and `nsqlookupd`) by name: the script writes wrappers of those names that
# `exec` twistd (`-n nsqtw --workers=WORKERS`, `-n nsqtw-lookupd`) from this checkout with the Python that
# runs it (NSQTW_PYTHON, default `python3` on PATH, which must have nsqtw's dependencies), so a harness's
# kill reaches the core itself, and puts them first on PATH. The suites run in a virtualenv of their own
# under WORK (default /tmp/nsqtw-client-suites); it needs PyPI (and apt and the Go module proxy for go-nsq).
# SUITES (default "gnsq ansq pynsq go-nsq") chooses the suites. Prints one line per suite and run:
# passed/failed/errors, or why the suite could not run. Exit status 1 when a suite that ran had a failure.
set -u
WORKERS=${1:?usage: client_suites.sh WORKERS|go RUNS [GO/bin]}; RUNS=${2:-1}; GOBIN=${3:-}
ROOT=$(cd "$(dirname "$0")/.." && pwd)
WORK=${WORK:-/tmp/nsqtw-client-suites}
PY=${NSQTW_PYTHON:-$(command -v python3)}
mkdir -p "$WORK"/sdist "$WORK"/logs
status=0
want() { case " ${SUITES:-gnsq ansq pynsq go-nsq} " in *" $1 "*) return 0 ;; *) return 1 ;; esac; }

# -- the wrappers named nsqd and nsqlookupd ----------------------------------------------------------------
BIN="$WORK/bin-$WORKERS"; rm -rf "$BIN"; mkdir -p "$BIN"
if [ "$WORKERS" = go ]; then
  [ -x "$GOBIN/nsqd" ] || { echo "go: GO/bin with nsqd and nsqlookupd needed"; exit 2; }
  ln -s "$(cd "$GOBIN" && pwd)"/nsqd "$(cd "$GOBIN" && pwd)"/nsqlookupd "$BIN"/
else
  TWISTD=$("$PY" -c 'import sys; sys.path.insert(0, sys.argv[1]); from nsqtw.tools.daemons import TWISTD; print(TWISTD)' "$ROOT")
  for pair in "nsqd:nsqtw --workers=$WORKERS" "nsqlookupd:nsqtw-lookupd"; do
    cat >"$BIN/${pair%%:*}" <<EOF
#!/bin/sh
export PYTHONPATH="$ROOT\${PYTHONPATH:+:\$PYTHONPATH}"
exec "$PY" -c "$TWISTD" --pidfile= -n ${pair#*:} "\$@"
EOF
    chmod +x "$BIN/${pair%%:*}"
  done
fi
export PATH="$BIN:$PATH"
echo "# $(nsqd --version 2>&1 | head -1); workers=$WORKERS; runs=$RUNS; $(nproc) cores"

# -- the suites' virtualenv and sources --------------------------------------------------------------------
VENV="$WORK/venv"
if want gnsq || want ansq || want pynsq; then
if [ ! -x "$VENV/bin/python" ]; then
  python3 -m venv "$VENV"
  "$VENV"/bin/pip install -q pytest pytest-timeout mock gevent blinker six urllib3 python-snappy \
    pytest-asyncio aiohttp attrs tornado==6.0.4 >"$WORK"/logs/pip.log 2>&1 || { echo "pip install failed"; exit 2; }
fi
cd "$WORK"/sdist
[ -d gnsq-1.0.2 ] && [ -d ansq-0.3.0 ] && [ -d pynsq-0.9.1 ] || {
  "$VENV"/bin/pip download -q --no-binary :all: --no-deps gnsq==1.0.2 ansq==0.3.0 pynsq==0.9.1 >>"$WORK"/logs/pip.log 2>&1
  for f in gnsq-1.0.2.tar.gz ansq-0.3.0.tar.gz pynsq-0.9.1.tar.gz; do tar xzf "$f"; done; }
fi

summary() { # the pytest closing line of log $1
  grep -E '(passed|failed|error).* in [0-9.]+s' "$1" | tail -1 | sed 's/=//g; s/^ *//; s/ *$//'; }

suite() { # NAME VERSION PYTHON [PYTEST ARGS...]: the suite in NAME-VERSION/tests, RUNS times, a line per run
  local name=$1 version=$2 py=$3 run log; shift 3
  for run in $(seq 1 "$RUNS"); do
    log="$WORK/logs/$name-$WORKERS-$run.log"
    (cd "$name-$version" && timeout 900 "$py" -m pytest -p no:cacheprovider -q "$@" tests >"$log" 2>&1) \
      || status=1
    echo "$name $version workers=$WORKERS run $run: $(summary "$log") (log $log)"
    grep -E '^(FAILED|ERROR) ' "$log" | sed 's/^/    /'
  done; }

# -- gnsq: tests/integration_server.py starts nsqd/nsqlookupd by name on port 0, SIGTERM at the end ---------
want gnsq && suite gnsq 1.0.2 "$VENV"/bin/python

# -- ansq: its sdist has tests/test_*.py but not tests/conftest.py, the harness (fixtures nsqd, create_nsqd,
# create_nsqlookupd: nsqd on 127.0.0.1:4150, SIGKILLed after each test, /ping awaited 3 s at each start).
# ANSQ_CONFTEST names that file from ansq's repository (github.com/list-family/ansq, tests/conftest.py of
# the 0.3.0 era); the suite needs pytest-asyncio's event_loop fixture (before 0.22): a virtualenv of its own.
if ! want ansq; then :
elif [ ! -f ansq-0.3.0/tests/conftest.py ] && [ -n "${ANSQ_CONFTEST:-}" ] && [ -f "$ANSQ_CONFTEST" ]; then
  cp "$ANSQ_CONFTEST" ansq-0.3.0/tests/conftest.py
fi
if ! want ansq; then :
elif [ -f ansq-0.3.0/tests/conftest.py ]; then
  AVENV="$WORK/venv-ansq"
  [ -x "$AVENV/bin/python" ] || { python3 -m venv "$AVENV" && "$AVENV"/bin/pip install -q "pytest<8" \
    "pytest-asyncio==0.21.*" aiohttp async_generator attrs >>"$WORK"/logs/pip.log 2>&1; }
  suite ansq 0.3.0 "$AVENV"/bin/python -o asyncio_mode=auto
else
  echo "ansq 0.3.0: not run: its sdist has tests/test_*.py but not tests/conftest.py, which defines the" \
       "fixtures that start nsqd/nsqlookupd; name that file from ansq's repository in ANSQ_CONFTEST"
fi

# -- pynsq: its sdist has the nsq package only. PYNSQ_TESTS names the tests/ folder of its repository
# (github.com/nsqio/pynsq: test_reader.py's IntegrationBase starts nsqd on 4150/4151, and nsqlookupd, waits
# for /ping, SIGKILLs them after each test; test_writer.py; cert.pem and key.pem, any self-signed pair);
# the suite needs pytest before 7 and tornado 6.0: a virtualenv of its own.
if ! want pynsq; then :
elif [ -n "${PYNSQ_TESTS:-}" ] && [ -f "$PYNSQ_TESTS/test_reader.py" ]; then
  rm -rf pynsq-0.9.1/tests && cp -r "$PYNSQ_TESTS" pynsq-0.9.1/tests
  PVENV="$WORK/venv-pynsq"
  [ -x "$PVENV/bin/python" ] || { python3 -m venv "$PVENV" && "$PVENV"/bin/pip install -q "pytest<7" \
    "tornado==6.0.4" python-snappy mock >>"$WORK"/logs/pip.log 2>&1; }
  suite pynsq 0.9.1 "$PVENV"/bin/python
else
  echo "pynsq 0.9.1: not run: its sdist has the nsq package only; name its repository's tests/ folder in" \
       "PYNSQ_TESTS"
fi

# -- go-nsq: its test.sh starts nsqlookupd and nsqd (TLS flags, ./test certificates) and runs go test ------
if ! want go-nsq; then :
elif ! command -v go >/dev/null && ! apt-get install -y golang-go >"$WORK"/logs/apt.log 2>&1; then
  echo "go-nsq: not run: no Go toolchain (apt-get install golang-go failed, see $WORK/logs/apt.log)"
else
  export GOPATH="$WORK/gopath" GOFLAGS=-modcacherw
  mkdir -p "$WORK"/gomod && cd "$WORK"/gomod
  [ -f go.mod ] || go mod init client-suites >/dev/null 2>&1
  if [ -n "${GO_NSQ_DIR:-}" ]; then
    dir=$(cd "$GO_NSQ_DIR" && pwd)
    export GOFLAGS=-mod=mod GOPROXY=off GOSUMDB=off
  elif ! out=$(timeout 120 go mod download -json github.com/nsqio/go-nsq@latest 2>&1) \
     || grep -q '"Error"' <<<"$out"; then
    echo "go-nsq: not run: go mod download failed: $(grep -o '"Error": .*' <<<"$out" | head -1)"; dir=""
  else
    dir=$(sed -n 's/.*"Dir": "\(.*\)",/\1/p' <<<"$out")
  fi
  if [ -n "$dir" ]; then
    for run in $(seq 1 "$RUNS"); do
      log="$WORK/logs/go-nsq-$WORKERS-$run.log"; rm -rf "$WORK/go-nsq"; cp -r "$dir" "$WORK/go-nsq"
      (cd "$WORK/go-nsq" && timeout 900 bash test.sh >"$log" 2>&1) || status=1
      echo "go-nsq workers=$WORKERS run $run: $(grep -c '^--- PASS' "$log") passed," \
           "$(grep -c '^--- FAIL' "$log") failed (log $log)"
    done
  fi
fi
exit $status

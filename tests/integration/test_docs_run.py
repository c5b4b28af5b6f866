"""Every ``sh`` block of docs/ and the README runs as written, page by page, on a fresh state.

Each page starts where the README's first command leaves a new user: that
command runs in a terminal of its own (a node on nsqd's default ports,
its data in ``nsq-data/``), then the page's blocks, in order, in another
terminal at the root of a checkout. How the blocks are run, and the only
things changed in them (free ports for the doc's ports, foreground
daemons as jobs, the commands of this checkout, shortened durations a
block lists), is tests/docrun.py's docstring.

:data:`PLAN` names every block of every page, with what its output must
show. A block not run here says where it is run (a named test) or why it
cannot run on a test machine (root and systemd). Blocks that use Go NSQ
v1.3.0 (``$NSQTW_GO_BIN``) run where its binaries are
(``$NSQTW_GO_BIN`` or ``../shared/anchor/bin``), and Spark's where Java
is; elsewhere the page's other blocks run and the test says which were
skipped. Benchmarks run with the durations and sizes their block lists
cut, so a page of them takes minutes, not hours.
"""

from __future__ import annotations

import re
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import pytest

from tests import docrun

ROOT = docrun.ROOT
GO = docrun.go_bin()


@dataclass(frozen=True)
class Block:
    """What a block is and what running it must show."""

    #: the block's text holds this (which block of the page this is)
    says: str
    #: its output holds each of these
    expect: tuple[str, ...] = ()
    #: (the doc's text, the test's): durations and sizes cut to keep a benchmark short
    shorten: tuple[tuple[str, str], ...] = ()
    #: its last command runs until Ctrl-C, which comes once this has been printed
    until: str | None = None
    #: its one command runs until stopped while the page goes on (in another shell): started as a job,
    #: the page goes on once it has printed ``until``
    job: bool = False
    #: (a command, what it prints): what the doc tells the reader to wait for before this block
    wait_for: tuple[str, str] | None = None
    #: a program it needs that a test machine may lack
    needs: str | None = None
    #: not run here: the test that runs it, or why no test machine can
    elsewhere: str | None = None
    timeout: float = 120


QUICKSTART = "tests/integration/test_quickstart.py::test_quickstart_runs_as_written (against a node on free ports)"

CLUSTER = "tests/integration/test_cluster_doc.py::test_cluster_doc_runs_as_written (as here, with more checks)"

SPARK_DEPLOY = ("tests/spark/test_spark_deploy.py::test_a_standalone_cluster_with_a_worker_killed_mid_query: "
                "a master and workers on one machine (the block's HOST and NSQD are other hosts)")
SPARK_CONNECT = ("tests/spark/test_spark_deploy.py::test_spark_connect: the server on a port of its own "
                 "(15002 may be taken)")

SYSTEMD = ("a host's root and its systemd: the units' ExecStart lines run in "
           "tests/integration/test_deploy_doc.py::test_exec_start_runs_and_notifies")

PLAN: dict[str, list[Block]] = {
    "README.md": [
        Block("pip install . && mkdir -p nsq-data && cd nsq-data && twistd -n nsqtw"),
        Block("pip install '.[test]' && python -m pytest",
              elsewhere=".ci/run runs it, in a fresh venv made from the machine's Python"),
        Block("twistd -n nsqtw --tcp-address=127.0.0.1:4250 --http-address=127.0.0.1:4251"),
        Block("python -m venv .venv && . .venv/bin/activate",
              elsewhere="the development setup runs the whole suite and tools/check.sh, as .ci/run does"),
    ],
    "docs/admin.md": [
        Block("twistd -n --pidfile= nsqtw-admin --lookupd-http-address=127.0.0.1:4161"),
        Block("for the admin to act on", expect=("OK",)),
        # (the admin finds the topic's nodes through the lookupd: the page waits for the node's registration)
        Block("/api/topics/orders",
              wait_for=("curl -s 'http://127.0.0.1:4161/lookup?topic=orders'", '"channels":["billing"]'),
              expect=tuple(f'"request":"{r}","ok":true' for r in (
                  "topic/pause", "channel/empty", "channel/delete", "topic/tombstone", "topic/delete"))),
    ],
    "docs/cluster.md": [
        Block(says, elsewhere=CLUSTER) for says in (
            "--node-id=1", "hello from 1", "/lookup?topic=events", "nsqtw-admin --lookupd-http-address",
            "/config/nsqlookupd_tcp_addresses", "/topic/delete?topic=events", "/topic/tombstone?topic=events")
    ],
    "docs/configuration.md": [
        Block("twistd -n nsqtw --lookupd-tcp-address=127.0.0.1:4160 --data-path=nsq-data"),
    ],
    "docs/deploy.md": [
        Block("useradd --system", elsewhere=SYSTEMD),
        Block("systemctl enable --now", elsewhere=SYSTEMD),
    ],
    "docs/durability.md": [
        Block("twistd -n nsqtw --durable-delivery --data-path=nsq-data"),
        Block("nsqtw-bench writer --nsqd-tcp-address=127.0.0.1:4150 --pub --workers=8",
              shorten=(("--runfor=5s", "--runfor=1s"),), expect=("ops/s",)),
        Block("benchmarks/durable_compare.py", shorten=(("--runs=3 --runfor=10s", "--runs=1 --runfor=1s"),),
              expect=("PUB/s",), timeout=300),
    ],
    "docs/features.md": [
        Block("openssl req -x509"),
        Block("twistd -n nsqtw --tls-cert=server.pem --tls-key=server.key"),
        Block("twistd -n nsqtw --auth-http-address=127.0.0.1:4181"),
        Block("twistd -n nsqtw --statsd-address=127.0.0.1:8125"),
        Block("twistd -n nsqtw --e2e-processing-latency-percentile"),
    ],
    "docs/metrics.md": [
        Block("/metrics | grep nsqd_channel_depth",
              expect=('nsqd_channel_depth{channel="archive",topic="orders"} 42.0',)),
        Block("benchmarks/metrics_stall.py", timeout=300, expect=("/metrics: ",),
              shorten=(("--channels 1000 --scrapes 5", "--channels 50 --scrapes 1"),)),
    ],
    "docs/spark.md": [
        Block("pip install '.[spark]'"),
        Block("python examples/spark/events_per_minute.py", needs="java", timeout=180,
              expect=("published 1 counts to events_per_minute", '"message_count":1', '"events":300}')),
        Block("java -version", needs="java"),
        Block("channel=archive", expect=("OK",)),
        Block("spark-submit --master 'local[2]' examples/spark/nsq_to_parquet.py", needs="java", job=True,
              until="stop cleanly with: kill -TERM", timeout=300),
        Block("s.read.parquet('events-parquet')", needs="java", timeout=300, expect=("|    1000|              1000|",),
              wait_for=("curl -s 'http://127.0.0.1:4151/stats?topic=events&channel=archive&format=json'",
                        '"channel_name":"archive","depth":0,"backend_depth":0,"in_flight_count":0')),
        Block("org.apache.spark.deploy.master.Master", elsewhere=SPARK_DEPLOY),
        Block("SparkConnectServer", elsewhere=SPARK_CONNECT),
        Block("python -m nsqtw.spark.bench", needs="java", timeout=600,
              shorten=(("--messages=10000000", "--messages=20000 --rate-seconds=3"),)),
    ],
    "docs/tools.md": [
        Block("nsqtw tail --topic=orders -n 2", expect=("a\nb\n", " | ")),
        Block("nsqtw pub --topic=records --delimiter=,"),
        Block("nsqtw stat --topic=payments", expect=("ingress  egress",)),
        Block("nsqtw to-file --topic=logs", until="records to disk"),
        Block("cat archive/logs.", expect=("line 1\nline 2\n",)),
        Block("nsqtw to-http --topic=webhooks", until="[aggregate]: finished 2"),
        Block("nsqtw pub --topic=events"),
        Block("nsqtw to-nsq --topic=events", expect=('{"id":1,"ts":2.5}',)),
    ],
    "docs/performance.md": [
        Block("benchmarks/report.sh $NSQTW_GO_BIN/nsqd --runs=1", timeout=600, expect=("| measure |",),
              shorten=(("--runfor=3s", "--runfor=1s --memory-messages=100000"),)),
        Block("benchmarks/many_cores.sh $NSQTW_GO_BIN", timeout=600,
              shorten=(("RUN=6s ROUNDS=2", "RUN=1s ROUNDS=1"), ("RUN=6s ROUNDS=1", "RUN=1s ROUNDS=1"),
                       ("RUN=6s ROUNDS=3", "RUN=1s ROUNDS=1")), expect=("go rt", "nsqtw rt", "each process's")),
        Block("--nsqtw-flag=--busy-poll=0", timeout=300, shorten=(("--runfor=8s", "--runfor=1s"),),
              expect=("round trips",)),
        Block("benchmarks/workers_cpu.py $NSQTW_GO_BIN 1 2", timeout=600,
              shorten=(("RUN=5s ROUNDS=2", "RUN=1s ROUNDS=1"),)),
        Block("--measures=fanout", timeout=600, shorten=(
            ("--runs=3 --batch-size=100 --size=100", "--runs=1 --batch-size=100 --size=100 --fanout-copies=5000"),)),
    ],
    "docs/reliability.md": [
        Block("python -m pytest tests/reliability", elsewhere="the suite runs tests/reliability; this is that part"),
        Block("benchmarks/attack_compare.py $NSQTW_GO_BIN/nsqd", timeout=600, expect=("| attack |",), shorten=(
            ("attack_compare.py $NSQTW_GO_BIN/nsqd", "attack_compare.py --churn-cycles=300 $NSQTW_GO_BIN/nsqd"),)),
        Block("benchmarks/churn_ab.py", timeout=600, shorten=(
            ("--cycles=20000 --rounds=3", "--cycles=300 --rounds=1"), ("--churn-cycles=20000", "--churn-cycles=300"))),
        Block("attack_compare.py --only=slices", timeout=600, expect=("| attack |",)),
        Block("nsqtw-bench chaos", needs="java", timeout=900, shorten=(
            ("--duration=10m", "--duration=8s"), ("--seed=1,2,3,4,5", "--seed=1"))),
        Block("--faults=kill,stop,lookupd,disk,lose", needs="java", timeout=900,
              shorten=(("--duration=10m", "--duration=8s"),)),
        Block("benchmarks/soak.py --minutes 10", timeout=300, shorten=(("--minutes 10", "--minutes 0.25"),)),
        Block("benchmarks/soak.py --minutes 5 --disk-faults", timeout=300,
              shorten=(("--minutes 5", "--minutes 0.25"),)),
    ],
    "docs/replication.md": [
        Block("--replicas=2 &"),
        Block("/channel/create?topic=orders&channel=billing", expect=("OKOK", "'state': 'in_sync'")),
        Block("kill -9 %2", expect=("order 1\norder 2\n",)),
        Block("--replica-secret-file=/etc/nsqtw/replica.secret", elsewhere=(
            "tests/reliability/test_replica_secret.py::test_nodes_that_share_the_secret_replicate_and_others_are_refused"
            " runs nodes with a secret file; this block's paths are a machine's")),
        Block("benchmarks/replicas_compare.py", timeout=600, expect=("| measure |",),
              shorten=(("--runs=2 --runfor=10s", "--runs=1 --runfor=1s"),)),
        Block("benchmarks/replica_cpu.py", timeout=300, expect=("publishes/s, owner",),
              shorten=(("--runs=1 --runfor=6s", "--runs=1 --runfor=1s"),)),
        Block("--owner-flag=--busy-poll=0 --peer-flag=--busy-poll=0", timeout=300, expect=("publishes/s, owner",),
              shorten=(("--runs=1 --runfor=5s", "--runs=1 --runfor=1s"),)),
        Block("--read --publishers=2", timeout=300, expect=("messages/s, owner",),
              shorten=(("--runs=1 --runfor=8s", "--runs=1 --runfor=1s"),)),
        Block("--runfor=5s --workers=0", timeout=600, expect=("| measure |", "nsqtw --workers=0"),
              shorten=(("--runs=2 --runfor=5s", "--runs=1 --runfor=1s"),)),
    ],
    "docs/quickstart.md": [
        Block("twistd -n nsqtw --tcp-address=127.0.0.1:4150 --http-address=127.0.0.1:4151 --data-path=nsq-data"),
        *(Block(says, elsewhere=QUICKSTART) for says in (
            "export NSQD_TCP=", "/channel/create?topic=events&channel=printer", "python consume.py",
            "nsqtw-bench writer")),
    ],
    "docs/http-api.md": [
        Block("/ping", expect=("OK",)),
        Block("/info", expect=('"version":"1.3.0"',)),
        Block("/pub?topic=events", expect=("OKOK",)),
        Block("/mpub?topic=events", expect=("OKOK",)),
        Block("/topic/create?topic=events"),
        Block("/channel/create?topic=events&channel=archive"),
        Block("/stats?format=json", expect=('"topic_name":"events"', "[events ")),
        Block("/config/nsqlookupd_tcp_addresses", expect=('[]["10.0.0.1:4160","10.0.0.2:4160"]1',)),
    ],
}


def pages() -> list[str]:
    """Every page with an ``sh`` block: the README and docs/*.md."""
    found = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    return [str(p.relative_to(ROOT)) for p in found if docrun.sh_blocks(p)]


def test_every_block_of_every_page_is_planned() -> None:
    """PLAN lists each page's blocks in order, each by a text it holds; a block it does not run here
    names the test that runs it or why none can; no block names the project's own machines."""
    assert sorted(PLAN) == sorted(pages())
    for page, plan in PLAN.items():
        blocks = docrun.sh_blocks(ROOT / page)
        assert len(blocks) == len(plan), f"{page}: {len(blocks)} blocks, PLAN has {len(plan)}"
        for i, (text, block) in enumerate(zip(blocks, plan, strict=True)):
            assert block.says in text, f"{page} block {i} no longer says {block.says!r}:\n{text}"
            assert "shared/anchor" not in text, f"{page} block {i} names the project's machines"
        for block in plan:
            named = re.findall(r"(tests/[\w/]+\.py)(?:::(\w+))?", block.elsewhere or "")
            for path, name in named:
                source = (ROOT / path).read_text()
                assert not name or re.search(rf"\bdef {name}\b", source), f"{page}: no {path}::{name}"


#: how a block of commands to type begins, whatever its fence says
COMMAND = re.compile(r"(\$ |twistd |curl |python3? |pip |nsqtw |nsqtw-bench |spark-submit |export |mkdir |benchmarks/)")


def test_no_other_shell_blocks() -> None:
    """A command to type is in an ``sh`` block (which PLAN covers); the only other kind is the
    README's first command, shown again in the quickstart as ``console``."""
    first = docrun.sh_blocks(ROOT / "README.md")[0]
    for page in [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]:
        for kind, text in re.findall(r"^ *```(\w*)\n(.*?)^ *```", page.read_text(), re.S | re.M):
            if kind == "sh" or text == first:
                continue
            begins = text.lstrip().splitlines()[0] if text.strip() else ""
            typed = kind in ("console", "bash", "shell", "zsh") or (kind in ("", "text") and COMMAND.match(begins))
            assert not typed, f"{page.relative_to(ROOT)}: commands in a {kind!r} block:\n{text}"


def test_spark_example_is_the_docs() -> None:
    """docs/spark.md shows examples/spark/events_per_minute.py as it is (the run block runs the file)."""
    shown = re.findall(r"^```python\n(.*?)^```", (ROOT / "docs" / "spark.md").read_text(), re.S | re.M)
    assert (ROOT / "examples" / "spark" / "events_per_minute.py").read_text() in shown


def test_performance_report_is_short() -> None:
    """docs/performance.md stays a report to decide from: at most 300 lines (detail goes to
    benchmarks/README.md)."""
    lines = (ROOT / "docs" / "performance.md").read_text().count("\n")
    assert lines <= 300, f"docs/performance.md has {lines} lines"


def _slugs(page: Path) -> set[str]:
    """The anchors GitHub makes of a page's headings."""
    text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
    seen: dict[str, int] = {}
    out = set()
    for heading in re.findall(r"^#{1,6} +(.+?) *#*$", text, re.M):
        slug = re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")
        n = seen.get(slug, 0)
        seen[slug] = n + 1
        out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_links_between_pages_resolve() -> None:
    """Every relative link in the README, docs/ and benchmarks/README.md names a file that exists and,
    with ``#anchor``, a heading of that page."""
    pages_ = [ROOT / "README.md", ROOT / "benchmarks" / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
    broken = []
    for page in pages_:
        text = re.sub(r"^```.*?^```", "", page.read_text(), flags=re.S | re.M)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, anchor = target.partition("#")
            dest = (page.parent / file).resolve() if file else page
            if not dest.exists():
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such file)")
            elif anchor and dest.suffix == ".md" and anchor not in _slugs(dest):
                broken.append(f"{page.relative_to(ROOT)}: {target} (no such heading)")
    assert broken == []


@pytest.mark.parametrize("page", [p for p in PLAN if any(b.elsewhere is None for b in PLAN[p])])
def test_page_runs_as_written(page: str, tmp_path: Path) -> None:
    """The README's first command, then every block of the page in order: each runs without a
    failing command and prints what PLAN expects."""
    work = docrun.work_dir(tmp_path / "checkout")
    env = docrun.environment(docrun.shims(tmp_path / "bin"), GO)
    run = docrun.Page(work, env)
    skipped = []
    try:
        first = run.terminal()
        readme_first = docrun.sh_blocks(ROOT / "README.md")[0]
        run.run_block(first, readme_first)
        term = run.terminal()
        for i, (text, block) in enumerate(zip(docrun.sh_blocks(ROOT / page), PLAN[page], strict=True)):
            if page == "README.md" and i == 0:
                continue  # it is the first command, running in the first terminal
            if block.elsewhere is not None:
                continue
            if ("NSQTW_GO_BIN" in text and GO is None) or (block.needs and shutil.which(block.needs) is None):
                skipped.append(i)
                continue
            started = time.monotonic()
            if block.wait_for is not None:
                run.wait_for(term, *block.wait_for, timeout=block.timeout)
            if block.job:
                assert block.until is not None
                out = run.run_job(term, text, block.until, timeout=block.timeout)
            else:
                out = run.run_block(term, text, shorten=block.shorten, until=block.until, timeout=block.timeout)
            print(f"--- {page} block {i}, {time.monotonic() - started:.0f} s:\n{out}")  # with a failure, or -s
            for wanted in block.expect:
                assert wanted in out, f"{page} block {i} did not print {wanted!r}:\n{out}"
    finally:
        run.close()
    if skipped:
        pytest.skip(f"{page}: the other blocks ran; blocks {skipped} need Go NSQ v1.3.0 ($NSQTW_GO_BIN) "
                    "or a program this machine lacks (Java for Spark)")

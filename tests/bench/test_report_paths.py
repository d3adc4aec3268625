"""``make bench`` writes its report only under ``bench/results/``: the report writer and the
end of a run (``Bench.finish``) are run with every file write recorded instead of done, so
no tracked file (the README least of all) is rewritten. The benchmark itself never runs."""
from __future__ import annotations

import builtins
import json
import os
from pathlib import Path

import pytest

from bench import report

ROOT = Path(__file__).resolve().parents[2]
RESULTS = ROOT / "bench" / "results"
SAMPLE = json.loads((RESULTS / "latest.json").read_text())  # a real run's results, read only


@pytest.fixture
def writes(monkeypatch) -> list[Path]:
    """Every path written to (write_text, write_bytes, open for writing), none really written."""
    seen: list[Path] = []

    def record(self, *args, **kwargs):
        seen.append(Path(self).resolve())
        return 0

    real_open = builtins.open

    def guarded_open(file, mode="r", *args, **kwargs):
        if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+"):
            seen.append(Path(file).resolve())
            return real_open(os.devnull, mode, *args, **kwargs)
        return real_open(file, mode, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", record)
    monkeypatch.setattr(Path, "write_bytes", record)
    monkeypatch.setattr(Path, "mkdir", lambda self, *a, **k: None)
    monkeypatch.setattr(builtins, "open", guarded_open)
    return seen


def _outside(paths: list[Path]) -> list[Path]:
    return [p for p in paths if not p.is_relative_to(RESULTS)]


def test_results_dir_is_bench_results():
    assert report.RESULTS.resolve() == RESULTS


@pytest.mark.parametrize("partial, stem", [(False, "latest"), (True, "partial")])
def test_writer_writes_only_under_bench_results(writes, partial, stem):
    written = report.write(dict(SAMPLE, generated_at="2026-01-02T03:04:05Z"), partial=partial)
    assert [p.resolve() for p in written] == writes and _outside(writes) == []
    run = "run-20260102T030405Z" + ("-partial" if partial else "")
    assert sorted(p.name for p in writes) == sorted(
        [f"{stem}.json", f"{stem}.md", f"{run}.json", f"{run}.md"])


def test_the_end_of_a_run_touches_nothing_outside_bench_results(writes, monkeypatch, capsys):
    from bench import run, setup

    meta = {k: SAMPLE[k] for k in ("generated_at", "machine", "versions", "settings") if k in SAMPLE}
    monkeypatch.setattr(setup, "metadata", lambda *a, **k: meta)
    bench = run.Bench()
    bench.results.update({k: v for k, v in SAMPLE.items() if k in ("scenarios", "memory", "checks")})
    bench.finish()
    assert RESULTS / "latest.json" in writes and RESULTS / "latest.md" in writes
    assert _outside(writes) == [] and ROOT / "README.md" not in writes
    assert report.markdown(bench.results) in capsys.readouterr().out

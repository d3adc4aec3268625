"""The test order for worksteal (tests/support/schedule.py): every test exactly once, a
module's tests together, each long module at the start of a worker's slice, the long time
spread over the slices."""
from __future__ import annotations

from types import SimpleNamespace

from tests.support import schedule


def _items(spec):
    return [SimpleNamespace(nodeid=f"{mod}::t{i}") for mod, n in spec for i in range(n)]


def _slices(items, workers):
    out, pos = [], 0
    for n in schedule.slice_sizes(len(items), workers):
        out.append(items[pos:pos + n])
        pos += n
    return out


# a fixed table, so that the test does not follow the measured one (schedule.LONG)
LONG = {"tests/e2e/test_fuzz.py": 300, "tests/e2e/test_fault.py": 183,
        "tests/e2e/test_connection_budget.py": 170, "clients/python/tests": 100}


def test_long_modules_open_the_slices_and_nothing_is_lost(monkeypatch):
    monkeypatch.setattr(schedule, "LONG", LONG)
    spec = [("tests/api/test_a.py", 40), ("tests/e2e/test_fuzz.py", 3), ("tests/api/test_b.py", 30),
            ("tests/e2e/test_fault.py", 1), ("clients/python/tests/test_x.py", 4),
            ("clients/python/tests/test_y.py", 2), ("tests/e2e/test_connection_budget.py", 2),
            ("tests/api/test_c.py", 20)]
    items = _items(spec)
    ordered = schedule.order(items, 2)
    assert sorted(i.nodeid for i in ordered) == sorted(i.nodeid for i in items)  # each once
    first, second = _slices(ordered, 2)
    heads = {schedule.unit(first[0].nodeid), schedule.unit(second[0].nodeid)}
    assert heads == {"tests/e2e/test_fuzz.py", "tests/e2e/test_fault.py"}  # the two longest lead
    # the client tests stay one block, the short modules keep their order
    units = [schedule.unit(i.nodeid) for i in ordered]
    runs = [u for k, u in enumerate(units) if k == 0 or units[k - 1] != u]
    assert runs.count("clients/python/tests") == 1
    shorts = [u for u in runs if u not in schedule.LONG]
    assert shorts == sorted(shorts)  # test_a, test_b, test_c in collection order
    # long time per slice, longest first to the lighter slice: fuzz + clients (400), fault + budget (353)
    load = [sum(schedule.LONG.get(u, 0) for u in {schedule.unit(i.nodeid) for i in s}) for s in (first, second)]
    assert sorted(load) == [353, 400]


def test_slice_sizes_are_worksteals():
    assert schedule.slice_sizes(10, 3) == [3, 3, 4]
    assert sum(schedule.slice_sizes(2915, 2)) == 2915


def test_without_workers_the_long_modules_come_first(monkeypatch):
    monkeypatch.setattr(schedule, "LONG", LONG)
    items = _items([("tests/api/test_a.py", 2), ("tests/e2e/test_fault.py", 1), ("tests/e2e/test_fuzz.py", 1)])
    assert [schedule.unit(i.nodeid) for i in schedule.order(items, 0)] == [
        "tests/e2e/test_fuzz.py", "tests/e2e/test_fault.py", "tests/api/test_a.py", "tests/api/test_a.py"]

"""The accessibility check of the console's browser tests: axe-core (the npm package pinned by
``tests/e2e/axe/package.json``, installed by ``tests/e2e/axe/install.sh``; ``.ci/run`` runs
it) evaluated in the page. A missing axe-core fails the test loudly, never a skip."""
from __future__ import annotations

from functools import lru_cache

from tests.support.apps import ROOT

AXE_JS = ROOT / "tests" / "e2e" / "axe" / "node_modules" / "axe-core" / "axe.min.js"
BLOCKING = ("serious", "critical")


@lru_cache(maxsize=1)
def _source() -> str:
    assert AXE_JS.is_file(), f"axe-core is missing ({AXE_JS}): run `bash tests/e2e/axe/install.sh`"
    return AXE_JS.read_text()


def violations(page) -> list[str]:
    """The serious and critical axe-core violations of the page as it is now (WCAG 2.x A and
    AA rules and axe's best practices), one line each: rule, impact and the first targets.
    ``page.evaluate`` runs in the page's world over the DevTools protocol, which the console's
    Content-Security-Policy (scripts from 'self' only) does not govern."""
    if not page.evaluate("() => typeof window.axe !== 'undefined'"):
        page.evaluate(_source())
    found = page.evaluate("""async () => {
      const r = await axe.run(document, {resultTypes: ['violations']});
      return r.violations.map(v => ({id: v.id, impact: v.impact, help: v.help,
                                     targets: v.nodes.slice(0, 3).map(n => n.target.join(' '))}));
    }""")
    return [f"{v['id']} ({v['impact']}): {v['help']} — {', '.join(v['targets'])}"
            for v in found if v["impact"] in BLOCKING]

"""The report in a real browser (headless Chromium): no console errors, no network fetches, every section present,
every plot drew visible geometry, nothing wider than the window; plus a screenshot for a person to look at.

The report itself has no script. The test serves a copy with two injected scripts: an error/console catcher at the top
of <head>, and at the end of <body> a checker that measures the rendered SVG (path lengths and bounding boxes, which
only a layout engine can give) and writes a JSON verdict into the DOM, read back with --dump-dom.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
from fixtures_runs import write_population_run, write_single_run

from lorapop.report.html import SECTIONS, write_report

CHROMIUM = shutil.which("chromium") or ("/usr/bin/chromium" if Path("/usr/bin/chromium").exists() else None)
pytestmark = [pytest.mark.browser,
              pytest.mark.skipif(CHROMIUM is None, reason="chromium not installed (apt-get install -y chromium; "
                                                          "scripts/test.sh installs it in CI)")]

CATCHER = """<script>window.__errs=[];
addEventListener('error',e=>__errs.push('error: '+(e.message||(e.target&&e.target.outerHTML)||e)),true);
addEventListener('unhandledrejection',e=>__errs.push('rejection: '+e.reason));
for(const k of ['error','warn']){const o=console[k];console[k]=(...a)=>{__errs.push(k+': '+a.join(' '));o.apply(console,a)}}
</script>"""

CHECKER = """<script>(()=>{
const plots=[...document.querySelectorAll('svg.plot')].map(s=>{
  let drawn=0;
  s.querySelectorAll('.series path').forEach(p=>{if(p.getTotalLength()>1)drawn++;});
  s.querySelectorAll('.series circle, .series rect').forEach(c=>{const b=c.getBBox();if(b.width>0&&b.height>0)drawn++;});
  const r=s.getBoundingClientRect();
  return {title:s.getAttribute('aria-label'),drawn,w:r.width,h:r.height};});
const v={errors:window.__errs,sections:[...document.querySelectorAll('section')].map(s=>s.id),
  headings:[...document.querySelectorAll('section > h2')].map(h=>h.textContent),plots,
  noplots:document.querySelectorAll('.noplot').length,
  resources:performance.getEntriesByType('resource').map(e=>e.name),
  scrollW:document.documentElement.scrollWidth,clientW:document.documentElement.clientWidth};
const pre=document.createElement('pre');pre.id='verdict';pre.textContent=JSON.stringify(v);
document.body.appendChild(pre);})();</script>"""


def _chromium(tmp: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
           "--disable-background-networking", "--disable-component-update", "--disable-sync",
           f"--user-data-dir={tmp / 'chromium-profile'}", "--enable-logging=stderr", "--v=1",
           "--window-size=1280,4000", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=120)


def test_report_renders_in_chromium(tmp_path):
    pop = write_population_run(tmp_path / "pop4")
    single = write_single_run(tmp_path / "single")
    report = write_report([pop, single], tmp_path / "report.html")
    html = report.read_text()
    n_plots = html.count('<svg class="plot')

    probe = tmp_path / "probe.html"
    probe.write_text(html.replace("<head>", "<head>" + CATCHER, 1).replace("</body>", CHECKER + "</body>", 1))
    res = _chromium(tmp_path, "--virtual-time-budget=5000", "--dump-dom", probe.as_uri())
    m = re.search(r'<pre id="verdict">(.*?)</pre>', res.stdout, re.S)
    assert m, f"no verdict in the DOM (rc {res.returncode}); stderr tail:\n{res.stderr[-2000:]}"
    v = json.loads(m.group(1).replace("&lt;", "<").replace("&gt;", ">").replace("&quot;", '"').replace("&amp;", "&"))

    assert v["errors"] == []
    # the page logs nothing, so any console line (a failed fetch, a CSP complaint) is a problem
    console = [ln for ln in res.stderr.splitlines() if ":CONSOLE" in ln]
    assert console == [], console
    assert v["resources"] == [], "the report must not fetch anything"
    assert v["sections"] == [sid for sid, _ in SECTIONS]
    assert v["headings"] == [t for _, t in SECTIONS]
    assert v["noplots"] == 0
    assert len(v["plots"]) == n_plots >= 40
    blank = [p["title"] for p in v["plots"] if p["drawn"] == 0 or p["w"] < 200 or p["h"] < 50]
    assert blank == [], f"plots that drew nothing: {blank}"
    assert v["scrollW"] <= v["clientW"], "the page is wider than the window"

    shot = tmp_path / "report.png"
    res = _chromium(tmp_path, f"--screenshot={shot}", report.as_uri())
    assert shot.is_file() and shot.stat().st_size > 50_000, res.stderr[-2000:]
    if os.environ.get("LORAPOP_ARTIFACTS"):
        dest = Path(os.environ["LORAPOP_ARTIFACTS"])
        dest.mkdir(parents=True, exist_ok=True)
        shutil.copy(shot, dest / "report.png")
        shutil.copy(report, dest / "report.html")

"""The HTML report in a real browser: Debian's chromium, headless, driven over the DevTools protocol.

The report comes from a real tiny search (``autotune search`` writes it at the end). The page is loaded from
file:// with the network refused (it must be self-contained): no JavaScript exception, no console error,
every plot drawn (plotly's ``.main-svg``), and a screenshot that is not blank.
"""
from __future__ import annotations

import base64
import json
import shutil
import statistics
import struct
import subprocess
import time
import urllib.request
import zlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from .conftest import missing, needs_module

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")


class DevTools:
    """A page's DevTools protocol session over its websocket: commands with ids, events kept as they come."""

    def __init__(self, url: str) -> None:
        import websocket

        self.ws = websocket.create_connection(url, timeout=30, suppress_origin=True)
        self.events: list[dict[str, Any]] = []
        self.next_id = 0

    def send(self, method: str, **params: Any) -> dict[str, Any]:
        self.next_id += 1
        self.ws.send(json.dumps({"id": self.next_id, "method": method, "params": params}))
        while True:
            message = json.loads(self.ws.recv())
            if message.get("id") == self.next_id:
                assert "error" not in message, message
                return message["result"]
            self.events.append(message)

    def wait_for(self, method: str, timeout: float = 60) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = next((e for e in self.events if e.get("method") == method), None)
            if found:
                return found
            self.ws.settimeout(max(0.1, deadline - time.monotonic()))
            self.events.append(json.loads(self.ws.recv()))
        raise AssertionError(f"no {method} within {timeout:.0f} s")

    def evaluate(self, expression: str) -> Any:
        return self.send("Runtime.evaluate", expression=expression, returnByValue=True)["result"].get("value")


@pytest.fixture
def browser(tmp_path: Path) -> Iterator[DevTools]:
    if CHROMIUM is None:
        missing("chromium is not installed (tests/system-deps.sh installs Debian's chromium where it is root "
                    "with apt-get)")
    needs_module("websocket", "websocket-client is not installed: pip install -e '.[test]'")
    profile = tmp_path / "chromium-profile"  # throwaway: no state from or for another run
    proc = subprocess.Popen(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--no-default-browser-check",
         f"--user-data-dir={profile}", "--remote-debugging-port=0", "--window-size=1280,1800",
         "--proxy-server=127.0.0.1:9", "--proxy-bypass-list=<-loopback>",  # any network fetch fails: offline
         "about:blank"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        port_file, deadline = profile / "DevToolsActivePort", time.monotonic() + 60
        while not port_file.exists() or not port_file.read_text().strip():
            assert proc.poll() is None and time.monotonic() < deadline, f"chromium did not start: {proc.poll()}"
            time.sleep(0.1)
        port = int(port_file.read_text().split()[0])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/json/list", timeout=10) as response:
            page = next(t for t in json.load(response) if t["type"] == "page")
        tools = DevTools(page["webSocketDebuggerUrl"])
        yield tools
        tools.ws.close()
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=20)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def png_pixels(data: bytes) -> list[int]:
    """The 8-bit samples of a PNG (RGB or RGBA, not interlaced), decoded with the standard library."""
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, chunks, header = 8, [], b""
    while pos < len(data):
        length, kind = struct.unpack(">I4s", data[pos:pos + 8])
        body = data[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            header = body
        elif kind == b"IDAT":
            chunks.append(body)
        pos += 12 + length
    width, height, depth, color, _, _, interlace = struct.unpack(">IIBBBBB", header)
    assert depth == 8 and color in (2, 6) and interlace == 0, (depth, color, interlace)
    channels = 3 if color == 2 else 4
    raw, stride = zlib.decompress(b"".join(chunks)), width * channels
    pixels, previous = bytearray(), bytearray(stride)
    for y in range(height):
        kind, row = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1:(y + 1) * (stride + 1)])
        for i in range(stride):
            left = row[i - channels] if i >= channels else 0
            up, up_left = previous[i], previous[i - channels] if i >= channels else 0
            if kind == 1:
                row[i] = (row[i] + left) & 0xFF
            elif kind == 2:
                row[i] = (row[i] + up) & 0xFF
            elif kind == 3:
                row[i] = (row[i] + (left + up) // 2) & 0xFF
            elif kind == 4:
                p = left + up - up_left
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - up_left)
                row[i] = (row[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else up_left)) & 0xFF
        pixels += row
        previous = row
    return list(pixels[0::channels])  # the red channel is enough to tell a drawn page from a blank one


def test_png_decoder_tells_blank_from_drawn() -> None:
    def png(rows: list[bytes]) -> bytes:
        def chunk(kind: bytes, body: bytes) -> bytes:
            return struct.pack(">I", len(body)) + kind + body + struct.pack(">I", zlib.crc32(kind + body))
        ihdr = struct.pack(">IIBBBBB", 2, len(rows), 8, 2, 0, 0, 0)
        return (b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", ihdr) + chunk(b"IDAT", zlib.compress(b"".join(rows)))
                + chunk(b"IEND", b""))

    white = bytes([0, 255, 255, 255, 255, 255, 255])
    assert png_pixels(png([white, white])) == [255, 255, 255, 255]
    up = bytes([2, 0, 0, 0, 0, 0, 0])  # filter "up": the row above again
    sub = bytes([1, 10, 0, 0, 5, 0, 0])  # filter "sub": each pixel adds to its left neighbour
    assert png_pixels(png([white, up, sub])) == [255, 255, 255, 255, 10, 15]


@pytest.mark.slow
def test_the_report_of_a_real_search_renders_in_chromium(tmp_path: Path, browser: DevTools, live_search) -> None:
    folder, search = live_search  # autotune search wrote the report at its end
    report = next(folder.glob("report-*.html"))
    assert f"report: {report}" in search.stdout
    text = report.read_text()
    assert "<script src=" not in text and text.count("* plotly.js v") == 1  # inline, once: opens offline
    plots = text.count('class="plotly-graph-div"')
    assert plots >= 4 and f'data-plots="{plots}"' in text  # history, per-knob effect, a step's parts, budget at least
    steps = text.split("Where a step's time goes</h2>")[1].split("<h2>")[0]
    assert steps.lstrip().startswith("<table>") and "short torch.profiler run" in steps  # measured on the CPU

    check_page(browser, report, plots, tmp_path / "report.png")


def test_a_paired_report_with_intervals_and_importances_renders_in_chromium(tmp_path: Path, browser: DevTools,
                                                                          facts) -> None:
    from autotune.report import collect, write

    from .test_report import add_paired_study

    url = f"sqlite:///{tmp_path}/studies.db"
    add_paired_study(url, "paired", facts)
    report = write(collect(url, "paired", facts), tmp_path / "paired.html")
    check_page(browser, report, 5, tmp_path / "paired.png")  # history, knobs, importances, a step's parts, budget


def check_page(browser: DevTools, report: Path, plots: int, screenshot: Path) -> None:
    """Load ``report`` from file://: no exception nor console error, ``plots`` plots drawn, a screenshot (kept in
    ``screenshot``) that is not blank."""
    browser.events.clear()
    for domain in ("Runtime", "Log", "Page"):
        browser.send(f"{domain}.enable")
    browser.send("Page.navigate", url=report.as_uri())
    browser.wait_for("Page.loadEventFired")
    deadline, drawn = time.monotonic() + 30, 0
    while time.monotonic() < deadline and drawn < plots:  # plotly draws right after load
        drawn = browser.evaluate("[...document.querySelectorAll('.plotly-graph-div')]"
                                 ".filter(d => d.querySelector('.main-svg')).length")
        time.sleep(0.2)
    assert drawn == plots == browser.evaluate("document.querySelectorAll('.plotly-graph-div').length")
    height = browser.evaluate("document.documentElement.scrollHeight")
    full = browser.send("Page.captureScreenshot", format="png", captureBeyondViewport=True)
    screenshot.write_bytes(base64.b64decode(full["data"]))  # to look at: the whole page
    small = browser.send("Page.captureScreenshot", format="png", captureBeyondViewport=True,  # to decode quickly
                         clip={"x": 0, "y": 0, "width": 1280, "height": height, "scale": 0.125})
    shot = base64.b64decode(small["data"])
    exceptions = [e["params"]["exceptionDetails"] for e in browser.events if e["method"] == "Runtime.exceptionThrown"]
    errors = [e["params"] for e in browser.events
              if (e["method"] == "Runtime.consoleAPICalled" and e["params"]["type"] == "error")
              or (e["method"] == "Log.entryAdded" and e["params"]["entry"]["level"] == "error")]
    assert exceptions == [] and errors == []
    pixels = png_pixels(shot)
    assert statistics.pvariance(pixels) > 100, "the screenshot is (nearly) blank"

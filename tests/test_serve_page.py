"""``sesame serve``'s demo page in a real browser: headless Chromium (Debian's package), driven over the DevTools
protocol on a pipe, loads the page, submits a text and reads the rendered label and bars, then streams a generation."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from .conftest import browser
from .test_serve import load, runs  # noqa: F401 (runs: a fixture); it skips this module too without the extra

import httpx  # noqa: E402

from sesame.apps.serve import ServeSpec  # noqa: E402
from sesame.apps.serve.app import background, create_app  # noqa: E402

pytestmark = pytest.mark.usefixtures("one_thread")


class Chromium:
    """Headless Chromium with ``--remote-debugging-pipe`` (DevTools protocol messages, NUL-terminated JSON, written
    to its fd 3 and read from its fd 4), one page attached."""

    def __init__(self, command: str, profile: Path):
        import subprocess

        to_browser, self.commands = os.pipe()
        self.replies, from_browser = os.pipe()

        def descriptors() -> None:  # in the child: its fd 3 reads commands, fd 4 writes replies
            os.dup2(to_browser, 3)
            os.dup2(from_browser, 4)

        moved = [os.dup(fd) for fd in (to_browser, from_browser)]  # above 4, so the dup2s cannot clobber them
        to_browser, from_browser = moved
        self.process = subprocess.Popen(
            [command, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--remote-debugging-pipe",
             f"--user-data-dir={profile}", "--window-size=900,700", "about:blank"],
            pass_fds=(3, 4), preexec_fn=descriptors, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        for fd in moved:
            os.close(fd)
        self.buffer, self.last, self.session = b"", 0, None

    def send(self, method: str, **params) -> dict:
        self.last += 1
        message = {"id": self.last, "method": method, "params": params}
        if self.session:
            message["sessionId"] = self.session
        os.write(self.commands, json.dumps(message).encode() + b"\0")
        while True:
            while b"\0" not in self.buffer:
                chunk = os.read(self.replies, 1 << 16)
                assert chunk, "chromium closed its DevTools pipe"
                self.buffer += chunk
            raw, self.buffer = self.buffer.split(b"\0", 1)
            reply = json.loads(raw)
            if reply.get("id") == self.last:
                assert "error" not in reply, reply
                return reply["result"]

    def open(self, url: str) -> None:
        target = self.send("Target.createTarget", url=url)["targetId"]
        self.session = self.send("Target.attachToTarget", targetId=target, flatten=True)["sessionId"]

    def submit(self, url: str, text: str, fields: str = "") -> None:
        """Open the demo page at ``url``, wait for its form, type ``text`` (and run ``fields``, JavaScript setting
        other inputs) and press submit."""
        self.open(url + "/")
        self.wait("document.getElementById('form')?.hidden === false")
        self.evaluate(f"document.getElementById('text').value = {json.dumps(text)};{fields}"
                      "document.getElementById('submit').click()")

    def evaluate(self, expression: str):
        result = self.send("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in result, result
        return result["result"].get("value")

    def wait(self, expression: str, seconds: float = 30):
        import time

        deadline = time.monotonic() + seconds
        while time.monotonic() < deadline:
            value = self.evaluate(expression)
            if value:
                return value
            time.sleep(0.05)
        raise AssertionError(f"the page never made {expression!r} true; it shows: "
                             f"{self.evaluate('document.body.innerText')!r}")

    def close(self) -> None:
        self.process.kill()
        self.process.wait()
        os.close(self.commands)
        os.close(self.replies)


def test_the_demo_page_shows_a_label_with_a_bar_per_class_and_streams_a_generation(runs, tmp_path):
    chromium = Chromium(browser(), tmp_path / "profile")
    text = "The dog sleeps under the old tree."
    try:
        with background(create_app(ServeSpec(model="classify"), load(str(runs / "classify")))) as url:
            expected = httpx.post(f"{url}/v1/predict", json={"inputs": text}).json()["predictions"][0]
            chromium.submit(url, text)
            label = chromium.wait("document.getElementById('label')?.textContent")
            shown = chromium.evaluate("[...document.querySelectorAll('.bar')].map(b => [b.dataset.label, "
                                      "b.querySelector('.p').textContent, "
                                      "100 * b.querySelector('.fill').getBoundingClientRect().width / "
                                      "b.querySelector('.track').getBoundingClientRect().width])")
            shot = chromium.send("Page.captureScreenshot", format="png")["data"]
        assert label == expected["label"]
        bars = expected["probabilities"].items()
        assert [row[:2] for row in shown] == [[name, f"{100 * p:.1f}%"] for name, p in bars]
        assert [row[2] for row in shown] == pytest.approx([100 * p for p in expected["probabilities"].values()],
                                                          abs=0.5)  # each bar as long as its probability, on screen
        assert len(shot) > 1000
        with background(create_app(ServeSpec(model="gpt"), load(str(runs / "gpt")))) as url:
            expected = httpx.post(f"{url}/v1/generate", json={"inputs": "The cat",
                                                              "parameters": {"max_new_tokens": 8}}).json()
            chromium.submit(url, "The cat", "document.getElementById('max_new_tokens').value = '8';")
            finish = chromium.wait("document.getElementById('output')?.dataset.finish")
            generated = chromium.evaluate("document.getElementById('generated').textContent")
            error = chromium.evaluate("document.getElementById('error').textContent")
        assert (finish, generated, error) == (expected["generations"][0]["finish"],
                                              expected["generations"][0]["text"], "")
    finally:
        chromium.close()

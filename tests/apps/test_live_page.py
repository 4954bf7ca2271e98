#!/usr/bin/env python3
"""The live page in Debian's headless Chromium (docs/admin.md, "Live page").

Starts the demo with /metrics, the admin API and the page on one port and
`[admin] page = "token"`, then drives Chromium through chromedriver
(WebDriver over HTTP, Python's standard library only):

- without the token, /api/state is refused and the page asks for it; a
  wrong token in the page's form is refused and asked for again;
- with it, the page renders (the screenshot is not blank), lists every chip
  of the plan, draws the last step's timeline, and shows a loss that
  changes between two loads;
- the browser logs no error (console, network or Content-Security-Policy).

Needs /usr/bin/chromium and /usr/bin/chromedriver (Debian's chromium and
chromium-driver, which `make deps` installs); fails, never skips, without
them.
"""
import argparse
import base64
import json
import os
import re
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
import zlib

CHROMIUM = "/usr/bin/chromium"
CHROMEDRIVER = "/usr/bin/chromedriver"
TOKEN = "live-page-test-token-0123456789"


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def http(url, body=None, method="GET", headers=None, timeout=30):
    """(status, body bytes) of one request."""
    data = None if body is None else json.dumps(body).encode()
    request = urllib.request.Request(url, data=data, method=method,
                                     headers=headers or {})
    if data is not None:
        request.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(request, timeout=timeout) as r:
            return r.status, r.read()
    except urllib.error.HTTPError as e:
        return e.code, e.read()


def wait_for(what, probe, seconds=120, every=0.2):
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        value = probe()
        if value:
            return value
        time.sleep(every)
    sys.exit(f"live_page: gave up after {seconds} s waiting for {what}")


def png_stats(png):
    """(pixels, distinct colours, share of pixels that are not white) of an
    8-bit RGB or RGBA, non-interlaced PNG (what Chromium writes)."""
    assert png[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat = 8, b""
    while pos < len(png):
        length, kind = struct.unpack(">I4s", png[pos:pos + 8])
        data = png[pos + 8:pos + 8 + length]
        if kind == b"IHDR":
            width, height, depth, colour, _, _, interlace = struct.unpack(
                ">IIBBBBB", data)
        elif kind == b"IDAT":
            idat += data
        pos += 12 + length
    assert depth == 8 and colour in (2, 6) and interlace == 0, \
        f"unexpected PNG format {depth}/{colour}/{interlace}"
    bpp = 3 if colour == 2 else 4
    raw = zlib.decompress(idat)
    stride = width * bpp
    previous = bytearray(stride)
    colours, not_white = set(), 0
    for y in range(height):
        start = y * (stride + 1)
        kind = raw[start]
        line = bytearray(raw[start + 1:start + 1 + stride])
        for i in range(stride):
            a = line[i - bpp] if i >= bpp else 0
            b = previous[i]
            c = previous[i - bpp] if i >= bpp else 0
            if kind == 1:
                line[i] = (line[i] + a) & 0xFF
            elif kind == 2:
                line[i] = (line[i] + b) & 0xFF
            elif kind == 3:
                line[i] = (line[i] + (a + b) // 2) & 0xFF
            elif kind == 4:
                p = a + b - c
                pa, pb, pc = abs(p - a), abs(p - b), abs(p - c)
                pred = a if pa <= pb and pa <= pc else (b if pb <= pc else c)
                line[i] = (line[i] + pred) & 0xFF
        for x in range(0, stride, bpp):
            rgb = bytes(line[x:x + 3])
            colours.add(rgb)
            if rgb != b"\xff\xff\xff":
                not_white += 1
        previous = line
    return width * height, len(colours), not_white / (width * height)


class browser:
    """One headless Chromium session through chromedriver."""

    def __init__(self, workdir):
        for program in (CHROMIUM, CHROMEDRIVER):
            if not os.access(program, os.X_OK):
                sys.exit(f"live_page: {program} is missing: install Debian's "
                         "chromium and chromium-driver (make deps)")
        port = free_port()
        self.base = f"http://127.0.0.1:{port}"
        self.driver = subprocess.Popen(
            [CHROMEDRIVER, f"--port={port}"], stdout=subprocess.DEVNULL,
            stderr=open(os.path.join(workdir, "chromedriver.log"), "w"))
        self.session = None
        try:
            wait_for("chromedriver", lambda: self._up(), 30)
            args = ["--headless", "--no-sandbox", "--disable-gpu",
                    "--disable-dev-shm-usage", "--window-size=1280,1400",
                    f"--user-data-dir={os.path.join(workdir, 'profile')}"]
            value = self.call("POST", "/session", {"capabilities": {
                "alwaysMatch": {
                    "browserName": "chrome",
                    "goog:chromeOptions": {"binary": CHROMIUM, "args": args},
                    "goog:loggingPrefs": {"browser": "ALL"}}}})
            self.session = f"/session/{value['sessionId']}"
        except BaseException:
            self.driver.kill()
            raise

    def _up(self):
        try:
            return http(self.base + "/status", timeout=2)[0] == 200
        except OSError:
            return False

    def call(self, method, path, body=None):
        status, data = http(self.base + path, body, method, timeout=120)
        value = json.loads(data)["value"]
        if status != 200:
            sys.exit(f"live_page: WebDriver {method} {path}: {value}")
        return value

    def go(self, url):
        self.call("POST", self.session + "/url", {"url": url})

    def run(self, script, *args):
        return self.call("POST", self.session + "/execute/sync",
                         {"script": script, "args": list(args)})

    def text(self, element_id):
        return self.run("const e = document.getElementById(arguments[0]);"
                        "return e ? e.textContent : null;", element_id)

    def screenshot(self):
        return base64.b64decode(self.call("GET", self.session + "/screenshot"))

    def errors(self):
        """The errors logged since the last call (reading clears them)."""
        entries = self.call("POST", self.session + "/se/log",
                            {"type": "browser"})
        return [e for e in entries if e["level"] == "SEVERE"]

    def close(self):
        try:
            if self.session:
                self.call("DELETE", self.session)
        finally:
            self.driver.terminate()
            self.driver.wait(30)


def loss_shown(page):
    """The loss the page's summary line shows, once it shows one."""
    summary = page.text("summary") or ""
    m = re.search(r"step (\d+) of \d+ .*\| loss ([0-9.]+)", summary)
    return (int(m.group(1)), m.group(2)) if m else None


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--launch", required=True)
    parser.add_argument("--demo", required=True)
    args = parser.parse_args()
    work = tempfile.mkdtemp(prefix="h2-live-page-")
    token_file = os.path.join(work, "admin.token")
    with open(os.open(token_file, os.O_WRONLY | os.O_CREAT, 0o600), "w") as f:
        f.write(TOKEN + "\n")
    job = os.path.join(work, "job.toml")
    with open(args.demo) as demo, open(job, "w") as out:
        out.write(demo.read() + f'\n[admin]\ntoken_file = "{token_file}"\n'
                  'page = "token"\n')
    port = free_port()
    log = open(os.path.join(work, "h2-launch.log"), "w+")
    # One port for /metrics, /admin and the page.
    run = subprocess.Popen([args.launch, job, "--steps", "3000",
                            "--metrics-port", str(port), "--admin-port",
                            str(port)], stdout=log, stderr=subprocess.STDOUT)
    # The waits add up to less than ctest's TIMEOUT (300 s), so that a
    # failure says what it waited for.
    try:
        def job_log():
            log.seek(0)
            return log.read()
        wait_for("the first step", lambda: "step     1/" in job_log(), 120)
        assert f"live page at http://127.0.0.1:{port}/ (admin token)" in \
            job_log(), job_log()
        url = f"http://127.0.0.1:{port}"
        assert http(url + "/api/state")[0] == 401, "state without the token"
        assert http(url + "/api/state", headers={
            "Authorization": "Bearer not-the-token-0123456789"})[0] == 401
        status, body = http(url + "/api/state", headers={
            "Authorization": "Bearer " + TOKEN})
        assert status == 200, status
        state = json.loads(body)
        chips = [s["chip"] for r in state["plan"] for s in r["stages"]]
        assert len(chips) == 4, state["plan"]
        status, body = http(url + "/metrics")
        assert status == 200 and b"h2_steps_total" in body, "shared /metrics"

        page = browser(work)
        try:
            check_page(page, url, chips)
        finally:
            page.close()
    finally:
        run.send_signal(signal.SIGTERM)
        try:
            run.wait(60)
        except subprocess.TimeoutExpired:
            run.kill()
    return 0


def submit_token(page, token):
    page.run("document.getElementById('token').value = arguments[0];"
             "document.getElementById('login-form').requestSubmit();", token)


def check_page(page, url, chips):
    page.go(url + "/")
    login_shown = "return !document.getElementById('login').hidden;"
    wait_for("the token form", lambda: page.run(login_shown), 20)
    # A wrong token: the job refuses it (one 401, which the browser logs)
    # and the page asks again.
    submit_token(page, "not-the-token-0123456789")
    wait_for("the wrong token refused", lambda: page.run(
        "return document.getElementById('login-error').textContent;") ==
        "the job refused that token", 20)
    assert page.run(login_shown)
    refused = page.errors()
    assert len(refused) == 1 and "/api/state" in refused[0]["message"] and \
        "401" in refused[0]["message"], refused

    submit_token(page, TOKEN)
    first = wait_for("a loss on the page", lambda: loss_shown(page), 45)
    for chip in chips:
        assert chip in page.text("chips"), (chip, page.text("chips"))
        assert chip in page.text("plan"), (chip, page.text("plan"))
    wait_for("the timeline", lambda: page.run(
        "return document.getElementById('timeline').naturalWidth > 0;"), 20)
    # Two steps later, a second load (the token stays for the tab).
    wait_for("two more steps", lambda: json.loads(http(
        url + "/api/state", headers={"Authorization": "Bearer " + TOKEN})[
        1])["steps_done"] >= first[0] + 2, 45)
    page.go(url + "/")
    second = wait_for("a loss on the reloaded page",
                      lambda: loss_shown(page), 20)
    assert second[0] > first[0], (first, second)
    assert second[1] != first[1], f"the loss did not change: {first} {second}"
    pixels, colours, inked = png_stats(page.screenshot())
    assert colours >= 16 and inked >= 0.03, \
        f"a blank screenshot: {colours} colours, {inked:.1%} not white"
    errors = page.errors()
    assert not errors, f"the browser logged errors: {errors}"
    print(f"live_page: ok: chips {chips}, loss {first[1]} at step "
          f"{first[0]} then {second[1]} at step {second[0]}, screenshot "
          f"{pixels} pixels, {colours} colours, {inked:.1%} not white")


if __name__ == "__main__":
    sys.exit(main())

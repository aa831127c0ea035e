"""Loads a static site in headless Chromium and reports what is broken on it.

Used by tests/test_docs_site.py, on the built mkdocs site and on hand-made
pages with one deliberate break each. Standard library only:

- ``Chromium``: a small Chrome DevTools Protocol client over
  ``--remote-debugging-pipe`` (Chromium reads commands from its fd 3 and writes
  responses and events to its fd 4, each a JSON object ended by a NUL byte),
  so no websocket package is needed. Every wait is bounded, and the browser's
  process group is killed on close.
- ``serve``: a directory served by ``http.server`` on 127.0.0.1 (a free port)
  in a thread; a directory without index.html is a 404, as on a static host.
- ``check_site``: every page loaded in turn; it reports uncaught exceptions,
  console errors and failed assertions, the browser's error log (failed
  resource loads), responses with a status >= 400, failed requests, images
  that did not load, links to pages the server does not have or to
  #fragments not on their page, links of other schemes than http(s) and
  mailto, tables and code blocks wider than their column at ``WIDTH`` px
  (part of them only readable by scrolling), and any request to a host other than 127.0.0.1 (which the browser
  cannot make: its proxy is a closed local port, and loopback bypasses it).
"""

from __future__ import annotations

import contextlib
import fcntl
import functools
import html.parser
import http.server
import json
import os
import queue
import select
import shutil
import signal
import subprocess
import tempfile
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Optional

LOCAL_HOST = "127.0.0.1"

FLAGS = (
    "--headless=new",
    "--no-sandbox",  # tests run as root in CI
    "--disable-gpu",
    "--disable-dev-shm-usage",
    "--no-first-run",
    "--no-default-browser-check",
    "--remote-debugging-pipe",
    # nothing of its own to the network: no updates, sync, field trials, metrics
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--disable-extensions",
    "--disable-default-apps",
    "--disable-domain-reliability",
    "--disable-breakpad",
    "--disable-client-side-phishing-detection",
    "--disable-features=Translate,OptimizationHints,MediaRouter,DialMediaRouteProvider",
    "--metrics-recording-only",
    "--no-pings",
    "--mute-audio",
    # and nothing for the pages either: every request but loopback's (which
    # bypasses a proxy) goes to a closed port; check_site reports each one
    f"--proxy-server={LOCAL_HOST}:9",
)


class CDPError(Exception):
    """A command's error response, or the browser gone or silent too long."""


def _high_fd(fd: int) -> int:
    """fd moved to a number >= 10, close-on-exec: the child's 3 and 4 are set
    from it, which must not clobber a pipe end that is itself 3 or 4."""
    moved = fcntl.fcntl(fd, fcntl.F_DUPFD_CLOEXEC, 10)
    os.close(fd)
    return moved


class Chromium:
    """Headless Chromium driven over the DevTools pipe.

    ``send`` writes a command and returns its id; ``receive`` returns the next
    message (a response or an event) or None after ``timeout`` seconds;
    ``call`` sends and waits for the response, handing every event that
    arrives meanwhile to ``on_event``; ``pump`` receives one message and hands
    it to ``on_event`` if it is an event. Responses nobody waits for are dropped.
    """

    def __init__(self, executable: str, *, timeout: float = 10.0, start_timeout: float = 30.0):
        self.timeout = timeout
        self.on_event: Callable[[dict], None] = lambda event: None
        self._next_id = 0
        self._messages: queue.Queue = queue.Queue()
        self._profile = tempfile.mkdtemp(prefix="pytree_kit-chromium-")
        self._log_path = Path(self._profile) / "stderr.log"
        self.proc: Optional[subprocess.Popen] = None
        child_in, self._to_child = map(_high_fd, os.pipe())
        self._from_child, child_out = map(_high_fd, os.pipe())
        try:
            with open(self._log_path, "wb") as log:
                # bash sets the child's fds 3 and 4 from the pipe ends, then execs
                # chromium (subprocess's pass_fds keeps numbers, it cannot move them)
                self.proc = subprocess.Popen(
                    [
                        shutil.which("bash") or "/bin/bash",
                        "-c",
                        f'exec "$@" 3<&{child_in} 4>&{child_out}',
                        "bash",
                        executable,
                        *FLAGS,
                        f"--user-data-dir={self._profile}",
                        "about:blank",
                    ],
                    pass_fds=(child_in, child_out),
                    stdin=subprocess.DEVNULL,
                    stdout=log,
                    stderr=log,
                    start_new_session=True,  # its renderers too are killed on close
                )
        except BaseException:
            self.close()
            raise
        finally:
            os.close(child_in)
            os.close(child_out)
        os.set_blocking(self._to_child, False)
        threading.Thread(target=self._read, name="chromium-pipe", daemon=True).start()
        try:
            self.call("Browser.getVersion", timeout=start_timeout)
        except BaseException:
            self.close()
            raise

    # -- the pipe ---------------------------------------------------------------------

    def _read(self) -> None:
        buffer = b""
        while True:
            try:
                chunk = os.read(self._from_child, 1 << 16)
            except OSError:
                chunk = b""
            if not chunk:
                self._messages.put(None)  # the browser is gone
                return
            buffer += chunk
            *complete, buffer = buffer.split(b"\0")
            for raw in complete:
                self._messages.put(json.loads(raw))

    def _stderr_tail(self) -> str:
        try:
            return self._log_path.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def send(
        self, method: str, params: Optional[dict] = None, session: Optional[str] = None
    ) -> int:
        self._next_id += 1
        message: dict[str, Any] = {"id": self._next_id, "method": method, "params": params or {}}
        if session is not None:
            message["sessionId"] = session
        data = json.dumps(message).encode() + b"\0"
        deadline = time.monotonic() + self.timeout
        while data:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([], [self._to_child], [], left)[1]:
                raise CDPError(f"the browser took no command for {self.timeout} s ({method})")
            try:
                data = data[os.write(self._to_child, data) :]
            except BlockingIOError:
                continue
            except OSError as exc:
                raise CDPError(f"the browser is gone ({exc}): {self._stderr_tail()}") from exc
        return self._next_id

    def receive(self, timeout: float) -> Optional[dict]:
        try:
            message = self._messages.get(timeout=max(timeout, 0.0))
        except queue.Empty:
            return None
        if message is None:
            self._messages.put(None)  # every later receive says so too
            raise CDPError(f"the browser exited: {self._stderr_tail()}")
        return message  # type: ignore[no-any-return]

    def pump(self, timeout: float) -> bool:
        """One message received and, if an event, handed to on_event; False on timeout."""
        message = self.receive(timeout)
        if message is None:
            return False
        if "method" in message:
            self.on_event(message)
        return True

    def call(
        self,
        method: str,
        params: Optional[dict] = None,
        session: Optional[str] = None,
        *,
        timeout: Optional[float] = None,
    ) -> dict:
        wanted = self.send(method, params, session)
        limit = self.timeout if timeout is None else timeout
        deadline = time.monotonic() + limit
        while True:
            message = self.receive(deadline - time.monotonic())
            if message is None:
                raise CDPError(f"no answer to {method} in {limit} s")
            if "method" in message:
                self.on_event(message)
            elif message.get("id") == wanted:
                if "error" in message:
                    raise CDPError(f"{method}: {message['error']}")
                return message.get("result", {})  # type: ignore[no-any-return]

    # -- lifetime ---------------------------------------------------------------------

    def close(self) -> None:
        proc, self.proc = self.proc, None
        if proc is not None:
            if proc.poll() is None:
                with contextlib.suppress(Exception):
                    self.send("Browser.close")
                with contextlib.suppress(subprocess.TimeoutExpired):
                    proc.wait(timeout=5)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(proc.pid, signal.SIGKILL)  # its session: renderers, zygote
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)
        for fd in ("_to_child", "_from_child"):
            if getattr(self, fd, None) is not None:
                with contextlib.suppress(OSError):
                    os.close(getattr(self, fd))
                setattr(self, fd, None)
        shutil.rmtree(self._profile, ignore_errors=True)

    def __enter__(self) -> Chromium:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# -- serving ----------------------------------------------------------------------------


class _Handler(http.server.SimpleHTTPRequestHandler):
    def list_directory(self, path: Any) -> None:
        # a static host has no listings: a directory without index.html is missing
        self.send_error(404, "No index.html here")
        return None

    def log_message(self, format: str, *args: Any) -> None:
        pass


@contextlib.contextmanager
def serve(root: Path) -> Iterator[str]:
    """root served on 127.0.0.1 (a free port) in a thread; yields its base URL."""
    handler = functools.partial(_Handler, directory=str(root))
    server = http.server.ThreadingHTTPServer((LOCAL_HOST, 0), handler)
    thread = threading.Thread(
        target=server.serve_forever, kwargs={"poll_interval": 0.05}, daemon=True
    )
    thread.start()
    try:
        yield f"http://{LOCAL_HOST}:{server.server_address[1]}/"
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)


# -- checking ---------------------------------------------------------------------------


def site_pages(root: Path) -> list[str]:
    """Every page of a built site as its URL path ('' for the home page):
    directory URLs for index.html files, as mkdocs writes them; not 404.html."""
    pages = []
    for path in sorted(root.rglob("*.html")):
        rel = path.relative_to(root).as_posix()
        if rel == "404.html":
            continue
        pages.append(rel[: -len("index.html")] if path.name == "index.html" else rel)
    return pages


class _Anchors(html.parser.HTMLParser):
    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def handle_starttag(self, tag: str, attrs: list) -> None:
        for key, value in attrs:
            if value is not None and (key == "id" or (key == "name" and tag == "a")):
                self.names.add(value)


@dataclass
class Report:
    pages: list[str] = field(default_factory=list)  # URL paths, '' the home page
    failures: list[tuple[str, str]] = field(default_factory=list)  # (page, what failed)
    external_links: dict[str, list[str]] = field(default_factory=dict)  # url: pages

    def on(self, page: str) -> list[str]:
        return [what for where, what in self.failures if where == page]

    def text(self) -> str:
        """Each failure once, with the pages it happened on."""
        pages: dict[str, list[str]] = {}
        for page, what in self.failures:
            pages.setdefault(what, []).append(page or "/")
        return "\n".join(f"{what}\n    on {', '.join(where)}" for what, where in pages.items())


_PAGE_SCRIPT = r"""(async () => {
  const images = Array.from(document.images);
  for (const image of images) image.loading = "eager";
  await Promise.all(images.map(image => image.decode().catch(() => null)));
  return {
    images: images.filter(i => !i.complete || i.naturalWidth === 0)
                  .map(i => [i.getAttribute("src"), i.currentSrc || i.src]),
    links: Array.from(document.querySelectorAll("a[href]"),
                      a => [a.getAttribute("href"), a.href]),
    // what is wider than its column, so that a part of it needs scrolling to
    // be read: a table (or the box mkdocs-material scrolls it in), a code block
    wide: Array.from(document.querySelectorAll(
                       "table, pre, pre > code, .md-typeset__scrollwrap"))
               .filter(e => !e.closest(".md-sidebar, .md-header, nav"))
               .map(e => {
                 const page = document.documentElement.clientWidth;
                 const right = Math.round(e.getBoundingClientRect().right);
                 // a box that scrolls what it cannot show, or one past the window
                 if (e.scrollWidth > e.clientWidth + 1 &&
                     getComputedStyle(e).overflowX !== "visible")
                   return [e.tagName.toLowerCase(), `${e.scrollWidth} > ${e.clientWidth} px`, e];
                 if (right > page + 1)
                   return [e.tagName.toLowerCase(), `right edge ${right} > ${page} px`, e];
                 return null;
               })
               .filter(found => found !== null)
               .map(([tag, what, e]) =>
                    [tag, what, e.textContent.trim().replace(/\s+/g, " ").slice(0, 60)]),
  };
})()"""
#: the width of the window pages are checked at (a laptop's), in CSS pixels
WIDTH = 1280


# the links' targets fetched from the local server, never through a proxy
# that the environment names (http_proxy)
_DIRECT = urllib.request.build_opener(urllib.request.ProxyHandler({}))


def _is_local(url: str) -> bool:
    parts = urllib.parse.urlsplit(url)
    return parts.scheme in ("data", "blob", "about") or parts.hostname == LOCAL_HOST


def _remote_text(remote: dict) -> str:
    if "value" in remote:
        return str(remote["value"])
    return str(remote.get("description", remote.get("type", "?")))


class _SiteCheck:
    def __init__(self, browser: Chromium, base: str, page_timeout: float):
        self.browser = browser
        self.base = base
        self.origin = urllib.parse.urlsplit(base).netloc
        self.page_timeout = page_timeout
        self.report = Report()
        self.page = ""
        self.session = ""
        self.loaded = False
        self.inflight: dict[str, str] = {}  # request id: url
        self.documents: set[str] = set()  # the request ids of pages' documents
        self.urls: dict[str, str] = {}  # request id: url, for failures reported later
        self.served: dict[str, tuple[Optional[str], set[str]]] = {}  # url: error, anchors
        browser.on_event = self.event

    def fail(self, what: str) -> None:
        if (self.page, what) not in self.report.failures:
            self.report.failures.append((self.page, what))

    def enable(self, session: str, send: Callable[..., Any]) -> None:
        """The domains whose events are checked, and workers attached paused."""
        for method in ("Runtime.enable", "Log.enable", "Network.enable"):
            send(method, session=session)
        auto = {"autoAttach": True, "waitForDebuggerOnStart": True, "flatten": True}
        send("Target.setAutoAttach", auto, session=session)

    def event(self, event: dict) -> None:
        method, params = event["method"], event.get("params", {})
        if method == "Target.attachedToTarget" and params["targetInfo"]["type"] != "page":
            # a worker (auto-attached, paused): checked like its page
            # (sent, not called: the commands run in order, before it starts)
            session = params["sessionId"]
            self.enable(session, self.browser.send)
            self.browser.send("Runtime.runIfWaitingForDebugger", session=session)
        elif method == "Page.loadEventFired" and event.get("sessionId") == self.session:
            self.loaded = True
            # the page's document has loaded: Chromium does not always say so
            # with a loadingFinished for the navigation's own request
            for request in self.documents:
                self.inflight.pop(request, None)
        elif method == "Network.requestWillBeSent":
            url = params["request"]["url"]
            self.inflight[params["requestId"]] = self.urls[params["requestId"]] = url
            if params.get("type") == "Document":
                self.documents.add(params["requestId"])
            if not _is_local(url):
                self.fail(f"request to another host than {LOCAL_HOST}: {url}")
        elif method == "Network.responseReceived":
            status = params["response"].get("status", 0)
            if status >= 400:
                self.fail(f"HTTP {status} for {params['response']['url']}")
        elif method == "Network.loadingFinished":
            self.inflight.pop(params["requestId"], None)
        elif method == "Network.loadingFailed":
            self.inflight.pop(params["requestId"], None)
            url = self.urls.get(params["requestId"], "?")
            self.fail(f"request failed ({params.get('errorText', '?')}): {url}")
        elif method == "Runtime.exceptionThrown":
            details = params["exceptionDetails"]
            text = details.get("exception", {}).get("description") or details.get("text", "")
            where = details.get("url", "")
            self.fail(f"uncaught exception: {text.splitlines()[0] if text else '?'} {where}")
        elif method == "Runtime.consoleAPICalled" and params["type"] in ("error", "assert"):
            args = " ".join(_remote_text(a) for a in params.get("args", []))
            self.fail(f"console.{params['type']}: {args}")
        elif method == "Log.entryAdded" and params["entry"]["level"] == "error":
            entry = params["entry"]
            self.fail(f"browser log error: {entry['text']} ({entry.get('url', '')})")

    def settle(self, deadline: float) -> None:
        """Until the load event has fired and no request was in flight for 0.2 s."""
        quiet_since: Optional[float] = None
        while True:
            now = time.monotonic()
            if self.loaded and not self.inflight:
                quiet_since = now if quiet_since is None else quiet_since
                if now - quiet_since >= 0.2:
                    return
            else:
                quiet_since = None
            if now >= deadline:
                what = "no load event" if not self.loaded else "requests still pending"
                pending = ", ".join(sorted(set(self.inflight.values())))
                self.fail(f"not loaded in {self.page_timeout} s: {what} {pending}".rstrip())
                return
            self.browser.pump(min(0.05, deadline - now))

    def target(self, url: str) -> tuple[Optional[str], set[str]]:
        """(why url is not served, or None; the ids and a[name]s on its page)."""
        if url not in self.served:
            error: Optional[str] = None
            anchors: set[str] = set()
            try:
                with _DIRECT.open(url, timeout=10) as response:
                    if response.status != 200:
                        error = f"HTTP {response.status}"
                    elif response.headers.get_content_type() == "text/html":
                        parser = _Anchors()
                        parser.feed(response.read().decode("utf-8", "replace"))
                        anchors = parser.names
            except urllib.error.HTTPError as exc:
                error = f"HTTP {exc.code}"
            except (urllib.error.URLError, OSError) as exc:
                error = str(exc)
            self.served[url] = (error, anchors)
        return self.served[url]

    def links(self, links: list) -> None:
        for raw, href in links:
            parts = urllib.parse.urlsplit(href)
            if parts.scheme in ("http", "https") and parts.netloc == self.origin:
                target = urllib.parse.urlunsplit(parts._replace(fragment=""))
                error, anchors = self.target(target)
                fragment = urllib.parse.unquote(parts.fragment)
                if error is not None:
                    self.fail(f"broken link {raw!r}: {target} is {error}")
                elif fragment and fragment not in anchors:
                    self.fail(f"broken link {raw!r}: no id {fragment!r} on {target}")
            elif (
                parts.scheme in ("http", "https") and parts.hostname not in (None, LOCAL_HOST)
            ) or (parts.scheme == "mailto" and parts.path):
                self.report.external_links.setdefault(href, []).append(self.page or "/")
            else:
                self.fail(f"link {raw!r} is neither to this site nor an http(s) or mailto URL")

    def check(self, page: str) -> None:
        self.loaded, self.inflight = False, {}
        deadline = time.monotonic() + self.page_timeout
        url = urllib.parse.urljoin(self.base, page)
        navigated = self.browser.call("Page.navigate", {"url": url}, session=self.session)
        if navigated.get("errorText"):
            self.fail(f"navigation failed: {navigated['errorText']}")
            return
        self.settle(deadline)
        found = self.browser.call(
            "Runtime.evaluate",
            {"expression": _PAGE_SCRIPT, "awaitPromise": True, "returnByValue": True},
            session=self.session,
        )
        if "exceptionDetails" in found:
            self.fail(f"the page check's script failed: {found['exceptionDetails']}")
            return
        value = found["result"]["value"]
        for src, resolved in value["images"]:
            self.fail(f"image not loaded: {src!r} ({resolved})")
        self.links(value["links"])
        for tag, what, text in value["wide"]:
            self.fail(f"wider than its column at {WIDTH} px: <{tag}> {what}: {text!r}")
        # late events (an image the script made eager) belong to this page
        self.loaded = True
        self.settle(time.monotonic() + 2)

    def run(self, pages: list[str], budget: float) -> Report:
        stop = time.monotonic() + budget
        target = self.browser.call("Target.createTarget", {"url": "about:blank"})
        attached = self.browser.call(
            "Target.attachToTarget", {"targetId": target["targetId"], "flatten": True}
        )
        self.session = attached["sessionId"]
        self.browser.call("Page.enable", session=self.session)
        metrics = {"width": WIDTH, "height": 900, "deviceScaleFactor": 1, "mobile": False}
        self.browser.call("Emulation.setDeviceMetricsOverride", metrics, session=self.session)
        self.enable(self.session, self.browser.call)
        for page in pages:
            self.page = page
            self.report.pages.append(page)
            if time.monotonic() >= stop:
                self.fail(f"not checked: the {budget} s for the whole site were spent")
                continue
            try:
                self.check(page)
            except CDPError as exc:  # a command unanswered in time: this page fails
                self.fail(f"not checked: {exc}")
                if self.browser.proc is None or self.browser.proc.poll() is not None:
                    raise
        return self.report


def check_site(
    root: Path,
    chromium: str,
    *,
    pages: Optional[list[str]] = None,
    page_timeout: float = 15.0,
    budget: float = 150.0,
) -> Report:
    """Serves root, loads each page (``site_pages(root)`` by default) in
    headless Chromium and reports what failed on which page."""
    with serve(root) as base, Chromium(chromium) as browser:
        return _SiteCheck(browser, base, page_timeout).run(
            site_pages(root) if pages is None else pages, budget
        )

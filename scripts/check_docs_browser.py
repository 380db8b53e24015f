"""Open the built documentation site in headless Chromium and report what a reader's browser
would: console errors, uncaught page errors and failed requests (a missing stylesheet, script or
picture), on the pages a new user lands on.

    python scripts/check_docs_browser.py            # builds the site into a temporary folder
    python scripts/check_docs_browser.py --site site  # a site already built (mkdocs build)

Exit 0 when every page loads clean, 1 with one line per problem otherwise. It needs Playwright
(the test extra installs it) and a Chromium: Debian's (`apt-get install chromium`,
/usr/bin/chromium) is used where there is one, so nothing is downloaded. tests/test_docs.py runs
it as a `long` test.
"""

from __future__ import annotations

import argparse
import functools
import http.server
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The home page, the generated config reference (the largest page), and the page mkdocstrings
# renders from the docstrings: each exercises a different part of the build.
PAGES = ("", "reference/config/", "reference/lion-cub-api/")
CHROMIUM = ("chromium", "chromium-browser", "google-chrome")


def build_site(out: Path) -> None:
    subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "-q", "-d", str(out)],
        cwd=ROOT,
        env={**os.environ, "NO_MKDOCS_2_WARNING": "1"},  # mkdocs-material's banner
        check=True,
    )


def serve(site: Path) -> tuple[http.server.ThreadingHTTPServer, str]:
    """The site over HTTP on a free port (file:// would hide what a server does: the search
    index is fetched, and directory URLs resolve to index.html)."""
    handler = functools.partial(_QuietHandler, directory=str(site))
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, f"http://127.0.0.1:{server.server_address[1]}/"


class _QuietHandler(http.server.SimpleHTTPRequestHandler):
    def log_message(self, *args) -> None:  # one line per request would bury the report
        pass


def check_pages(base: str, pages=PAGES) -> list[str]:
    """Problems seen while each page loads and settles, as 'page: what'."""
    from playwright.sync_api import sync_playwright

    executable = next((p for p in map(shutil.which, CHROMIUM) if p), None)
    problems: list[str] = []
    with sync_playwright() as pw:
        browser = pw.chromium.launch(executable_path=executable, headless=True)
        for page_path in pages:
            page = browser.new_page()
            where = page_path or "home"
            page.on(
                "console",
                lambda m, w=where: (
                    problems.append(f"{w}: console {m.type}: {m.text}")
                    if m.type == "error"
                    else None
                ),
            )
            page.on("pageerror", lambda e, w=where: problems.append(f"{w}: page error: {e}"))
            page.on(
                "requestfailed",
                lambda r, w=where: problems.append(f"{w}: request failed: {r.url}"),
            )
            response = page.goto(base + page_path, wait_until="networkidle")
            if response is None or response.status != 200:
                problems.append(f"{where}: HTTP {response.status if response else 'none'}")
            # The theme's own script must have run: its search box is made by it.
            if page.locator("input.md-search__input").count() != 1:
                problems.append(f"{where}: the theme's search box is missing")
            page.close()
        browser.close()
    return problems


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--site", type=Path, help="a built site (default: build one now)")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as tmp:
        site = args.site or Path(tmp) / "site"
        if args.site is None:
            build_site(site)
        server, base = serve(site)
        try:
            problems = check_pages(base)
        finally:
            server.shutdown()
    for line in problems:
        print(line)
    print(f"{len(PAGES)} pages opened in headless Chromium: {len(problems)} problems")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main())

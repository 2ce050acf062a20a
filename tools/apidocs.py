#!/usr/bin/python3
"""Build the HTML API reference: `make docs` -> build/docs/api.html.

redocly (pinned in tools/package-lock.json, installed by `make deps`) renders
api/openapi.yaml. Its page loads Redoc's script from redocly's CDN, checked by
an integrity hash. The same script ships inside the pinned package; this tool
checks that it is byte for byte the one the page names (same SHA-384), and
inlines it, so the page works opened from disk and offline.

Usage: apidocs.py OUT.html
"""
import base64
import hashlib
import os
import pathlib
import re
import subprocess
import sys

TOP = pathlib.Path(__file__).resolve().parent.parent
REDOCLY = TOP / "tools/node_modules/.bin/redocly"
BUNDLE = TOP / "tools/node_modules/@redocly/cli/lib/chunks/redoc.standalone.js"
PRELOAD = re.compile(r'\s*<link rel="modulepreload" href="(https://[^"]+)" integrity="([^"]+)"[^>]*>')


def apidocs_render(tmp):
    env = {**os.environ, "REDOCLY_TELEMETRY": "off", "REDOCLY_SUPPRESS_UPDATE_NOTICE": "true"}
    r = subprocess.run([str(REDOCLY), "build-docs", str(TOP / "api/openapi.yaml"), "--config",
                        str(TOP / "api/redocly.yaml"), "-o", str(tmp)], capture_output=True, text=True, env=env)
    if r.returncode != 0:
        sys.exit(f"apidocs: redocly build-docs failed:\n{r.stdout}{r.stderr}")


def apidocs_inline(html, code):
    """The page with the script's import replaced by the script itself."""
    m = PRELOAD.search(html)
    if not m:
        sys.exit("apidocs: the page has no modulepreload of Redoc's script: did redocly change?")
    url, integrity = m.group(1), m.group(2)
    algo, digest = integrity.split("-", 1)
    mine = base64.b64encode(hashlib.new(algo, code).digest()).decode()
    if mine != digest:
        sys.exit(f"apidocs: {BUNDLE} is not the script the page names ({url})")
    js = code.decode()
    js, n = re.subn(r"export\{[A-Za-z,]+\};?\s*$", "", js)
    imp = f'import {{ hydrate }} from "{url}";'
    if n != 1 or imp not in html:
        sys.exit("apidocs: the script's export or the page's import is not as expected")
    # Inside <script>, "<!--" and "<script" change how HTML finds the end of
    # the element; \x3C is "<" in every JS string, template and regex.
    js = js.replace("<!--", "\\x3C!--").replace("<script", "\\x3Cscript")
    if "</script" in js:
        sys.exit("apidocs: the script holds </script")
    html = PRELOAD.sub("", html, count=1)
    return html.replace(imp, js, 1)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = pathlib.Path(sys.argv[1])
    if not REDOCLY.exists():
        sys.exit("apidocs: redocly is not installed: run make deps")
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = out.with_suffix(".tmp.html")
    apidocs_render(tmp)
    html = apidocs_inline(tmp.read_text(), BUNDLE.read_bytes())
    tmp.write_text(html)
    tmp.replace(out)
    print(f"apidocs: {out} ({len(html) // 1024} KiB, self-contained)")


if __name__ == "__main__":
    main()

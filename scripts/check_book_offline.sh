#!/usr/bin/env bash
# Open built pages of the book in a headless Chromium with the network cut off, and check
# that their formulas are typeset by the MathJax the book ships (no request leaves the machine).
#
#   bash scripts/check_book_offline.sh [HTML_DIR] [OUT_DIR] [PAGE...]
#
# HTML_DIR: the built book (default _build/html; `make book` first). OUT_DIR: where the
# screenshots, DOM dumps and logs go (default a temporary folder). PAGEs: paths under HTML_DIR
# (default chapters/05-shared-memory.html chapters/14-tensor-cores.html chapters/17-hopper.html;
# 17 has no formulas, it is there for the network check).
#
# How: the book is served on 127.0.0.1 by Python's http.server (its log shows every local
# request and any 404, e.g. a MathJax extension the book lacks). Chromium resolves no host but
# localhost (--host-resolver-rules), so nothing remote can load, and writes a net log: every
# request it starts, with the origin that asked for it. Requests a page asked for carry the
# page's origin (http://127.0.0.1:PORT); Chromium's own background calls (Google time, sign-in,
# spelling dictionaries) carry none and are counted apart. For each page: a screenshot
# scrolled to its first formula (look at it), and the DOM after MathJax has run, in which
# the script counts typeset formulas (<mjx-container>) against the formulas on the page and
# looks for MathJax's error marks.
# Needs chromium (Debian: apt-get install -y chromium).
# Exit status 0 when every page passed.
set -euo pipefail
cd "$(dirname "$0")/.."
HTML=$(realpath "${1:-_build/html}")
OUT=${2:-$(mktemp -d /tmp/book-offline.XXXXXX)}
shift $(( $# > 2 ? 2 : $# )) || true
PAGES=("$@")
[ ${#PAGES[@]} -gt 0 ] || PAGES=(chapters/05-shared-memory.html chapters/14-tensor-cores.html chapters/17-hopper.html)
PY=${PY:-$( [ -x .venv/bin/python ] && echo .venv/bin/python || echo python3 )}
CHROMIUM=${CHROMIUM:-$(command -v chromium || command -v chromium-browser || command -v google-chrome || true)}
[ -n "$CHROMIUM" ] || { echo "no chromium found (apt-get install -y chromium)"; exit 2; }
[ -f "$HTML/index.html" ] || { echo "no built book in $HTML (make book)"; exit 2; }
mkdir -p "$OUT"
OUT=$(realpath "$OUT")

free_port() { "$PY" -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])'; }
WEB=$(free_port)

# Served: a folder with the book under book/ and shot.html, a page that shows a book page in
# a full-window frame scrolled to its first typeset formula (the screenshot's subject).
SITE=$(mktemp -d /tmp/book-offline-site.XXXXXX)
PROFILE=$(mktemp -d /tmp/book-offline-profile.XXXXXX)
ln -s "$HTML" "$SITE/book"
cat > "$SITE/shot.html" <<'HTML'
<!doctype html><html><body style="margin:0"><iframe id="f" style="border:0;width:100vw;height:100vh"></iframe>
<script>
const f = document.getElementById("f");
let tries = 0;
f.onload = () => {
  const go = () => {
    const d = f.contentDocument;
    const m = d.querySelector("mjx-container") || (++tries > 50 && d.querySelector(".math"));
    if (m) m.scrollIntoView({block: "center"});
    else if (tries <= 50) setTimeout(go, 200);
  };
  go();
};
f.src = "book/" + new URLSearchParams(location.search).get("page");
</script></body></html>
HTML
"$PY" -m http.server "$WEB" --bind 127.0.0.1 --directory "$SITE" > "$OUT/server.log" 2>&1 &
SERVER=$!
cleanup() { kill "$SERVER" 2>/dev/null || true; rm -rf "$PROFILE" "$SITE"; }
trap cleanup EXIT
sleep 1

chrome() {
    timeout 120 "$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-dev-shm-usage \
        --disable-background-networking --disable-component-update --no-first-run \
        --disable-sync --disable-default-apps --no-default-browser-check --no-pings \
        --user-data-dir="$PROFILE" \
        --host-resolver-rules="MAP * ~NOTFOUND, EXCLUDE localhost, EXCLUDE 127.0.0.1" \
        --hide-scrollbars --window-size=1100,900 --virtual-time-budget=15000 "$@" 2>>"$OUT/chromium.log"
}

status=0
for page in "${PAGES[@]}"; do
    name=$(basename "$page" .html)
    url="http://127.0.0.1:$WEB/book/$page"
    chrome --screenshot="$OUT/$name.png" "http://127.0.0.1:$WEB/shot.html?page=$page" > /dev/null
    chrome --dump-dom --log-net-log="$OUT/$name.netlog.json" "$url" > "$OUT/$name.dom.html"
    "$PY" - "$HTML/$page" "$OUT/$name.dom.html" "$name" "$OUT/$name.netlog.json" "$WEB" <<'EOF' || status=1
import json, re, sys
src, dom = (open(p, encoding="utf-8").read() for p in sys.argv[1:3])
name, netlog, port = sys.argv[3:6]
log = json.load(open(netlog, encoding="utf-8"))
kinds = {v: k for k, v in log["constants"]["logEventTypes"].items()}
local = (f"http://127.0.0.1:{port}/", f"http://localhost:{port}/")
page_remote, browser_own = set(), set()
for e in log["events"]:
    p = e.get("params") or {}
    url = p.get("url") or ""
    if kinds.get(e["type"]) != "URL_REQUEST_START_JOB" or not url or url.startswith(local):
        continue
    if str(p.get("initiator", "")).startswith(("http://", "https://")):
        page_remote.add(f"{url}  (asked for by {p['initiator']})")
    else:
        browser_own.add(url.split("?")[0])
print(f"{name}: remote requests made by the page: {len(page_remote)}; Chromium's own "
      f"background requests (not the page's): {len(browser_own)}")
for r in sorted(page_remote):
    print("   REMOTE:", r)
formulas = len(re.findall(r'<(?:span|div) class="math[^"]*"', src))
typeset = len(re.findall(r"<mjx-container\b", dom))
errors = len(re.findall(r"<mjx-merror\b|data-mjx-error", dom))
raw = re.findall(r'<(?:span|div) class="math[^"]*">\s*(\\[(\[][^<]{0,60})', dom)
ok = typeset >= formulas and not errors and not raw and not page_remote
print(f"{name}: {formulas} formulas in the page, {typeset} <mjx-container> after MathJax, "
      f"{errors} MathJax errors, {len(raw)} left as raw TeX -> {'OK' if ok else 'FAIL'}"
      + ("" if formulas else " (no formulas on this page: nothing to typeset)"))
for r in raw[:5]:
    print("   raw:", r)
sys.exit(0 if ok else 1)
EOF
done

missing=$(grep -E '" (4|5)[0-9][0-9] ' "$OUT/server.log" | grep -v 'GET /favicon.ico ' || true)
if [ -n "$missing" ]; then echo "local requests that failed:"; echo "$missing"; status=1; fi
echo "local files served: $(grep -c '" 200 ' "$OUT/server.log" || true)" \
     "(MathJax fonts: $(grep -c 'woff-v2/.*" 200 ' "$OUT/server.log" || true))"
echo "screenshots and DOM dumps: $OUT"
exit $status

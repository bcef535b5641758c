#!/usr/bin/env bash
# docs/drain-timeline.png, the picture the README shows: the timeline page of the demo's own
# drain (shutdown-coordinator-demo --timeline), as headless Chromium draws it. Run it after a
# change to the timeline or the demo; it needs the project installed (.venv) and chromium.
set -euo pipefail
cd "$(dirname "$0")/.."
page=$(mktemp --suffix=.html)
trap 'rm -f "$page"' EXIT
.venv/bin/shutdown-coordinator-demo --timeline "$page"
# As root, Chromium runs only without its sandbox; the page loads nothing but itself.
chromium --headless --no-sandbox --disable-gpu --hide-scrollbars \
    --window-size="1280,${PICTURE_HEIGHT:-700}" \
    --screenshot="$PWD/docs/drain-timeline.png" "file://$page"

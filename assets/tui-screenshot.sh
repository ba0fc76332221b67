#!/usr/bin/env bash
# Takes the picture of the TUI at the top of README.md: runs `prefixscope demo` in a detached
# tmux, captures the screen with its colours, turns it into an HTML page and screenshots the
# page with headless chromium.
#
#   bash assets/tui-screenshot.sh                      # from the repo root, after cargo build --release
#   PREFIXSCOPE=/path/to/prefixscope bash assets/tui-screenshot.sh
#   COLS=80 ROWS=24 OUT=assets/tui-80x24.png bash assets/tui-screenshot.sh
#
# Needs tmux, python3 and chromium (Debian: apt-get install tmux chromium). Settings, from the
# environment:
#   PREFIXSCOPE  the binary (default target/release/prefixscope)
#   CHROMIUM     the browser (default: chromium, chromium-browser or google-chrome, the first found)
#   COLS, ROWS   the terminal's size (default 120 x 40)
#   SEED, SPEED  the demo's --seed and --speed (default 7 and 8)
#   SCENARIO     the demo's --scenario (default mixed)
#   OUT          the picture (default assets/tui.png); KEEP=1 keeps the ANSI capture and the page
#   SCALE        chromium's device scale factor (default 2: a sharp picture on high-DPI screens)
#   WAIT         seconds to wait at most for the demo to finish (default 120)
#   KEYS         tmux key names sent once it has (default: five Left, which selects the
#                coding agent's turn whose system prompt changed; KEYS= sends none)
set -euo pipefail

PREFIXSCOPE=${PREFIXSCOPE:-target/release/prefixscope}
COLS=${COLS:-120}
ROWS=${ROWS:-40}
SEED=${SEED:-7}
SPEED=${SPEED:-8}
SCENARIO=${SCENARIO:-mixed}
OUT=${OUT:-assets/tui.png}
SCALE=${SCALE:-2}
WAIT=${WAIT:-120}
KEYS=${KEYS-Left Left Left Left Left}

die() { echo "tui-screenshot: $*" >&2; exit 1; }

[ -x "$PREFIXSCOPE" ] || die "no prefixscope binary at $PREFIXSCOPE (cargo build --release, or set PREFIXSCOPE)"
command -v tmux >/dev/null || die "tmux is not installed"
command -v python3 >/dev/null || die "python3 is not installed"
if [ -z "${CHROMIUM:-}" ]; then
  for c in chromium chromium-browser google-chrome google-chrome-stable; do
    if command -v "$c" >/dev/null; then CHROMIUM=$c; break; fi
  done
fi
[ -n "${CHROMIUM:-}" ] || die "chromium is not installed (apt-get install chromium, or set CHROMIUM)"

BIN=$(cd "$(dirname "$PREFIXSCOPE")" && pwd)/$(basename "$PREFIXSCOPE")
WORK=$(mktemp -d)
SOCK="prefixscope-shot-$$"
cleanup() {
  tmux -L "$SOCK" kill-server 2>/dev/null || true
  if [ "${KEEP:-0}" = 1 ]; then echo "tui-screenshot: kept $WORK" >&2; else rm -rf "$WORK"; fi
}
trap cleanup EXIT

# A tmux server of our own (its own socket, no user configuration, no status line), so the
# pane is exactly COLS x ROWS and nothing of the user's tmux is touched.
printf 'set -g status off\nset -g default-terminal tmux-256color\n' > "$WORK/tmux.conf"
tmux -L "$SOCK" -f "$WORK/tmux.conf" new-session -d -s shot -x "$COLS" -y "$ROWS" \
  "env -u NO_COLOR '$BIN' demo --scenario '$SCENARIO' --seed '$SEED' --speed '$SPEED'; sleep 600"

# Wait for the demo to finish (its status bar says so), so the picture holds every break.
screen() { tmux -L "$SOCK" capture-pane -t shot -p; }
deadline=$((SECONDS + WAIT))
until [[ $(screen) == *'demo finished'* ]]; do
  [ $SECONDS -lt $deadline ] || { screen >&2; die "the demo did not finish within $WAIT s"; }
  sleep 1
done
for key in $KEYS; do tmux -L "$SOCK" send-keys -t shot "$key"; sleep 0.2; done
sleep 1   # one more snapshot of the live engine (every 200 ms at most), and the keys' effect

tmux -L "$SOCK" capture-pane -t shot -e -p > "$WORK/screen.ans"
tmux -L "$SOCK" send-keys -t shot q

# ANSI (as tmux writes it: SGR only) to one self-contained HTML page, one fixed-size box per
# cell. Box-drawing lines and block elements are drawn as shapes rather than taken from the
# font, so borders join and bars fill their cells whatever monospace font chromium finds.
DIMS=$(python3 - "$WORK/screen.ans" "$WORK/screen.html" "$COLS" "$ROWS" <<'PY'
import html, re, sys, unicodedata

src, dst, cols, rows = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
CW, CH, FONT, PAD = 9, 18, 15, 14          # cell width and height, font size, margin (CSS px)
DEF_FG, DEF_BG = "#d0d4db", "#14171c"
# The 16 ANSI colours (xterm's hues, a little softened for a dark background).
BASE16 = ["#1c1f24", "#e0565b", "#5fb85f", "#d9b44a", "#4f8fe6", "#bf6fd6", "#3fb5c4", "#c8ccd4",
          "#6b717c", "#ff7b7f", "#85e085", "#f5d76e", "#7fb0ff", "#df9af0", "#6fe0ec", "#ffffff"]

def color256(n):
    if n < 16:
        return BASE16[n]
    if n < 232:
        n -= 16
        lv = [0, 95, 135, 175, 215, 255]
        return "#%02x%02x%02x" % (lv[n // 36], lv[(n // 6) % 6], lv[n % 6])
    g = 8 + 10 * (n - 232)
    return "#%02x%02x%02x" % (g, g, g)

class Style:
    def __init__(self):
        self.reset()
    def reset(self):
        self.fg = self.bg = None
        self.bold = self.dim = self.italic = self.underline = self.reverse = self.strike = False
        self.hidden = False
    def key(self):
        return (self.fg, self.bg, self.bold, self.dim, self.italic, self.underline,
                self.reverse, self.strike, self.hidden)

def ext_color(params, i):
    """38;5;N or 38;2;R;G;B starting at params[i] (the 38/48); returns (colour, next index)."""
    if i + 1 < len(params) and params[i + 1] == 5 and i + 2 < len(params):
        return color256(params[i + 2] & 255), i + 3
    if i + 1 < len(params) and params[i + 1] == 2 and i + 4 < len(params):
        r, g, b = (p & 255 for p in params[i + 2:i + 5])
        return "#%02x%02x%02x" % (r, g, b), i + 5
    return None, len(params)

def apply_sgr(st, text):
    params = [int(p) if p else 0 for p in re.split(r"[;:]", text)] if text else [0]
    i = 0
    while i < len(params):
        p = params[i]
        if p == 0: st.reset()
        elif p == 1: st.bold = True
        elif p == 2: st.dim = True
        elif p == 3: st.italic = True
        elif p in (4, 21): st.underline = True
        elif p == 7: st.reverse = True
        elif p == 8: st.hidden = True
        elif p == 9: st.strike = True
        elif p == 22: st.bold = st.dim = False
        elif p == 23: st.italic = False
        elif p == 24: st.underline = False
        elif p == 27: st.reverse = False
        elif p == 28: st.hidden = False
        elif p == 29: st.strike = False
        elif 30 <= p <= 37: st.fg = BASE16[p - 30]
        elif p == 38:
            st.fg, i = ext_color(params, i); continue
        elif p == 39: st.fg = None
        elif 40 <= p <= 47: st.bg = BASE16[p - 40]
        elif p == 48:
            st.bg, i = ext_color(params, i); continue
        elif p == 49: st.bg = None
        elif 90 <= p <= 97: st.fg = BASE16[p - 90 + 8]
        elif 100 <= p <= 107: st.bg = BASE16[p - 100 + 8]
        i += 1

# Box drawing: which arms a character has (up, right, down, left), light (1) or heavy (2).
BOX = {}
def arms(chars, u, r, d, l):
    for c in chars:
        BOX[c] = (u, r, d, l)
arms("─", 0, 1, 0, 1); arms("━", 0, 2, 0, 2); arms("│", 1, 0, 1, 0); arms("┃", 2, 0, 2, 0)
arms("┌╭", 0, 1, 1, 0); arms("┐╮", 0, 0, 1, 1); arms("└╰", 1, 1, 0, 0); arms("┘╯", 1, 0, 0, 1)
arms("┏", 0, 2, 2, 0); arms("┓", 0, 0, 2, 2); arms("┗", 2, 2, 0, 0); arms("┛", 2, 0, 0, 2)
arms("├", 1, 1, 1, 0); arms("┤", 1, 0, 1, 1); arms("┬", 0, 1, 1, 1); arms("┴", 1, 1, 0, 1)
arms("┼", 1, 1, 1, 1); arms("╴", 0, 0, 0, 1); arms("╶", 0, 1, 0, 0); arms("╵", 1, 0, 0, 0)
arms("╷", 0, 0, 1, 0)
# Block elements: (left, top, width, height) as fractions of the cell.
BLOCK = {"█": (0, 0, 1, 1), "▀": (0, 0, 1, .5), "▐": (.5, 0, .5, 1)}
for k, c in enumerate("▁▂▃▄▅▆▇"):
    BLOCK[c] = (0, 1 - (k + 1) / 8, 1, (k + 1) / 8)
for k, c in enumerate("▉▊▋▌▍▎▏"):
    BLOCK[c] = (0, 0, (7 - k) / 8, 1)
# Squares (the Conversations lanes' cells): centred, smaller than the cell, as most terminal
# fonts draw them, so neighbours stay apart.
BLOCK["■"] = (.14, .5 - .36 * CW / CH, .72, .72 * CW / CH)
BLOCK["▪"] = (.25, .5 - .25 * CW / CH, .5, .5 * CW / CH)

def box_html(c):
    u, r, d, l = BOX[c]
    out = []
    cx, cy = CW / 2, CH / 2
    def seg(x, y, w, h):
        out.append('<b style="left:%.1fpx;top:%.1fpx;width:%.1fpx;height:%.1fpx"></b>' % (x, y, w, h))
    t = {1: 1.0, 2: 2.0}
    if l or r:
        th = t[max(l, r)]
        x0 = 0 if l else cx - th / 2
        x1 = CW if r else cx + th / 2
        seg(x0, cy - th / 2, x1 - x0, th)
    if u or d:
        th = t[max(u, d)]
        y0 = 0 if u else cy - th / 2
        y1 = CH if d else cy + th / 2
        seg(cx - th / 2, y0, th, y1 - y0)
    return "".join(out)

def block_html(c):
    x, y, w, h = BLOCK[c]
    return '<b style="left:%.2fpx;top:%.2fpx;width:%.2fpx;height:%.2fpx"></b>' % (
        x * CW, y * CH, w * CW, h * CH)

# Parse the capture into a grid of (character, style key) cells.
data = open(src, encoding="utf-8", errors="replace").read()
st = Style()
grid = []
for line in data.split("\n")[:rows]:
    cells = []
    for m in re.finditer(r"\x1b\[([0-9;:]*)m|\x1b\][^\x07\x1b]*(?:\x07|\x1b\\)|\x1b\[[0-9;:?]*[A-Za-z]|\x1b.|(.)", line):
        if m.group(0).startswith("\x1b"):
            if m.group(0).endswith("m") and m.group(0).startswith("\x1b["):
                apply_sgr(st, m.group(1))
            continue
        ch = m.group(2)
        if unicodedata.combining(ch) and cells:
            cells[-1] = (cells[-1][0] + ch, cells[-1][1], cells[-1][2])
            continue
        wide = unicodedata.east_asian_width(ch) in ("W", "F")
        cells.append((ch, st.key(), 2 if wide else 1))
    grid.append(cells)
while len(grid) < rows:
    grid.append([])

def colours(key):
    fg, bg, bold, dim, italic, underline, reverse, strike, hidden = key
    f, b = fg or DEF_FG, bg or DEF_BG
    if reverse:
        f, b = b, f
    if hidden:
        f = b
    return f, b

out_rows = []
for cells in grid:
    parts, width = [], 0
    for ch, key, w in cells:
        if width + w > cols:
            break
        f, b = colours(key)
        _, _, bold, dim, italic, underline, _, strike, _ = key
        css = ["color:" + f]
        if b != DEF_BG:
            css.append("background:" + b)
        if w == 2:
            css.append("width:%dpx" % (2 * CW))
        if bold: css.append("font-weight:bold")
        if dim: css.append("opacity:.6")
        if italic: css.append("font-style:italic")
        deco = " ".join(x for x, on in (("underline", underline), ("line-through", strike)) if on)
        if deco: css.append("text-decoration:" + deco)
        if ch in BOX:
            inner = box_html(ch)
        elif ch in BLOCK:
            inner = block_html(ch)
        elif ch == " ":
            inner = ""
        else:
            inner = html.escape(ch)
        parts.append('<i style="%s">%s</i>' % (";".join(css), inner))
        width += w
    parts.append('<i style="width:%dpx"></i>' % ((cols - width) * CW) if width < cols else "")
    out_rows.append("<div>" + "".join(parts) + "</div>")

W, H = cols * CW + 2 * PAD, rows * CH + 2 * PAD
page = """<!doctype html>
<html><head><meta charset="utf-8"><title>prefixscope</title><style>
html, body {{ margin: 0; padding: 0; background: {bg}; overflow: hidden; }}
#t {{ padding: {pad}px; width: {tw}px; height: {th}px; font: {font}px/{ch}px "DejaVu Sans Mono",
     "Liberation Mono", Menlo, Consolas, monospace; color: {fg}; }}
#t div {{ height: {ch}px; display: flex; white-space: pre; }}
#t i {{ font-style: normal; display: inline-block; position: relative; flex: none;
        width: {cw}px; height: {ch}px; text-align: center; overflow: visible; }}
#t b {{ position: absolute; background: currentColor; }}
</style></head><body><div id="t">
{rows}
</div></body></html>
""".format(bg=DEF_BG, fg=DEF_FG, pad=PAD, tw=cols * CW, th=rows * CH, font=FONT, ch=CH, cw=CW,
           rows="".join(out_rows))
open(dst, "w", encoding="utf-8").write(page)
print("%d %d" % (W, H))
PY
)
read -r W H <<<"$DIMS"

mkdir -p "$(dirname "$OUT")"
OUT_ABS=$(cd "$(dirname "$OUT")" && pwd)/$(basename "$OUT")
"$CHROMIUM" --headless --no-sandbox --disable-gpu --disable-quic --no-first-run \
  --disable-background-networking --disable-component-update --disable-sync \
  --hide-scrollbars --force-device-scale-factor="$SCALE" \
  --user-data-dir="$WORK/chromium" --window-size="$W,$H" \
  --screenshot="$OUT_ABS" "file://$WORK/screen.html" >"$WORK/chromium.log" 2>&1 \
  || { cat "$WORK/chromium.log" >&2; die "chromium failed"; }
[ -s "$OUT_ABS" ] || { cat "$WORK/chromium.log" >&2; die "chromium wrote no picture"; }
echo "tui-screenshot: $OUT (${W}x${H} CSS px, scale $SCALE)"

#!/usr/bin/env bash
# Installs the four agent harnesses that tests/harness_e2e.rs drives, at pinned versions, into a
# cache outside the repository (idempotent: a second run only checks the versions).
#   PREFIXSCOPE_HARNESS_HOME  (default ~/.cache/prefixscope-harnesses)
#     npm/       Claude Code, opencode and Codex CLI (npm packages; each ships its native binary)
#     aider/     aider in its own venv, so its dependencies stay out of the system python that
#                runs xllamacpp
#     bin/       claude, opencode, codex, aider (symlinks the test finds)
# Prints what it installed; exits non-zero if an install fails.
set -euo pipefail
CLAUDE_CODE_VERSION=2.1.197
OPENCODE_VERSION=1.18.33
CODEX_VERSION=0.171.0
AIDER_VERSION=0.86.2

home="${PREFIXSCOPE_HARNESS_HOME:-$HOME/.cache/prefixscope-harnesses}"
mkdir -p "$home/npm" "$home/bin"

npm_installed() { # PACKAGE VERSION
  local pkg_json="$home/npm/node_modules/$1/package.json"
  [ -f "$pkg_json" ] && [ "$(node -p "require('$pkg_json').version" 2>/dev/null)" = "$2" ]
}

want=()
npm_installed @anthropic-ai/claude-code "$CLAUDE_CODE_VERSION" || want+=("@anthropic-ai/claude-code@$CLAUDE_CODE_VERSION")
npm_installed opencode-ai "$OPENCODE_VERSION" || want+=("opencode-ai@$OPENCODE_VERSION")
npm_installed @openai/codex "$CODEX_VERSION" || want+=("@openai/codex@$CODEX_VERSION")
if [ ${#want[@]} -gt 0 ]; then
  command -v npm >/dev/null || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq nodejs npm; }
  echo "harnesses: npm install ${want[*]}" >&2
  # --ignore-scripts is not used: opencode and Claude Code pick their native binary in postinstall.
  npm install --prefix "$home/npm" --no-audit --no-fund --loglevel=error --save-exact "${want[@]}" >&2
fi
ln -sf "$home/npm/node_modules/.bin/claude" "$home/bin/claude"
ln -sf "$home/npm/node_modules/.bin/opencode" "$home/bin/opencode"
ln -sf "$home/npm/node_modules/.bin/codex" "$home/bin/codex"

aider_py="$home/aider/bin/python"
if ! [ -x "$aider_py" ] || [ "$("$aider_py" -c 'import importlib.metadata as m; print(m.version("aider-chat"))' 2>/dev/null)" != "$AIDER_VERSION" ]; then
  echo "harnesses: pip install aider-chat==$AIDER_VERSION (own venv)" >&2
  python3 -m venv "$home/aider" >&2 || { apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq python3-venv && python3 -m venv "$home/aider"; } >&2
  "$aider_py" -m pip install -q --disable-pip-version-check "aider-chat==$AIDER_VERSION" >&2
fi
ln -sf "$home/aider/bin/aider" "$home/bin/aider"
echo "harnesses in $home/bin: claude $CLAUDE_CODE_VERSION, opencode $OPENCODE_VERSION, codex $CODEX_VERSION, aider $AIDER_VERSION" >&2

#!/usr/bin/env bash
# One-time set-up, cached outside the checkout: the virtualenv and the Kafka and S3Proxy jars under $FLYWHEEL_HOME.
# A second run (or a fresh clone) reinstalls nothing unless pyproject.toml (or the extras below) changed.
set -euo pipefail
repo=$(cd "$(dirname "$0")/.." && pwd)
home=${FLYWHEEL_HOME:-$HOME/.cache/flywheel}
venv=$home/venv
python=${FLYWHEEL_PYTHON:-python3.11}
mkdir -p "$home"
exec 9>"$home/setup.lock"
flock 9  # two set-ups at once would race on the venv

# System packages from Debian, installed only when missing: bubblewrap for the sandbox that runs
# model-written code, Debian's python3.11, the interpreter inside it (one an unprivileged uid can read), and
# haproxy, the load balancer in front of two gateways in the multi-host tests, and prometheus (with promtool),
# which `flywheel observe` starts to scrape a fleet (both started by their runs, never as a service: see below).
need=()
command -v bwrap >/dev/null 2>&1 || need+=(bubblewrap)
[ -x /usr/bin/python3.11 ] || need+=(python3.11)
[ -x /usr/sbin/haproxy ] || need+=(haproxy)
[ -x /usr/bin/prometheus ] && [ -x /usr/bin/promtool ] || need+=(prometheus)
command -v npm >/dev/null 2>&1 || need+=(nodejs npm)  # the agent clients the tests drive (below)
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${need[*]} from Debian"
    apt-get update -qq
    # A package's postinst may start its daemon (haproxy on :80); invoke-rc.d asks policy-rc.d, and 101
    # means "do not start". Ours only while installing, and only where the machine has none of its own.
    made_policy=
    if [ ! -e /usr/sbin/policy-rc.d ]; then
      printf '#!/bin/sh\nexit 101\n' > /usr/sbin/policy-rc.d && chmod +x /usr/sbin/policy-rc.d && made_policy=1
      trap 'rm -f /usr/sbin/policy-rc.d' EXIT  # also when the install fails
    fi
    DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
    [ -z "$made_policy" ] || { rm -f /usr/sbin/policy-rc.d; trap - EXIT; }
  else
    echo "setup: missing system packages: ${need[*]}. Install them as root (apt-get install ${need[*]});" \
         "the sandbox refuses to run model-written code without them; the multi-host tests need haproxy; flywheel observe needs prometheus." >&2
    exit 1
  fi
fi

if [ ! -x "$venv/bin/python" ]; then
  echo "setup: creating virtualenv $venv"
  "$python" -m venv "$venv"
fi
extras=dev  # pyproject's optional dependencies: tests, load tests, lint
deps_want=$( { cat "$repo/pyproject.toml"; echo "extras=$extras"; } | sha256sum | cut -c1-16)
if [ "$(cat "$venv/.flywheel-deps" 2>/dev/null)" != "$deps_want" ]; then
  echo "setup: installing dependencies into $venv (first time: a few minutes, ~11 GB with SGLang and torch)"
  start=$(date +%s)
  "$venv/bin/pip" install --progress-bar on -e "$repo[$extras]"
  echo "$deps_want" > "$venv/.flywheel-deps"
  echo "$repo" > "$venv/.flywheel-checkout"
  echo "setup: dependencies installed in $(( $(date +%s) - start ))s"
elif [ "$(cat "$venv/.flywheel-checkout" 2>/dev/null)" != "$repo" ]; then
  # Same dependencies, another checkout: repoint the `flywheel` command at this one.
  "$venv/bin/pip" install -q --no-deps -e "$repo"
  echo "$repo" > "$venv/.flywheel-checkout"
fi
# Kafka broker jars from Maven Central (cached; no-op when present).
PYTHONPATH="$repo" "$venv/bin/python" -m flywheel kafka fetch >/dev/null
# S3Proxy jars, the S3 server the weight store's S3 tests and benchmark run against (cached likewise).
PYTHONPATH="$repo" "$venv/bin/python" -m flywheel.s3proxy fetch >/dev/null
# The agent clients the tests drive headless (OpenAI's Codex CLI, Anthropic's Claude Code) and Continue's
# development-data schemas, from npm, pinned by flywheel/clients_npm/package-lock.json (~820 MB, the clients'
# native binaries); installed again only when that lock changes. Claude Code's postinstall places its binary.
npm_dir=$home/npm
npm_want=$(cat "$repo/flywheel/clients_npm/package.json" "$repo/flywheel/clients_npm/package-lock.json" | sha256sum | cut -c1-16)
if [ "$(cat "$npm_dir/.flywheel-npm" 2>/dev/null)" != "$npm_want" ]; then
  echo "setup: installing the agent clients (Codex CLI, Claude Code, Continue's schemas) into $npm_dir"
  mkdir -p "$npm_dir"
  cp "$repo/flywheel/clients_npm/package.json" "$repo/flywheel/clients_npm/package-lock.json" "$npm_dir/"
  npm ci --prefix "$npm_dir" --no-audit --no-fund --loglevel=error
  "$npm_dir/node_modules/.bin/claude" --version >/dev/null
  "$npm_dir/node_modules/.bin/codex" --version >/dev/null
  echo "$npm_want" > "$npm_dir/.flywheel-npm"
fi
